import Crypto

// APNs provider authentication tokens: ES256 JSON Web Tokens with header {alg, kid} and
// claims {iss, iat}. Pure computation: the caller passes key bytes and the clock, so the
// signer and the verifier are usable from the worker, the simulator and tests alike.

// MARK: - Errors

/// Why a provider token could not be made or did not verify.
///
/// Descriptions name the problem and the offending claim, never key material or the token's
/// signature, so the error is safe to log.
public struct ProviderTokenError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The kind of problem; compare against the static members.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Base: String, Sendable, Hashable {
            case invalidKey, invalidIdentifier, signingFailed
            case malformed, unsupportedAlgorithm, unknownKey, badSignature, badClaims, expired, issuedInFuture
        }

        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// The private key PEM could not be read as a P-256 key.
        public static let invalidKey = Code(.invalidKey)
        /// A key id or team id that cannot appear in a token.
        public static let invalidIdentifier = Code(.invalidIdentifier)
        /// The crypto library refused to sign.
        public static let signingFailed = Code(.signingFailed)
        /// Not three base64url parts of JSON objects.
        public static let malformed = Code(.malformed)
        /// `alg` is not ES256.
        public static let unsupportedAlgorithm = Code(.unsupportedAlgorithm)
        /// No configured key for this `kid` and team (`iss`).
        public static let unknownKey = Code(.unknownKey)
        /// The signature does not verify (raw R‖S and DER were both tried).
        public static let badSignature = Code(.badSignature)
        /// A required claim is missing or has the wrong type (for example a string `iat`).
        public static let badClaims = Code(.badClaims)
        /// `iat` is older than the allowed age (an hour for APNs).
        public static let expired = Code(.expired)
        /// `iat` lies further in the future than the allowed clock skew.
        public static let issuedInFuture = Code(.issuedInFuture)

        public var description: String { base.rawValue }
    }

    public let code: Code
    public let message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "provider token: \(message)" }
}

// MARK: - Signing

/// Makes APNs provider tokens from a `.p8` (PKCS#8 PEM) P-256 private key.
///
/// ```swift
/// let signer = try ProviderTokenSigner(privateKeyPEM: pem, keyID: "ABC123DEFG", teamID: "DEF123GHIJ")
/// let jwt = try signer.token(issuedAt: nowSeconds)
/// ```
/// The signature is JOSE's raw R‖S form (64 bytes), base64url-encoded.
public struct ProviderTokenSigner: Sendable {
    /// Whether `value` has the shape of Apple's key and team ids: 10 ASCII letters or digits.
    public static func isWellFormedIdentifier(_ value: String) -> Bool {
        value.count == 10 && value.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber) }
    }

    public let keyID: String
    public let teamID: String
    private let key: P256.Signing.PrivateKey
    /// base64url of the header, which never changes for one signer.
    private let encodedHeader: String

    public init(privateKeyPEM: String, keyID: String, teamID: String) throws(ProviderTokenError) {
        try Self.checkIdentifier(keyID, name: "key id")
        try Self.checkIdentifier(teamID, name: "team id")
        let key: P256.Signing.PrivateKey
        do {
            key = try P256.Signing.PrivateKey(pemRepresentation: privateKeyPEM)
        } catch {
            // The crypto error could echo parts of the input, so it is not passed on.
            throw ProviderTokenError(.invalidKey, "the private key is not a PEM-encoded P-256 (ES256) key")
        }
        self.init(key: key, keyID: keyID, teamID: teamID)
    }

    /// A signer for a key already in memory (tests, or a key read from a PKCS#8 DER blob).
    public init(key: P256.Signing.PrivateKey, keyID: String, teamID: String) {
        self.key = key
        self.keyID = keyID
        self.teamID = teamID
        self.encodedHeader = Base64URL.encode(Array("{\"alg\":\"ES256\",\"kid\":\"\(keyID)\"}".utf8))
    }

    /// The public half, to configure a verifier (the simulator) with.
    public var publicKey: P256.Signing.PublicKey { key.publicKey }

    /// A signed token issued at `issuedAt` (unix seconds).
    public func token(issuedAt: Int64) throws(ProviderTokenError) -> String {
        let claims = Base64URL.encode(Array("{\"iss\":\"\(teamID)\",\"iat\":\(issuedAt)}".utf8))
        let signingInput = encodedHeader + "." + claims
        let signature: P256.Signing.ECDSASignature
        do {
            signature = try key.signature(for: Array(signingInput.utf8))
        } catch {
            throw ProviderTokenError(.signingFailed, "ES256 signing failed")
        }
        return signingInput + "." + Base64URL.encode(Array(signature.rawRepresentation))
    }

    /// Key and team ids go into JSON verbatim, so only printable ASCII without quotes or
    /// backslashes is accepted (Apple's are 10 alphanumeric characters).
    static func checkIdentifier(_ text: String, name: String) throws(ProviderTokenError) {
        guard !text.isEmpty, text.utf8.count <= 64,
              text.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") })
        else {
            throw ProviderTokenError(.invalidIdentifier, "\(name) must be 1 to 64 printable ASCII characters without quotes")
        }
    }
}

// MARK: - Verification

/// A public key that may sign provider tokens, identified by key id and team id.
public struct ProviderTokenKey: Sendable {
    public let keyID: String
    public let teamID: String
    public let publicKey: P256.Signing.PublicKey

    public init(keyID: String, teamID: String, publicKey: P256.Signing.PublicKey) {
        self.keyID = keyID
        self.teamID = teamID
        self.publicKey = publicKey
    }

    /// A key from a PEM public key (`BEGIN PUBLIC KEY`) or a `.p8` private key, whose public half is used.
    public init(keyID: String, teamID: String, pem: String) throws(ProviderTokenError) {
        if let publicKey = try? P256.Signing.PublicKey(pemRepresentation: pem) {
            self.init(keyID: keyID, teamID: teamID, publicKey: publicKey)
        } else if let privateKey = try? P256.Signing.PrivateKey(pemRepresentation: pem) {
            self.init(keyID: keyID, teamID: teamID, publicKey: privateKey.publicKey)
        } else {
            throw ProviderTokenError(.invalidKey, "key \(keyID): not a PEM-encoded P-256 public or private key")
        }
    }
}

/// The claims of a token that verified.
public struct VerifiedProviderToken: Sendable, Hashable {
    public let keyID: String
    public let teamID: String
    /// `iat`, unix seconds.
    public let issuedAt: Int64
}

/// Checks provider tokens the way APNs does: ES256 only, a configured key chosen by `kid`
/// and `iss`, a numeric `iat` no older than `maximumAge`, and a signature in either JOSE raw
/// R‖S form or ASN.1 DER form (some widely used clients send DER).
public struct ProviderTokenVerifier: Sendable {
    /// APNs rejects tokens issued more than an hour ago.
    public static let defaultMaximumAge: Int64 = 3600
    /// How far in the future `iat` may be, for clocks that run a little ahead.
    public static let defaultClockSkew: Int64 = 300

    private struct KeyName: Hashable { let keyID: String; let teamID: String }
    private let keys: [KeyName: P256.Signing.PublicKey]
    public let maximumAge: Int64
    public let clockSkew: Int64

    public init(keys: [ProviderTokenKey], maximumAge: Int64 = defaultMaximumAge, clockSkew: Int64 = defaultClockSkew) {
        var table: [KeyName: P256.Signing.PublicKey] = [:]
        for key in keys { table[KeyName(keyID: key.keyID, teamID: key.teamID)] = key.publicKey }
        self.keys = table
        self.maximumAge = maximumAge
        self.clockSkew = clockSkew
    }

    public var isEmpty: Bool { keys.isEmpty }

    /// Verifies `token` (without the `bearer ` prefix) at time `now` (unix seconds).
    public func verify(_ token: Substring, now: Int64) throws(ProviderTokenError) -> VerifiedProviderToken {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else {
            throw ProviderTokenError(.malformed, "expected three dot-separated parts, found \(parts.count)")
        }
        let header = try Self.decodeObject(parts[0], part: "header")
        let claims = try Self.decodeObject(parts[1], part: "claims")
        guard let signature = Base64URL.decode(parts[2]) else {
            throw ProviderTokenError(.malformed, "the signature is not base64url")
        }

        guard let alg = header["alg"] else { throw ProviderTokenError(.badClaims, "the header has no alg") }
        guard alg.string == "ES256" else {
            throw ProviderTokenError(.unsupportedAlgorithm, "alg must be \"ES256\", got \(Self.describe(alg))")
        }
        guard let keyID = header["kid"]?.string, !keyID.isEmpty else {
            throw ProviderTokenError(.badClaims, "the header has no kid string")
        }
        guard let teamID = claims["iss"]?.string, !teamID.isEmpty else {
            throw ProviderTokenError(.badClaims, "the claims have no iss string")
        }
        guard let iatValue = claims["iat"] else { throw ProviderTokenError(.badClaims, "the claims have no iat") }
        // Before 1970 is no NumericDate a signer makes, and the age arithmetic below could overflow.
        guard case .number = iatValue, let issuedAt = iatValue.int64, issuedAt >= 0 else {
            throw ProviderTokenError(.badClaims, "iat must be a NumericDate (a non-negative integer), got \(Self.describe(iatValue))")
        }
        guard let publicKey = keys[KeyName(keyID: keyID, teamID: teamID)] else {
            throw ProviderTokenError(.unknownKey, "no key \(JobRules.quoted(JobRules.clip(keyID))) for team \(JobRules.quoted(JobRules.clip(teamID)))")
        }

        let signingInput = token[token.startIndex..<parts[1].endIndex]
        guard Self.isValid(signature: signature, for: Array(signingInput.utf8), publicKey: publicKey) else {
            throw ProviderTokenError(.badSignature, "the ES256 signature does not verify with key \(JobRules.quoted(keyID))")
        }
        // The signature is checked before the age so that a forged token is always reported as forged.
        guard issuedAt >= now - maximumAge else {
            throw ProviderTokenError(.expired, "iat \(issuedAt) is \(now - issuedAt) s old; at most \(maximumAge) s are allowed")
        }
        guard issuedAt <= now + clockSkew else {
            throw ProviderTokenError(.issuedInFuture, "iat \(issuedAt) is \(issuedAt - now) s in the future")
        }
        return VerifiedProviderToken(keyID: keyID, teamID: teamID, issuedAt: issuedAt)
    }

    public func verify(_ token: String, now: Int64) throws(ProviderTokenError) -> VerifiedProviderToken {
        try verify(token[...], now: now)
    }

    private static func isValid(signature: [UInt8], for input: [UInt8], publicKey: P256.Signing.PublicKey) -> Bool {
        if signature.count == 64, let raw = try? P256.Signing.ECDSASignature(rawRepresentation: signature) {
            return publicKey.isValidSignature(raw, for: input)
        }
        if let der = try? P256.Signing.ECDSASignature(derRepresentation: signature) {
            return publicKey.isValidSignature(der, for: input)
        }
        return false
    }

    private static func decodeObject(_ part: Substring, part name: String) throws(ProviderTokenError) -> JSONValue {
        guard let bytes = Base64URL.decode(part) else {
            throw ProviderTokenError(.malformed, "the \(name) is not base64url")
        }
        let value: JSONValue
        do {
            value = try JSONParser.parse(bytes, maxDepth: 8)
        } catch {
            throw ProviderTokenError(.malformed, "the \(name) is not JSON (\(error.message))")
        }
        guard case .object = value else {
            throw ProviderTokenError(.malformed, "the \(name) is \(value.typeName), not an object")
        }
        return value
    }

    private static func describe(_ value: JSONValue) -> String {
        switch value {
        case .string(let text): "the string \(JobRules.quoted(JobRules.clip(text)))"
        case .number(let literal): "the number \(JobRules.clip(literal))"
        default: value.typeName
        }
    }
}

// MARK: - base64url

/// Base64url without padding (RFC 4648 §5), as JWT uses it. Decoding also accepts padding.
public enum Base64URL {
    private static let alphabet: [UInt8] = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    private static let reverse: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (index, byte) in alphabet.enumerated() { table[Int(byte)] = UInt8(index) }
        // Standard base64's two characters decode too: some clients get this wrong.
        table[Int(UInt8(ascii: "+"))] = 62
        table[Int(UInt8(ascii: "/"))] = 63
        return table
    }()

    public static func encode(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count * 4 + 2) / 3)
        var index = 0
        while index + 3 <= bytes.count {
            let value = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2])
            out.append(alphabet[Int(value >> 18 & 63)])
            out.append(alphabet[Int(value >> 12 & 63)])
            out.append(alphabet[Int(value >> 6 & 63)])
            out.append(alphabet[Int(value & 63)])
            index += 3
        }
        let rest = bytes.count - index
        if rest == 1 {
            let value = UInt32(bytes[index]) << 16
            out.append(alphabet[Int(value >> 18 & 63)])
            out.append(alphabet[Int(value >> 12 & 63)])
        } else if rest == 2 {
            let value = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8
            out.append(alphabet[Int(value >> 18 & 63)])
            out.append(alphabet[Int(value >> 12 & 63)])
            out.append(alphabet[Int(value >> 6 & 63)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// nil when the text has a character outside the alphabet or an impossible length.
    public static func decode(_ text: some StringProtocol) -> [UInt8]? {
        var utf8 = Array(text.utf8)
        while utf8.last == UInt8(ascii: "=") { utf8.removeLast() }
        guard utf8.count % 4 != 1 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(utf8.count * 3 / 4)
        var accumulator: UInt32 = 0
        var bits = 0
        for byte in utf8 {
            let value = reverse[Int(byte)]
            guard value != 0xFF else { return nil }
            accumulator = accumulator << 6 | UInt32(value)
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: accumulator >> UInt32(bits)))
            }
        }
        return out
    }
}
