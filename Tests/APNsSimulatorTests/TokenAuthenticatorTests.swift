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

    @Test("a token from a clock that runs ahead is refused, checked again only once a second, and taken when the clock catches up")
    func tokenFromTheFuture() throws {
        var auth = authenticator()
        let early = try signer.token(issuedAt: now + 600)
        #expect(auth.authenticate(authorization: "bearer \(early)", now: now) == .failure(APNsRejection(.invalidProviderToken)))
        #expect(auth.authenticate(authorization: "bearer \(early)", now: now) == .failure(APNsRejection(.invalidProviderToken)))
        #expect(auth.verifications == 1, "the same second: not verified again")
        #expect(throws: Never.self) { try auth.authenticate(authorization: "bearer \(early)", now: now + 600).get() }
        #expect(auth.verifications == 2)
    }

    @Test("a token issued within 20 minutes of the current one is TooManyProviderTokenUpdates; one issued 20 minutes later is fine")
    func tokenChanges() throws {
        var auth = authenticator()
        let first = try signer.token(issuedAt: now)
        let second = try signer.token(issuedAt: now + 60)
        let third = try signer.token(issuedAt: now + 1200)
        #expect(throws: Never.self) { try auth.authenticate(authorization: "bearer \(first)", now: now).get() }
        #expect(auth.authenticate(authorization: "bearer \(second)", now: now + 60) == .failure(APNsRejection(.tooManyProviderTokenUpdates)))
        // The first token stays in use, and the second stays too young to replace it.
        #expect(throws: Never.self) { try auth.authenticate(authorization: "bearer \(first)", now: now + 61).get() }
        #expect(auth.authenticate(authorization: "bearer \(second)", now: now + 1300) == .failure(APNsRejection(.tooManyProviderTokenUpdates)))
        #expect(throws: Never.self) { try auth.authenticate(authorization: "bearer \(third)", now: now + 1300).get() }
        #expect(auth.verifications == 3)

        // A replacement refused while the current token was young is taken once that one expired.
        var stuck = authenticator()
        #expect(throws: Never.self) { try stuck.authenticate(authorization: "bearer \(first)", now: now).get() }
        #expect(stuck.authenticate(authorization: "bearer \(second)", now: now + 60) == .failure(APNsRejection(.tooManyProviderTokenUpdates)))
        #expect(throws: Never.self) { try stuck.authenticate(authorization: "bearer \(second)", now: now + 3601).get() }
    }

    @Test("a connection opened with an old token may switch to a fresh one at once (timed by iat, not by the connection)")
    func oldTokenThenFresh() throws {
        var auth = authenticator()
        let old = try signer.token(issuedAt: now - 55 * 60)
        let fresh = try signer.token(issuedAt: now + 5 * 60)
        #expect(throws: Never.self) { try auth.authenticate(authorization: "bearer \(old)", now: now).get() }
        #expect(auth.authenticate(authorization: "bearer \(old)", now: now + 5 * 60 + 1) == .failure(APNsRejection(.expiredProviderToken)))
        #expect(throws: Never.self) { try auth.authenticate(authorization: "bearer \(fresh)", now: now + 5 * 60 + 1).get() }
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
