import APNsCore

/// Token authentication of one connection, the way APNs applies it (pure: the caller passes
/// the clock).
///
/// - Each distinct token is verified once per connection; later requests compare strings.
/// - `iat` must be within `maximumAge` of now on every request (403 ExpiredProviderToken).
/// - Switching to a token issued (`iat`) less than `minimumChangeInterval` after the current
///   one gets 429 TooManyProviderTokenUpdates and leaves the current token in place. Timed by
///   `iat`, not by when this connection took the current token: a connection opened with a
///   55-minute-old token must be able to switch to a fresh one five minutes later. Once the
///   current token has expired, any valid replacement is taken.
public struct TokenAuthenticator: Sendable {
    public let verifier: ProviderTokenVerifier
    /// Seconds between the `iat` of the current token and of its replacement. Default: 1200 (20 minutes).
    public let minimumChangeInterval: Int64

    private var current: (token: String, claims: VerifiedProviderToken)?
    /// The whole `authorization` header of the current token.
    private var currentHeader = ""
    /// Tokens already checked on this connection (valid or not), so none is verified twice.
    /// A token from the future is kept with the second it was checked, and checked again only
    /// once the clock has moved on: it becomes valid as the clock catches up.
    private var seen: [String: (result: Result<VerifiedProviderToken, ProviderTokenError>, checkedAt: Int64)] = [:]
    private static let seenLimit = 16

    /// How many signature verifications this connection has done.
    public private(set) var verifications = 0

    public init(verifier: ProviderTokenVerifier, minimumChangeInterval: Int64 = 1200) {
        self.verifier = verifier
        self.minimumChangeInterval = minimumChangeInterval
    }

    /// Whether a token has been accepted on this connection.
    public var hasValidToken: Bool { current != nil }

    /// Judges the `authorization` header of one request at `now` (unix seconds).
    public mutating func authenticate(authorization: String?, now: Int64) -> Result<VerifiedProviderToken, APNsRejection> {
        guard let authorization, !authorization.isEmpty else { return .failure(APNsRejection(.missingProviderToken)) }
        // The fast path: the same header as the last accepted request (usually the same String storage).
        if let current, authorization == currentHeader {
            return checkAge(current.claims, now: now)
        }
        guard let token = Self.bearerToken(authorization) else { return .failure(APNsRejection(.invalidProviderToken)) }
        if token.isEmpty { return .failure(APNsRejection(.missingProviderToken)) }

        // The fast path: the connection's current token.
        if let current, current.token.utf8.count == token.utf8.count, current.token == token {
            currentHeader = authorization
            return checkAge(current.claims, now: now)
        }

        let result: Result<VerifiedProviderToken, ProviderTokenError>
        if let known = seen[String(token)], !(known.checkedAt < now && Self.isFromTheFuture(known.result)) {
            result = known.result
        } else {
            verifications += 1
            do {
                result = .success(try verifier.verify(token, now: now))
            } catch {
                result = .failure(error)
            }
            if seen.count >= Self.seenLimit { seen.removeAll(keepingCapacity: true) }
            seen[String(token)] = (result, now)
        }

        switch result {
        case .failure(let error):
            return .failure(APNsRejection(error.code == .expired ? .expiredProviderToken : .invalidProviderToken))
        case .success(let claims):
            if case .failure(let rejection) = checkAge(claims, now: now) { return .failure(rejection) }
            // Once the current token has expired, a valid replacement is taken whatever its iat:
            // otherwise a replacement refused once would be refused for good.
            if let current, minimumChangeInterval > 0, claims.issuedAt - current.claims.issuedAt < minimumChangeInterval,
                case .success = checkAge(current.claims, now: now)
            {
                return .failure(APNsRejection(.tooManyProviderTokenUpdates))
            }
            current = (String(token), claims)
            currentHeader = authorization
            return .success(claims)
        }
    }

    private static func isFromTheFuture(_ result: Result<VerifiedProviderToken, ProviderTokenError>) -> Bool {
        if case .failure(let error) = result { error.code == .issuedInFuture } else { false }
    }

    private func checkAge(_ claims: VerifiedProviderToken, now: Int64) -> Result<VerifiedProviderToken, APNsRejection> {
        claims.issuedAt < now - verifier.maximumAge ? .failure(APNsRejection(.expiredProviderToken)) : .success(claims)
    }

    /// The token after a case-insensitive `bearer ` scheme, nil for another scheme.
    static func bearerToken(_ header: String) -> Substring? {
        let scheme = "bearer"
        let utf8 = header.utf8
        guard utf8.count >= scheme.utf8.count,
              zip(utf8.prefix(scheme.utf8.count), scheme.utf8).allSatisfy({ $0 | 0x20 == $1 })
        else { return nil }
        let rest = header.dropFirst(scheme.count)
        guard rest.isEmpty || rest.first == " " else { return nil }
        return rest.drop(while: { $0 == " " })
    }
}
