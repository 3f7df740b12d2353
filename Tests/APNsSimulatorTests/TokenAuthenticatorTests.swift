import APNsCore
import Crypto
import Foundation
import Testing

@testable import APNsSimulator

@Suite("Token authentication per connection")
struct TokenAuthenticatorTests {
    let key = P256.Signing.PrivateKey()
    let now: Int64 = 1_767_225_600
    var signer: ProviderTokenSigner { ProviderTokenSigner(key: key, keyID: "KEY1234567", teamID: "TEAM123456") }

    func authenticator() -> TokenAuthenticator {
        TokenAuthenticator(verifier: ProviderTokenVerifier(keys: [ProviderTokenKey(keyID: "KEY1234567", teamID: "TEAM123456", publicKey: key.publicKey)]))
    }

    @Test("missing and malformed authorization")
    func missing() {
        var auth = authenticator()
        #expect(auth.authenticate(authorization: nil, now: now) == .failure(APNsRejection(.missingProviderToken)))
        #expect(auth.authenticate(authorization: "bearer ", now: now) == .failure(APNsRejection(.missingProviderToken)))
        #expect(auth.authenticate(authorization: "basic abc", now: now) == .failure(APNsRejection(.invalidProviderToken)))
        #expect(auth.authenticate(authorization: "bearer abc", now: now) == .failure(APNsRejection(.invalidProviderToken)))
    }

    @Test("a valid token is verified once, however many requests carry it")
    func verifiedOnce() throws {
        var auth = authenticator()
        let token = try signer.token(issuedAt: now)
        for offset in 0..<100 {
            #expect(throws: Never.self) { try auth.authenticate(authorization: "bearer \(token)", now: now + Int64(offset)).get() }
        }
        #expect(auth.verifications == 1)
        #expect(auth.hasValidToken)
    }

    @Test("a forged signature is InvalidProviderToken and is not verified again")
    func forged() throws {
        var auth = authenticator()
        let forger = ProviderTokenSigner(key: P256.Signing.PrivateKey(), keyID: "KEY1234567", teamID: "TEAM123456")
        let token = try forger.token(issuedAt: now)
        #expect(auth.authenticate(authorization: "Bearer \(token)", now: now) == .failure(APNsRejection(.invalidProviderToken)))
        #expect(auth.authenticate(authorization: "Bearer \(token)", now: now) == .failure(APNsRejection(.invalidProviderToken)))
        #expect(auth.verifications == 1)
    }

    @Test("iat older than an hour is ExpiredProviderToken, also for the token in use")
    func expired() throws {
        var auth = authenticator()
        let old = try signer.token(issuedAt: now - 3601)
        #expect(auth.authenticate(authorization: "bearer \(old)", now: now) == .failure(APNsRejection(.expiredProviderToken)))
        let current = try signer.token(issuedAt: now)
        #expect(throws: Never.self) { try auth.authenticate(authorization: "bearer \(current)", now: now).get() }
        #expect(auth.authenticate(authorization: "bearer \(current)", now: now + 3601) == .failure(APNsRejection(.expiredProviderToken)))
    }

    @Test("changing the token within 20 minutes is TooManyProviderTokenUpdates; after 20 minutes it is fine")
    func tokenChanges() throws {
        var auth = authenticator()
        let first = try signer.token(issuedAt: now)
        let second = try signer.token(issuedAt: now + 60)
        #expect(throws: Never.self) { try auth.authenticate(authorization: "bearer \(first)", now: now).get() }
        #expect(auth.authenticate(authorization: "bearer \(second)", now: now + 60) == .failure(APNsRejection(.tooManyProviderTokenUpdates)))
        // The first token stays in use.
        #expect(throws: Never.self) { try auth.authenticate(authorization: "bearer \(first)", now: now + 61).get() }
        #expect(throws: Never.self) { try auth.authenticate(authorization: "bearer \(second)", now: now + 1200).get() }
        #expect(auth.verifications == 2)
    }

    @Test("a string iat is refused")
    func stringIat() {
        var auth = authenticator()
        let input = Base64URL.encode(Array(#"{"alg":"ES256","kid":"KEY1234567"}"#.utf8)) + "." + Base64URL.encode(Array(#"{"iss":"TEAM123456","iat":"\#(now)"}"#.utf8))
        let signature = (try? key.signature(for: Array(input.utf8)))?.rawRepresentation ?? Data()
        let token = input + "." + Base64URL.encode(Array(signature))
        #expect(auth.authenticate(authorization: "bearer \(token)", now: now) == .failure(APNsRejection(.invalidProviderToken)))
    }
}
