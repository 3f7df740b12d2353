import APNsCore

/// Which kinds of job a generator makes, by weight: "good=80,fanout=4,unregistered=4,…".
public struct JobMix: Sendable, Hashable, CustomStringConvertible {
    public enum Kind: String, Sendable, Hashable, CaseIterable, Comparable {
        /// One good token, JSON envelope.
        case good
        /// One good token, header encoding (the payload is the record value).
        case headers
        /// Several good tokens and one unregistered one, in one envelope.
        case fanout
        /// One token APNs answers 410 Unregistered.
        case unregistered
        /// A token that is not hex: the job is invalid.
        case badToken = "bad-token"
        /// Not JSON at all: invalid, with a job id derived from its offset.
        case malformed
        /// Names an app nobody configured: invalid.
        case unknownApp = "unknown-app"
        /// A payload over APNs's 4096-byte limit: invalid.
        case oversize

        public static func < (lhs: Kind, rhs: Kind) -> Bool {
            allCases.firstIndex(of: lhs) ?? 0 < allCases.firstIndex(of: rhs) ?? 0
        }

        /// Whether the worker refuses the job itself (an `invalid` result and a DLQ copy).
        public var isUnusable: Bool {
            switch self {
            case .badToken, .malformed, .unknownApp, .oversize: true
            case .good, .headers, .fanout, .unregistered: false
            }
        }
    }

    public private(set) var weights: [(kind: Kind, weight: Int)]

    /// A mix for demos and load tests: mostly good jobs, some fan-out, a few dead tokens, and
    /// one of every unusable kind per hundred.
    public static let realistic = JobMix(weights: [
        (.good, 78), (.headers, 8), (.fanout, 4), (.unregistered, 4),
        (.badToken, 2), (.malformed, 2), (.unknownApp, 1), (.oversize, 1),
    ])
    /// Only good single-token jobs, for throughput measurements.
    public static let allGood = JobMix(weights: [(.good, 1)])

    private init(weights: [(kind: Kind, weight: Int)]) {
        self.weights = weights
    }

    /// The largest weight one kind may have.
    public static let largestWeight = 1_000_000

    /// Parses `kind=weight,…`; the error names the part that is wrong.
    public init(parsing text: String) throws(JobMixError) {
        var weights: [(Kind, Int)] = []
        for part in text.split(separator: ",") {
            let pieces = part.split(separator: "=", maxSplits: 1).map { String($0).trimmingWhitespace() }
            guard pieces.count == 2, let kind = Kind(rawValue: pieces[0]) else {
                throw JobMixError("\"\(part)\" is not kind=weight with a kind of \(Kind.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            // Bounded so that the weights' total cannot overflow when the generator draws.
            guard let weight = Int(pieces[1]), (0...Self.largestWeight).contains(weight) else {
                throw JobMixError("the weight of \(kind.rawValue) must be a whole number from 0 to \(Self.largestWeight), not \"\(pieces[1])\"")
            }
            guard !weights.contains(where: { $0.0 == kind }) else { throw JobMixError("\(kind.rawValue) is given twice") }
            weights.append((kind, weight))
        }
        guard weights.contains(where: { $0.1 > 0 }) else { throw JobMixError("at least one weight must be positive") }
        self.weights = weights
    }

    public var description: String { weights.map { "\($0.kind.rawValue)=\($0.weight)" }.joined(separator: ",") }

    public static func == (lhs: JobMix, rhs: JobMix) -> Bool { lhs.description == rhs.description }
    public func hash(into hasher: inout Hasher) { hasher.combine(description) }

    fileprivate var total: Int { weights.reduce(0) { $0 + $1.weight } }

    /// The kind that `draw` (in 0..<total) lands on.
    fileprivate func kind(at draw: Int) -> Kind {
        var remaining = draw
        for (kind, weight) in weights {
            if remaining < weight { return kind }
            remaining -= weight
        }
        return weights.last?.kind ?? .good
    }
}

public struct JobMixError: Error, Sendable, CustomStringConvertible {
    public let description: String
    init(_ message: String) { description = "job mix: \(message)" }
}

/// One generated job: the record to produce and what its results must be.
public struct GeneratedJob: Sendable {
    public var id: String
    public var kind: JobMix.Kind
    public var key: [UInt8]
    public var value: [UInt8]
    public var headers: [RecordHeader]
    /// Each token of the job and the outcome its result must have ("delivered", "rejected/410/Unregistered", "invalid").
    public var expected: [(token: String, outcome: String)]
    /// Milliseconds since the epoch at generation, also carried in the job's `meta.published_at`.
    public var publishedAt: Int64
}

/// Makes jobs of a mix, deterministically from a seed, so a run can be repeated and its expected
/// results are known in advance.
///
/// Good tokens are random; unregistered ones come from a small fixed pool (``deadTokens``) that
/// the simulator is told about, so the same dead token recurs — which exercises the feedback
/// worker's once-per-token rule.
public struct JobGenerator: Sendable {
    public let mix: JobMix
    public let topic: String
    public let app: String?
    public let fanoutSize: Int
    /// The tokens APNs (the simulator) must answer 410 for.
    public let deadTokens: [String]
    /// Good tokens to use instead of random ones (for a real device, say).
    public let fixedTokens: [String]
    /// Every job id starts with this, so a run's results can be told from earlier runs'.
    public let idPrefix: String
    private var random: SplitMix64
    private var sequence = 0
    public private(set) var usedDeadTokens: Set<String> = []

    public init(mix: JobMix, topic: String, app: String? = nil, fanoutSize: Int = 10, deadTokenCount: Int = 100, fixedTokens: [String] = [], idPrefix: String = "job", seed: UInt64 = 0x5EED) {
        self.idPrefix = idPrefix
        self.mix = mix
        self.topic = topic
        self.app = app
        self.fanoutSize = max(2, fanoutSize)
        // Once each: a fan-out job names each of its tokens once (see `.fanout`).
        var seen: Set<String> = []
        self.fixedTokens = fixedTokens.filter { seen.insert($0).inserted }
        var deadRandom = SplitMix64(seed: seed ^ 0xDEAD_BEEF)
        deadTokens = (0..<max(1, deadTokenCount)).map { _ in Self.token(&deadRandom) }
        random = SplitMix64(seed: seed)
    }

    public mutating func next(now: Int64) -> GeneratedJob {
        sequence += 1
        let id = "\(idPrefix)-\(sequence)"
        let kind = mix.kind(at: Int(random.next() % UInt64(mix.total)))
        let meta = #"{"published_at":\#(now)}"#
        let appField = app.map { #","app":"\#($0)""# } ?? ""
        func envelope(_ tokenField: String, payload: String = #"{"aps":{"alert":"Your order shipped"}}"#, app: String = appField) -> [UInt8] {
            Array(#"{"id":"\#(id)",\#(tokenField),"topic":"\#(topic)"\#(app),"payload":\#(payload),"meta":\#(meta)}"#.utf8)
        }
        var job = GeneratedJob(id: id, kind: kind, key: [], value: [], headers: [], expected: [], publishedAt: now)
        switch kind {
        case .good:
            let token = goodToken()
            job.key = Array(token.utf8)
            job.value = envelope(#""token":"\#(token)""#)
            job.expected = [(token, "delivered")]
        case .headers:
            let token = goodToken()
            job.key = Array(token.utf8)
            job.value = Array(#"{"aps":{"alert":"Header-encoded job"}}"#.utf8)
            job.headers = [
                RecordHeader("apns-token", token), RecordHeader("apns-topic", topic), RecordHeader("job-id", id),
                RecordHeader("meta", meta),
            ] + (app.map { [RecordHeader("app", $0)] } ?? [])
            job.expected = [(token, "delivered")]
        case .fanout:
            // Distinct tokens: a job naming one twice gets two results for it, which the tally
            // (one expectation per token) would take for a duplicate and never see complete.
            var tokens: [String]
            if fixedTokens.isEmpty {
                tokens = (0..<(fanoutSize - 1)).map { _ in goodToken() }
            } else {
                let start = Int(random.next() % UInt64(fixedTokens.count))
                tokens = (0..<min(fanoutSize - 1, fixedTokens.count)).map { fixedTokens[(start + $0) % fixedTokens.count] }
            }
            tokens.append(deadToken())
            job.key = Array(id.utf8)
            job.value = envelope(#""tokens":[\#(tokens.map { "\"\($0)\"" }.joined(separator: ","))]"#)
            job.expected = tokens.dropLast().map { ($0, "delivered") } + [(tokens[tokens.count - 1], "rejected/410/Unregistered")]
        case .unregistered:
            let token = deadToken()
            job.key = Array(token.utf8)
            job.value = envelope(#""token":"\#(token)""#)
            job.expected = [(token, "rejected/410/Unregistered")]
        case .badToken:
            let token = "not-a-token-\(sequence)"
            job.key = Array(token.utf8)
            job.value = envelope(#""token":"\#(token)""#)
            // Not a token, so the result cannot name it: it carries an empty token.
            job.expected = [("", "invalid")]
        case .malformed:
            job.key = Array(id.utf8)
            // Nothing readable (a job cut short after its id would keep that id in its result).
            job.value = Array("not JSON: \(id)".utf8)
            job.expected = [("", "invalid")]
        case .unknownApp:
            let token = goodToken()
            job.key = Array(token.utf8)
            job.value = envelope(#""token":"\#(token)""#, app: #","app":"no-such-app""#)
            job.expected = [(token, "invalid")]
        case .oversize:
            let token = goodToken()
            job.key = Array(token.utf8)
            job.value = envelope(#""token":"\#(token)""#, payload: #"{"aps":{"alert":"\#(String(repeating: "x", count: 4200))"}}"#)
            job.expected = [(token, "invalid")]
        }
        return job
    }

    private mutating func goodToken() -> String {
        if !fixedTokens.isEmpty { return fixedTokens[Int(random.next() % UInt64(fixedTokens.count))] }
        return Self.token(&random)
    }

    private mutating func deadToken() -> String {
        let token = deadTokens[Int(random.next() % UInt64(deadTokens.count))]
        usedDeadTokens.insert(token)
        return token
    }

    private static let hexDigits = Array("0123456789abcdef".utf8)

    private static func token(_ random: inout SplitMix64) -> String {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(64)
        for _ in 0..<4 {
            var word = random.next()
            for _ in 0..<16 {
                bytes.append(hexDigits[Int(word & 0xF)])
                word >>= 4
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

extension String {
    func trimmingWhitespace() -> String {
        var slice = Substring(self)
        while slice.first?.isWhitespace == true { slice.removeFirst() }
        while slice.last?.isWhitespace == true { slice.removeLast() }
        return String(slice)
    }
}
