/// The `apns-push-type` values APNs accepts.
public enum PushType: String, Sendable, CaseIterable, Hashable {
    case alert, background, location, voip, complication, fileprovider, mdm, liveactivity, pushtotalk, widgets, controls

    /// The largest payload APNs takes for this push type, in bytes.
    public var maximumPayloadBytes: Int {
        self == .voip ? 5120 : 4096
    }

    static let allNames = allCases.map(\.rawValue).joined(separator: ", ")

    /// The suffix the topic of this push type must carry after the bundle id (`.voip` for
    /// VoIP), if any.
    public var requiredTopicSuffix: String? {
        switch self {
        case .voip: ".voip"
        case .complication: ".complication"
        case .fileprovider: ".pushkit.fileprovider"
        case .liveactivity: ".push-type.liveactivity"
        case .location: ".location-query"
        case .pushtotalk: ".voip-ptt"
        case .widgets: ".push-type.widgets"
        case .controls: ".push-type.controls"
        case .alert, .background, .mdm: nil
        }
    }
}

/// The `apns-priority` values APNs accepts.
public enum NotificationPriority: Int, Sendable, CaseIterable, Hashable {
    /// Send immediately.
    case immediate = 10
    /// Send at a time that considers the device's power.
    case powerConsiderate = 5
    /// Lowest priority, may be delayed a long time.
    case low = 1
}

/// Which APNs environment a job or app talks to.
public enum APNsEnvironment: String, Sendable, CaseIterable, Hashable {
    case production, sandbox
}

/// Which of the two job encodings a record used.
public enum JobEncoding: String, Sendable, Hashable {
    /// A JSON envelope in the record value.
    case envelope
    /// Record headers plus the raw APNs payload as the record value.
    case headers
}

/// A slice of JSON bytes kept exactly as the producer wrote them (the payload, `meta`).
///
/// Holding the bytes instead of a decoded tree is what lets the payload reach the wire
/// without a decode and re-encode round trip.
public struct RawJSON: Sendable, Hashable, CustomStringConvertible {
    public let bytes: ArraySlice<UInt8>

    public init(bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
    }

    public init(_ text: String) {
        self.bytes = ArraySlice(text.utf8)
    }

    public var count: Int { bytes.count }

    public var description: String { String(decoding: bytes, as: UTF8.self) }
}

/// A notification job as a producer published it, after syntax and rule validation.
///
/// Fields a producer may omit are optional here; `resolved(defaults:)` fills them from the
/// app's configured defaults and applies the checks that depend on them.
public struct NotificationJob: Sendable, Hashable {
    public var id: String?
    public var tokens: [DeviceToken]
    public var topic: String?
    public var pushType: PushType?
    public var priority: NotificationPriority?
    /// `apns-expiration`: unix seconds; 0 means APNs does not store it for an offline device (the worker may still retry a failed attempt, within the deadline).
    public var expiration: Int64?
    public var collapseID: String?
    /// `apns-id`, only from the header encoding (a fan-out job gets one id per notification).
    public var apnsID: String?
    public var payload: RawJSON
    public var environment: APNsEnvironment?
    public var app: String?
    /// Unix seconds after which the job must not be sent.
    public var deadline: Int64?
    public var meta: RawJSON?
    public var encoding: JobEncoding

    public init(
        id: String? = nil,
        tokens: [DeviceToken],
        topic: String? = nil,
        pushType: PushType? = nil,
        priority: NotificationPriority? = nil,
        expiration: Int64? = nil,
        collapseID: String? = nil,
        apnsID: String? = nil,
        payload: RawJSON,
        environment: APNsEnvironment? = nil,
        app: String? = nil,
        deadline: Int64? = nil,
        meta: RawJSON? = nil,
        encoding: JobEncoding = .envelope
    ) {
        self.id = id
        self.tokens = tokens
        self.topic = topic
        self.pushType = pushType
        self.priority = priority
        self.expiration = expiration
        self.collapseID = collapseID
        self.apnsID = apnsID
        self.payload = payload
        self.environment = environment
        self.app = app
        self.deadline = deadline
        self.meta = meta
        self.encoding = encoding
    }
}

/// What an app's configuration supplies when a job leaves a field out.
public struct JobDefaults: Sendable, Hashable {
    public var topic: String?
    public var pushType: PushType
    public var priority: NotificationPriority
    public var environment: APNsEnvironment

    public init(
        topic: String? = nil,
        pushType: PushType = .alert,
        priority: NotificationPriority = .immediate,
        environment: APNsEnvironment = .production
    ) {
        self.topic = topic
        self.pushType = pushType
        self.priority = priority
        self.environment = environment
    }
}

/// A job with every field settled: what the APNs client needs to send it.
public struct ResolvedJob: Sendable, Hashable {
    public var job: NotificationJob
    public var topic: String
    public var pushType: PushType
    public var priority: NotificationPriority
    public var environment: APNsEnvironment
}

extension NotificationJob {
    /// Fills omitted fields from the app's defaults and checks the rules that depend on them
    /// (a topic must exist in the end; ``checkRules(pushType:)`` against the push type).
    public func resolved(defaults: JobDefaults, appName: String? = nil) throws(JobRejection) -> ResolvedJob {
        let settled = try settledFields(defaults: defaults, appName: appName)
        return ResolvedJob(job: self, topic: settled.topic, pushType: settled.pushType, priority: settled.priority, environment: settled.environment)
    }

    /// The rules between the job's own fields and its push type, which APNs would refuse the
    /// job for every time: the payload limit, a stated topic's suffix, a background push at
    /// priority 10.
    /// `topicSuffix: false` for the legacy binary interface, which sends no topic.
    public func checkRules(pushType: PushType, topicSuffix: Bool = true) throws(JobRejection) {
        do { try checkFieldRules(pushType: pushType, topicSuffix: topicSuffix) } catch { throw named(error) }
    }

    /// A header-encoded job's rejection names the header the producer wrote, not the envelope's
    /// field of the same meaning.
    private func named(_ rejection: JobRejection) -> JobRejection {
        guard encoding == .headers, let field = rejection.field else { return rejection }
        switch field {
        case "topic": return rejection.at("apns-topic header")
        case "priority": return rejection.at("apns-priority header")
        default: return rejection
        }
    }

    private func checkFieldRules(pushType: PushType, topicSuffix: Bool) throws(JobRejection) {
        if topicSuffix, let topic, let suffix = pushType.requiredTopicSuffix, !topic.hasSuffix(suffix) || topic.utf8.count == suffix.utf8.count {
            throw JobRejection(
                field: "topic", "topic '\(topic)' does not end in '\(suffix)' after the bundle id, which APNs requires for push type \(pushType.rawValue) (it answers BadTopic)"
            )
        }
        if pushType == .background, priority == .immediate {
            throw JobRejection(field: "priority", "priority 10 is not allowed for push type background (APNs answers BadPriority); use 5 or 1")
        }
        try JobRules.checkPayloadSize(payload.count, pushType: pushType)
    }

    /// What `resolved` settles, without making the `ResolvedJob`: the intake checks everything
    /// first and then hands its job over (`consume`) instead of copying it into one.
    /// `pushTypeTopics: false` for apps on the legacy binary interface: it sends no topic, so
    /// results and token events keep the app's topic as it is.
    func settledFields(defaults: JobDefaults, appName: String?, pushTypeTopics: Bool = true) throws(JobRejection)
        -> (topic: String, pushType: PushType, priority: NotificationPriority, environment: APNsEnvironment)
    {
        let pushType = pushType ?? defaults.pushType
        try checkRules(pushType: pushType, topicSuffix: pushTypeTopics)
        let topic: String
        if let stated = self.topic {
            topic = stated
        } else if let bundle = defaults.topic {
            // The app's topic is its bundle id: a push type that needs its own topic (`.voip` for
            // VoIP, and so on) gets the suffix, as APNs derives it when a provider omits the topic.
            if pushTypeTopics, let suffix = pushType.requiredTopicSuffix, !bundle.hasSuffix(suffix) {
                topic = bundle + suffix
            } else {
                topic = bundle
            }
        } else {
            let app = appName.map { " and app '\($0)' has no default topic" } ?? ""
            throw named(JobRejection(field: "topic", "no topic: the job has none\(app)"))
        }
        let priority: NotificationPriority
        if pushType == .background, self.priority == nil, defaults.priority == .immediate {
            // The app's default, meant for alerts, gives way to 5: APNs refuses background
            // pushes sent for immediate delivery.
            priority = .powerConsiderate
        } else {
            priority = self.priority ?? defaults.priority
        }
        return (topic, pushType, priority, environment ?? defaults.environment)
    }
}
