import APNsCore

extension LegacyErrorStatus {
    /// The HTTP/2 provider API's status and reason that mean the same, so that results, retries
    /// and token events treat both interfaces alike. Codes with no HTTP/2 twin keep their own
    /// name as the reason (`InvalidTokenSize`, `ProcessingError`, …) with the status class that
    /// matches `classification`: 500 for the retryable ones, 400 for the rest.
    public var http2Equivalent: (status: Int, reason: APNsReason) {
        switch code {
        case 2: (400, .missingDeviceToken)
        case 3: (400, .missingTopic)
        case 4: (400, .payloadEmpty)
        case 7: (413, .payloadTooLarge)
        // "Invalid token": the gateway does not know the token, as BadDeviceToken says
        // (a token for the other environment, or none at all). It invalidates the token.
        case 8: (400, .badDeviceToken)
        default: (classification == .retryable ? 500 : 400, APNsReason(rawValue: reasonName))
        }
    }
}

extension LegacyGatewayVerdict {
    /// The form `DeliveryPolicy.after(attempt:result:…)` consumes: accepted is 200; a rejection or
    /// refusal is its status's HTTP/2 equivalent; no verdict stays unanswered (retryable).
    public var attemptResult: AttemptResult {
        switch self {
        case .accepted:
            .answered(status: 200, reason: nil)
        case .rejected(let status), .refused(let status, _):
            .answered(status: status.http2Equivalent.status, reason: status.http2Equivalent.reason)
        case .notAnswered(let why):
            .notAnswered("legacy gateway: \(why)")
        }
    }
}
