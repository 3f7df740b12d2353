import APNsCore

/// The parts of an HTTP/2 request the provider API looks at, as received.
///
/// Each field is the first value seen; a repeated header is recorded in `duplicateHeader`.
public struct APNsRequestHead: Sendable, Hashable {
    public var method: String?
    public var path: String?
    public var authorization: String?
    public var apnsID: String?
    public var expiration: String?
    public var priority: String?
    public var topic: String?
    public var collapseID: String?
    public var pushType: String?
    /// The name of the first header that appeared twice, if any.
    public var duplicateHeader: String?
    /// The header list was larger than the SETTINGS_MAX_HEADER_LIST_SIZE the simulator
    /// advertises (8000, as APNs does); what came after the limit was not read.
    public var headerListTooLarge = false

    public init(
        method: String? = nil,
        path: String? = nil,
        authorization: String? = nil,
        apnsID: String? = nil,
        expiration: String? = nil,
        priority: String? = nil,
        topic: String? = nil,
        collapseID: String? = nil,
        pushType: String? = nil,
        duplicateHeader: String? = nil
    ) {
        self.method = method
        self.path = path
        self.authorization = authorization
        self.apnsID = apnsID
        self.expiration = expiration
        self.priority = priority
        self.topic = topic
        self.collapseID = collapseID
        self.pushType = pushType
        self.duplicateHeader = duplicateHeader
    }
}

/// A refusal: the status and reason APNs would answer with.
public struct APNsRejection: Error, Sendable, Hashable, CustomStringConvertible {
    public let status: Int
    public let reason: APNsReason
    /// For 410: when the token was found unregistered, milliseconds since the epoch.
    public let timestamp: Int64?

    public init(_ reason: APNsReason, status: Int? = nil, timestamp: Int64? = nil) {
        self.reason = reason
        self.status = status ?? reason.known?.status ?? 400
        self.timestamp = timestamp
    }

    public var description: String { "\(status) \(reason)" }
}

/// Which topics an authenticated connection may push to.
public struct TopicGrant: Sendable, Hashable {
    /// Topics allowed; empty means any well-formed topic. Bundle ids (a push type's suffix such
    /// as `.voip` is added to them), or, with `exact`, whole topics.
    public var topics: [String]
    /// Whether `apns-topic` must be present (token auth, or a certificate with several topics).
    public var topicRequired: Bool
    /// The topics are whole topics, suffixes included, as a certificate's topics extension
    /// lists them (`com.example.app`, `com.example.app.voip`): a VoIP-only certificate grants
    /// `com.example.app.voip` and not `com.example.app`.
    public var exact: Bool

    public init(topics: [String], topicRequired: Bool, exact: Bool = false) {
        self.topics = topics
        self.topicRequired = topicRequired
        self.exact = exact
    }

    /// The topic used when the request names none: the single topic of a certificate.
    var defaultTopic: String? { topics.count == 1 ? topics[0] : nil }
}

/// A request that passed every header and payload rule.
public struct APNsAcceptedRequest: Sendable, Hashable {
    /// The `:path`; the token is cut out of it only when asked for.
    let path: String
    public let topic: String
    public let pushType: PushType
    public let priority: NotificationPriority

    public var deviceToken: String { String(RequestValidator().deviceToken(in: path)) }
}

/// The provider API's request rules (reference Tables 8-1, 8-2, 8-4, 8-6), as a pure function
/// of the request: no I/O, no clock, no randomness. Stateful behaviour (authentication, rate
/// limits, unregistered tokens, injected failures) is decided by the caller around it.
public struct RequestValidator: Sendable {
    /// Not in Table 8-6 but what APNs answers for an unknown `apns-push-type`.
    public static let invalidPushType = APNsReason(rawValue: "InvalidPushType")
    /// The simulator's own reason for a header list over the advertised limit (answered 431).
    public static let headerListTooLarge = APNsReason(rawValue: "RequestHeaderFieldsTooLarge")
    /// SETTINGS_MAX_HEADER_LIST_SIZE as APNs advertises it.
    public static let maximumHeaderListSize = 8000

    public init() {}

    /// Method, path and repeated headers: the rules checked before authentication.
    public func checkRoute(_ head: APNsRequestHead) -> APNsRejection? {
        // libnghttp2 advertises the limit but does not enforce it. RFC 9113 lets a server answer
        // 431; what APNs does is not documented, so the simulator's reason is its own.
        if head.headerListTooLarge { return APNsRejection(Self.headerListTooLarge, status: 431) }
        if head.method != "POST" { return APNsRejection(.methodNotAllowed) }
        guard let path = head.path else { return APNsRejection(.badPath) }
        let shape = Self.pathShape(path)
        if shape == .other { return APNsRejection(.badPath) }
        if head.duplicateHeader != nil { return APNsRejection(.duplicateHeaders) }
        switch shape {
        case .noToken: return APNsRejection(.missingDeviceToken)
        case .badToken: return APNsRejection(.badDeviceToken)
        case .other, .token: return nil
        }
    }

    enum PathShape { case other, noToken, badToken, token }

    /// Classifies `:path` in one pass over its bytes (this runs for every request).
    static func pathShape(_ path: String) -> PathShape {
        var path = path
        return path.withUTF8 { bytes in
            let prefix = devicePrefix.utf8Start
            let prefixCount = devicePrefix.utf8CodeUnitCount
            // "/3/device" without the last slash still names the device endpoint.
            let checked = min(bytes.count, prefixCount)
            guard checked >= prefixCount - 1 else { return .other }
            for index in 0..<checked where bytes[index] != prefix[index] { return .other }
            let count = bytes.count - prefixCount
            if count <= 0 { return .noToken }
            guard count % 2 == 0, count >= DeviceToken.minimumBytes * 2, count <= DeviceToken.maximumBytes * 2 else { return .badToken }
            for index in prefixCount..<bytes.count where !isHexDigit(bytes[index]) { return .badToken }
            return .token
        }
    }

    @inline(__always)
    private static func isHexDigit(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "a")...UInt8(ascii: "f"), UInt8(ascii: "A")...UInt8(ascii: "F"): true
        default: false
        }
    }

    /// Every header and payload rule, after authentication has granted `grant`.
    public func checkNotification(_ head: APNsRequestHead, payloadCount: Int, grant: TopicGrant) -> Result<APNsAcceptedRequest, APNsRejection> {
        if let rejection = checkRoute(head) { return .failure(rejection) }
        return checkHeaders(head, payloadCount: payloadCount, grant: grant)
    }

    /// `checkNotification` for a request whose route `checkRoute` already accepted.
    func checkHeaders(_ head: APNsRequestHead, payloadCount: Int, grant: TopicGrant) -> Result<APNsAcceptedRequest, APNsRejection> {
        if let apnsID = head.apnsID, !Self.isCanonicalUUID(apnsID) { return .failure(APNsRejection(.badMessageId)) }

        var priority = NotificationPriority.immediate
        if let text = head.priority {
            // Only the reference's literal values: Int("+10") and Int("010") would pass as 10.
            guard let value = Int(text), String(value) == text, let parsed = NotificationPriority(rawValue: value) else {
                return .failure(APNsRejection(.badPriority))
            }
            priority = parsed
        }
        if let text = head.expiration {
            guard !text.isEmpty, text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }), Int64(text) != nil else {
                return .failure(APNsRejection(.badExpirationDate))
            }
        }
        if let collapseID = head.collapseID, collapseID.utf8.count > JobRules.maximumCollapseIDBytes {
            return .failure(APNsRejection(.badCollapseId))
        }
        var statedPushType: PushType?
        if let text = head.pushType {
            guard let parsed = PushType(rawValue: text) else { return .failure(APNsRejection(Self.invalidPushType, status: 400)) }
            statedPushType = parsed
        }

        let topic: String
        if let given = head.topic {
            guard Self.isWellFormedTopic(given) else { return .failure(APNsRejection(.badTopic)) }
            topic = given
        } else if !grant.topicRequired, let fallback = grant.defaultTopic {
            // A certificate's own topic already carries its suffix; a bundle id gets the push type's.
            let suffix = statedPushType?.requiredTopicSuffix ?? ""
            topic = grant.exact || fallback.hasSuffix(suffix) ? fallback : fallback + suffix
        } else {
            return .failure(APNsRejection(.missingTopic))
        }
        // Without apns-push-type, the topic says it, as in the provider API before the header:
        // `.voip` is a VoIP push (5120 bytes), and so on; anything else an alert.
        let pushType = statedPushType ?? PushType.implied(byTopic: topic)
        // Background notifications must not ask for immediate delivery.
        if pushType == .background && priority == .immediate { return .failure(APNsRejection(.badPriority)) }

        let base: Substring
        if let suffix = pushType.requiredTopicSuffix {
            guard topic.hasSuffix(suffix), topic.utf8.count > suffix.utf8.count else { return .failure(APNsRejection(.badTopic)) }
            base = topic.dropLast(suffix.count)
        } else {
            base = topic[...]
        }
        let granted = grant.exact ? grant.topics.contains(topic) : grant.topics.contains(where: { $0 == base })
        if !grant.topics.isEmpty, !granted {
            return .failure(APNsRejection(.topicDisallowed))
        }

        if payloadCount == 0 { return .failure(APNsRejection(.payloadEmpty)) }
        if payloadCount > pushType.maximumPayloadBytes { return .failure(APNsRejection(.payloadTooLarge)) }

        return .success(APNsAcceptedRequest(path: head.path ?? "", topic: topic, pushType: pushType, priority: priority))
    }

    /// The text after `/3/device/` (empty when there is none).
    public func deviceToken(in path: String) -> Substring {
        let utf8 = path.utf8
        guard utf8.count > Self.devicePrefixCount else { return "" }
        return Substring(utf8[utf8.index(utf8.startIndex, offsetBy: Self.devicePrefixCount)...])
    }

    private static let devicePrefix: StaticString = "/3/device/"
    private static var devicePrefixCount: Int { devicePrefix.utf8CodeUnitCount }

    /// 64 to 200 hex digits (32 to 100 bytes), as `DeviceToken` accepts.
    static func isWellFormedToken(_ token: Substring) -> Bool {
        let count = token.utf8.count
        guard count % 2 == 0, count >= DeviceToken.minimumBytes * 2, count <= DeviceToken.maximumBytes * 2 else { return false }
        for byte in token.utf8 {
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "a")...UInt8(ascii: "f"), UInt8(ascii: "A")...UInt8(ascii: "F"): continue
            default: return false
            }
        }
        return true
    }

    static func isCanonicalUUID(_ text: String) -> Bool {
        let utf8 = text.utf8
        guard utf8.count == 36 else { return false }
        for (index, byte) in utf8.enumerated() {
            if index == 8 || index == 13 || index == 18 || index == 23 {
                guard byte == UInt8(ascii: "-") else { return false }
            } else {
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "a")...UInt8(ascii: "f"), UInt8(ascii: "A")...UInt8(ascii: "F"): continue
                default: return false
                }
            }
        }
        return true
    }

    /// A bundle-id-like topic: non-empty, at most 256 bytes, printable ASCII without spaces.
    public static func isWellFormedTopic(_ topic: String) -> Bool {
        var topic = topic
        return topic.withUTF8 { bytes in
            guard bytes.count > 0, bytes.count <= JobRules.maximumIdentifierBytes else { return false }
            for byte in bytes where byte <= 0x20 || byte >= 0x7F { return false }
            return true
        }
    }
}

extension PushType {
    /// The push type a topic implies when the request states none: the one whose suffix the
    /// topic carries (the longest, so `.voip-ptt` is push-to-talk, not VoIP), else alert.
    static func implied(byTopic topic: String) -> PushType {
        var best: (type: PushType, length: Int)?
        for type in PushType.allCases {
            guard let suffix = type.requiredTopicSuffix, topic.hasSuffix(suffix), topic.utf8.count > suffix.utf8.count else { continue }
            if suffix.utf8.count > best?.length ?? 0 { best = (type, suffix.utf8.count) }
        }
        return best?.type ?? .alert
    }
}
