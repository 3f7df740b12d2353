import Crypto
import Testing

@testable import APNsCore

@Suite("Provider tokens (ES256 JWT)")
struct ProviderTokenTests {
    let key = P256.Signing.PrivateKey()
    let now: Int64 = 1_767_225_600

    var signer: ProviderTokenSigner { ProviderTokenSigner(key: key, keyID: "ABC123DEFG", teamID: "DEF123GHIJ") }
    var verifier: ProviderTokenVerifier {
        ProviderTokenVerifier(keys: [ProviderTokenKey(keyID: "ABC123DEFG", teamID: "DEF123GHIJ", publicKey: key.publicKey)])
    }

    /// A token with arbitrary header and claims JSON, signed raw or DER.
    func handMade(header: String, claims: String, der: Bool = false, with signingKey: P256.Signing.PrivateKey? = nil) throws -> String {
        let input = Base64URL.encode(Array(header.utf8)) + "." + Base64URL.encode(Array(claims.utf8))
        let signature = try (signingKey ?? key).signature(for: Array(input.utf8))
        let bytes = der ? Array(signature.derRepresentation) : Array(signature.rawRepresentation)
        return input + "." + Base64URL.encode(bytes)
    }

    @Test("a signed token has the APNs header and numeric claims and a 64-byte raw signature")
    func signedTokenShape() throws {
        let token = try signer.token(issuedAt: now)
        let parts = token.split(separator: ".")
        #expect(parts.count == 3)
        #expect(Base64URL.decode(parts[0]).map { String(decoding: $0, as: UTF8.self) } == #"{"alg":"ES256","kid":"ABC123DEFG"}"#)
        #expect(Base64URL.decode(parts[1]).map { String(decoding: $0, as: UTF8.self) } == #"{"iss":"DEF123GHIJ","iat":1767225600}"#)
        #expect(Base64URL.decode(parts[2])?.count == 64)
        #expect(!token.contains("="))
        let verified = try verifier.verify(token, now: now + 10)
        #expect(verified == VerifiedProviderToken(keyID: "ABC123DEFG", teamID: "DEF123GHIJ", issuedAt: now))
    }

    @Test("a signer reads a PKCS#8 PEM (.p8) key")
    func signerFromPEM() throws {
        let pemSigner = try ProviderTokenSigner(privateKeyPEM: key.pemRepresentation, keyID: "ABC123DEFG", teamID: "DEF123GHIJ")
        _ = try verifier.verify(try pemSigner.token(issuedAt: now), now: now)
    }

    @Test("a bad key is reported without echoing it")
    func badKeyError() {
        let secret = "-----BEGIN PRIVATE KEY-----\nSECRETSECRETSECRET\n-----END PRIVATE KEY-----"
        #expect {
            _ = try ProviderTokenSigner(privateKeyPEM: secret, keyID: "ABC123DEFG", teamID: "DEF123GHIJ")
        } throws: { error in
            let error = error as? ProviderTokenError
            return error?.code == .invalidKey && !(error?.description.contains("SECRET") ?? true)
        }
    }

    @Test("DER-encoded signatures verify too")
    func derSignature() throws {
        let token = try handMade(header: #"{"alg":"ES256","kid":"ABC123DEFG"}"#, claims: #"{"iss":"DEF123GHIJ","iat":\#(now)}"#, der: true)
        #expect(try verifier.verify(token, now: now).issuedAt == now)
    }

    @Test("a signature from another key is rejected as a bad signature")
    func forgedSignature() throws {
        let token = try handMade(
            header: #"{"alg":"ES256","kid":"ABC123DEFG"}"#,
            claims: #"{"iss":"DEF123GHIJ","iat":\#(now)}"#,
            with: P256.Signing.PrivateKey()
        )
        #expect(throws: ProviderTokenError.self) { try verifier.verify(token, now: now) }
        expectCode(.badSignature, token)
    }

    @Test("a string iat is rejected")
    func stringIat() throws {
        expectCode(.badClaims, try handMade(header: #"{"alg":"ES256","kid":"ABC123DEFG"}"#, claims: #"{"iss":"DEF123GHIJ","iat":"\#(now)"}"#))
        expectCode(.badClaims, try handMade(header: #"{"alg":"ES256","kid":"ABC123DEFG"}"#, claims: #"{"iss":"DEF123GHIJ","iat":1.5}"#))
        expectCode(.badClaims, try handMade(header: #"{"alg":"ES256","kid":"ABC123DEFG"}"#, claims: #"{"iss":"DEF123GHIJ"}"#))
    }

    @Test("alg, kid and iss are checked")
    func headerChecks() throws {
        expectCode(.unsupportedAlgorithm, try handMade(header: #"{"alg":"HS256","kid":"ABC123DEFG"}"#, claims: #"{"iss":"DEF123GHIJ","iat":\#(now)}"#))
        expectCode(.unsupportedAlgorithm, try handMade(header: #"{"alg":"none","kid":"ABC123DEFG"}"#, claims: #"{"iss":"DEF123GHIJ","iat":\#(now)}"#))
        expectCode(.unknownKey, try handMade(header: #"{"alg":"ES256","kid":"OTHERKEY00"}"#, claims: #"{"iss":"DEF123GHIJ","iat":\#(now)}"#))
        expectCode(.unknownKey, try handMade(header: #"{"alg":"ES256","kid":"ABC123DEFG"}"#, claims: #"{"iss":"OTHERTEAM0","iat":\#(now)}"#))
        expectCode(.badClaims, try handMade(header: #"{"alg":"ES256"}"#, claims: #"{"iss":"DEF123GHIJ","iat":\#(now)}"#))
    }

    @Test("iat older than an hour is expired; far in the future is refused")
    func age() throws {
        let token = try signer.token(issuedAt: now)
        #expect(try verifier.verify(token, now: now + 3600).issuedAt == now)
        expectCode(.expired, token, at: now + 3601)
        expectCode(.issuedInFuture, token, at: now - 3600)
    }

    @Test("malformed tokens")
    func malformed() {
        expectCode(.malformed, "abc")
        expectCode(.malformed, "a.b")
        expectCode(.malformed, "!!.e30.AAAA")
        expectCode(.malformed, Base64URL.encode(Array("[1]".utf8)) + ".e30.AAAA")
    }

    @Test("base64url round-trips every length")
    func base64url() {
        for length in 0..<40 {
            let bytes = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
            #expect(Base64URL.decode(Base64URL.encode(bytes)) == bytes)
        }
        #expect(Base64URL.encode(Array("hello".utf8)) == "aGVsbG8")
        #expect(Base64URL.decode("a") == nil)
    }

    func expectCode(_ code: ProviderTokenError.Code, _ token: String, at time: Int64? = nil, sourceLocation: SourceLocation = #_sourceLocation) {
        do {
            _ = try verifier.verify(token, now: time ?? now)
            Issue.record("token verified, expected \(code)", sourceLocation: sourceLocation)
        } catch {
            #expect(error.code == code, "\(error)", sourceLocation: sourceLocation)
        }
    }
}
