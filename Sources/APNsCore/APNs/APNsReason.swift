/// What a worker should do about an APNs answer.
public enum ReasonClass: String, Sendable, Hashable {
    /// Trying again later can succeed (server trouble, throttling, a stale provider token).
    case retryable
    /// Retrying cannot help; the notification is rejected for good.
    case final
    /// Final, and the device token is dead: the feedback worker emits a token event.
    case tokenInvalidating = "token-invalidating"
}

/// An APNs error reason (Table 8-6 of the provider API), with an `unknown` fallback so that a
/// reason Apple adds later is carried through instead of failing to parse.
public struct APNsReason: Sendable, Hashable, CustomStringConvertible {
    public let rawValue: String

    public init(rawValue: String) {
        self.rawValue = rawValue
    }

    public var description: String { rawValue }

    /// The table entry for this reason, nil when APNs sent something not in the table.
    public var known: APNsReasonEntry? { APNsReasonTable.byReason[rawValue] }

    public var isKnown: Bool { known != nil }

    /// The classification; an unknown reason is judged by its status code.
    public func classification(status: Int) -> ReasonClass {
        known?.classification ?? APNsReasonTable.classification(status: status)
    }

    public static let badCollapseId = APNsReason(rawValue: "BadCollapseId")
    public static let badDeviceToken = APNsReason(rawValue: "BadDeviceToken")
    public static let badExpirationDate = APNsReason(rawValue: "BadExpirationDate")
    public static let badMessageId = APNsReason(rawValue: "BadMessageId")
    public static let badPriority = APNsReason(rawValue: "BadPriority")
    public static let badTopic = APNsReason(rawValue: "BadTopic")
    public static let deviceTokenNotForTopic = APNsReason(rawValue: "DeviceTokenNotForTopic")
    public static let duplicateHeaders = APNsReason(rawValue: "DuplicateHeaders")
    public static let idleTimeout = APNsReason(rawValue: "IdleTimeout")
    public static let missingDeviceToken = APNsReason(rawValue: "MissingDeviceToken")
    public static let missingTopic = APNsReason(rawValue: "MissingTopic")
    public static let payloadEmpty = APNsReason(rawValue: "PayloadEmpty")
    public static let topicDisallowed = APNsReason(rawValue: "TopicDisallowed")
    public static let badCertificate = APNsReason(rawValue: "BadCertificate")
    public static let badCertificateEnvironment = APNsReason(rawValue: "BadCertificateEnvironment")
    public static let expiredProviderToken = APNsReason(rawValue: "ExpiredProviderToken")
    public static let forbidden = APNsReason(rawValue: "Forbidden")
    public static let invalidProviderToken = APNsReason(rawValue: "InvalidProviderToken")
    public static let missingProviderToken = APNsReason(rawValue: "MissingProviderToken")
    public static let badPath = APNsReason(rawValue: "BadPath")
    public static let methodNotAllowed = APNsReason(rawValue: "MethodNotAllowed")
    public static let unregistered = APNsReason(rawValue: "Unregistered")
    public static let payloadTooLarge = APNsReason(rawValue: "PayloadTooLarge")
    public static let tooManyProviderTokenUpdates = APNsReason(rawValue: "TooManyProviderTokenUpdates")
    public static let tooManyRequests = APNsReason(rawValue: "TooManyRequests")
    public static let internalServerError = APNsReason(rawValue: "InternalServerError")
    public static let serviceUnavailable = APNsReason(rawValue: "ServiceUnavailable")
    public static let shutdown = APNsReason(rawValue: "Shutdown")
}

/// One row of Table 8-6.
public struct APNsReasonEntry: Sendable, Hashable {
    public let reason: APNsReason
    public let status: Int
    public let classification: ReasonClass
    /// Whether the client should mint a fresh provider token (and replace the connection).
    public let refreshesProviderToken: Bool
    public let meaning: String
}

/// Tables 8-4 and 8-6 of the HTTP/2 provider API, as data.
public enum APNsReasonTable {
    /// Table 8-4: every status code APNs answers with.
    public static let statuses: [Int: String] = [
        200: "Success",
        400: "Bad request",
        403: "There was an error with the certificate or with the provider authentication token",
        404: "The request contained a bad :path value",
        405: "The request used a bad :method value. Only POST requests are supported",
        410: "The device token is no longer active for the topic",
        413: "The notification payload was too large",
        429: "The server received too many requests for the same device token",
        500: "Internal server error",
        503: "The server is shutting down and unavailable",
    ]

    /// Table 8-6, in the reference's order.
    public static let entries: [APNsReasonEntry] = [
        entry(.badCollapseId, 400, .final, "The collapse identifier exceeds the maximum allowed size"),
        entry(.badDeviceToken, 400, .tokenInvalidating, "The specified device token was bad; it may be for the other environment"),
        entry(.badExpirationDate, 400, .final, "The apns-expiration value is bad"),
        entry(.badMessageId, 400, .final, "The apns-id value is bad"),
        entry(.badPriority, 400, .final, "The apns-priority value is bad"),
        entry(.badTopic, 400, .final, "The apns-topic was invalid"),
        entry(.deviceTokenNotForTopic, 400, .tokenInvalidating, "The device token does not match the specified topic"),
        entry(.duplicateHeaders, 400, .final, "One or more headers were repeated"),
        entry(.idleTimeout, 400, .retryable, "Idle time out"),
        entry(.missingDeviceToken, 400, .final, "The device token is not specified in the request :path"),
        entry(.missingTopic, 400, .final, "The apns-topic header was required and not specified"),
        entry(.payloadEmpty, 400, .final, "The message payload was empty"),
        entry(.topicDisallowed, 400, .final, "Pushing to this topic is not allowed"),
        entry(.badCertificate, 403, .final, "The certificate was bad"),
        entry(.badCertificateEnvironment, 403, .final, "The client certificate was for the wrong environment"),
        entry(.expiredProviderToken, 403, .retryable, "The provider token is stale and a new token should be generated", refresh: true),
        entry(.forbidden, 403, .final, "The specified action is not allowed"),
        entry(.invalidProviderToken, 403, .final, "The provider token is not valid or its signature could not be verified", refresh: true),
        entry(.missingProviderToken, 403, .final, "No provider certificate was used and the authorization header was missing"),
        entry(.badPath, 404, .final, "The request contained a bad :path value"),
        entry(.methodNotAllowed, 405, .final, "The specified :method was not POST"),
        entry(.unregistered, 410, .tokenInvalidating, "The device token is inactive for the specified topic"),
        entry(.payloadTooLarge, 413, .final, "The message payload was too large"),
        entry(.tooManyProviderTokenUpdates, 429, .retryable, "The provider token is being updated too often"),
        entry(.tooManyRequests, 429, .retryable, "Too many requests were made consecutively to the same device token"),
        entry(.internalServerError, 500, .retryable, "An internal server error occurred"),
        entry(.serviceUnavailable, 503, .retryable, "The service is unavailable"),
        entry(.shutdown, 503, .retryable, "The server is shutting down"),
    ]

    public static let byReason: [String: APNsReasonEntry] = Dictionary(
        uniqueKeysWithValues: entries.map { ($0.reason.rawValue, $0) }
    )

    /// How to treat a status whose reason is missing or unknown: 429 and 5xx are worth retrying.
    public static func classification(status: Int) -> ReasonClass {
        switch status {
        case 200: .final
        case 410: .tokenInvalidating
        case 429, 500...599: .retryable
        default: .final
        }
    }

    private static func entry(
        _ reason: APNsReason,
        _ status: Int,
        _ classification: ReasonClass,
        _ meaning: String,
        refresh: Bool = false
    ) -> APNsReasonEntry {
        APNsReasonEntry(reason: reason, status: status, classification: classification, refreshesProviderToken: refresh, meaning: meaning)
    }
}

/// Status codes of the legacy binary interface's error-response packet (command 8), Table 5-1.
public struct LegacyErrorStatus: Sendable, Hashable, CustomStringConvertible {
    public let code: UInt8

    public init(code: UInt8) {
        self.code = code
    }

    public static let noErrors = LegacyErrorStatus(code: 0)
    public static let processingError = LegacyErrorStatus(code: 1)
    public static let missingDeviceToken = LegacyErrorStatus(code: 2)
    public static let missingTopic = LegacyErrorStatus(code: 3)
    public static let missingPayload = LegacyErrorStatus(code: 4)
    public static let invalidTokenSize = LegacyErrorStatus(code: 5)
    public static let invalidTopicSize = LegacyErrorStatus(code: 6)
    public static let invalidPayloadSize = LegacyErrorStatus(code: 7)
    public static let invalidToken = LegacyErrorStatus(code: 8)
    public static let unknown = LegacyErrorStatus(code: 255)

    /// Table 5-1's descriptions; codes outside the table read as "Unknown status N".
    public static let table: [UInt8: String] = [
        0: "No errors encountered",
        1: "Processing error",
        2: "Missing device token",
        3: "Missing topic",
        4: "Missing payload",
        5: "Invalid token size",
        6: "Invalid topic size",
        7: "Invalid payload size",
        8: "Invalid token",
        255: "None (unknown)",
    ]

    public var meaning: String { Self.table[code] ?? "Unknown status \(code)" }

    /// A name usable as a result `reason` (no spaces), e.g. `InvalidToken`.
    public var reasonName: String {
        guard let meaning = Self.table[code] else { return "UnknownStatus\(code)" }
        if code == 255 { return "Unknown" }
        return meaning.split(separator: " ").map { $0.prefix(1).uppercased() + $0.dropFirst() }.joined()
    }

    /// Processing errors are worth a retry; the other codes describe the notification itself.
    public var classification: ReasonClass {
        switch code {
        case 1, 255: .retryable
        case 8: .tokenInvalidating
        default: .final
        }
    }

    public var description: String { "\(code) (\(meaning))" }
}
