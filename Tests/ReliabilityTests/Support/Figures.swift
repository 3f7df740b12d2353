import FleetTestSupport
import Foundation

/// The size of a run: small and bounded inside `make test`; bigger with `APNS_FLEET_SOAK=1`
/// (`make soak`).
struct RunScale: Sendable {
    /// Fresh fleets, one after another.
    var runs: Int
    /// Worker kills per run.
    var killsPerRun: Int
    /// Times each fault sequence is repeated per run.
    var faultRounds: Int
    /// Jobs per second the test publishes while faults are injected.
    var rate: Double

    static let isSoak = ProcessInfo.processInfo.environment["APNS_FLEET_SOAK"] == "1"

    static var current: RunScale {
        isSoak ? RunScale(runs: 3, killsPerRun: 6, faultRounds: 3, rate: 200) : RunScale(runs: 1, killsPerRun: 3, faultRounds: 1, rate: 120)
    }

    /// The seed of the random moments (kill times, victims); `APNS_FLEET_RELIABILITY_SEED` repeats a run.
    static var seed: UInt64 {
        ProcessInfo.processInfo.environment["APNS_FLEET_RELIABILITY_SEED"].flatMap { UInt64($0) } ?? 0xC0FF_EE00
    }
}

/// The machine-readable line each suite prints: what was done and what was measured.
struct ReliabilityFigures: Sendable {
    var suite: String
    var runs = 0
    var kills = 0
    /// Kinds of fault injected, and how many faults in all.
    var faults: [String] = []
    var faultsInjected = 0
    var jobs = 0
    var notifications = 0
    var lost = 0
    var duplicates = 0
    var wrongOutcomes = 0
    /// Jobs the test's producer was told were delivered (at an unknown offset) that apns.jobs
    /// never held: not the fleet's input, so not lost by it; see ``UnplacedJobs``.
    var deliveredButAbsent = 0
    var recoveryMs: [Int64] = []
    var peakWorkerRSSMB = 0.0
    var seconds = 0.0

    /// Adds one run's outcome.
    mutating func add(_ outcome: RunOutcome) {
        runs += 1
        jobs += outcome.jobs
        notifications += outcome.notifications
        lost += outcome.lost
        duplicates += outcome.duplicates
        wrongOutcomes += outcome.wrongOutcomes
        deliveredButAbsent += outcome.deliveredButAbsent
        peakWorkerRSSMB = max(peakWorkerRSSMB, outcome.peakWorkerRSSMB)
    }

    var jsonLine: String {
        let sorted = recoveryMs.sorted()
        let median = sorted.isEmpty ? 0 : sorted[(sorted.count - 1) / 2]
        // Built up one key at a time: one big heterogeneous literal is slow to type-check.
        var recovery: [String: Int64] = [:]
        recovery["max"] = sorted.last ?? 0
        recovery["median"] = median
        recovery["count"] = Int64(sorted.count)
        var object: [String: Any] = [:]
        object["suite"] = suite
        object["runs"] = runs
        object["kills"] = kills
        object["faults"] = faults
        object["faults_injected"] = faultsInjected
        object["jobs"] = jobs
        object["notifications"] = notifications
        object["lost"] = lost
        object["duplicates"] = duplicates
        object["wrong_outcomes"] = wrongOutcomes
        object["acked_but_absent_from_jobs_topic"] = deliveredButAbsent
        object["recovery_ms"] = recovery
        object["peak_worker_rss_mb"] = Self.oneDecimal(peakWorkerRSSMB)
        object["seconds"] = Self.oneDecimal(seconds)
        object["soak"] = RunScale.isSoak
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else { return "{}" }
        return String(decoding: data, as: UTF8.self)
    }

    static func oneDecimal(_ value: Double) -> Double {
        let tenths: Double = (value * 10).rounded()
        return tenths / 10
    }

    /// Adds the kinds of fault in `names` not listed yet (in order; broker numbers folded).
    mutating func addFaults(_ names: [String]) {
        for name in names {
            let kind = name.replacingOccurrences(of: #"broker \d+"#, with: "broker N", options: .regularExpression)
            if !faults.contains(kind) { faults.append(kind) }
        }
    }

    /// Prints the line (and appends it to `APNS_FLEET_RELIABILITY_FIGURES`, when set, for the README).
    func report() {
        let line = jsonLine
        print(line)
        if let path = ProcessInfo.processInfo.environment["APNS_FLEET_RELIABILITY_FIGURES"], !path.isEmpty {
            if !FileManager.default.fileExists(atPath: path) { _ = FileManager.default.createFile(atPath: path, contents: nil) }
            if let handle = FileHandle(forWritingAtPath: path) {
                handle.seekToEndOfFile()
                handle.write(Data((line + "\n").utf8))
                try? handle.close()
            }
        }
    }
}

/// SplitMix64: seeded, so a run's kill moments can be repeated from its logged seed.
struct SeededRandom: Sendable {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// Uniform in `range` (milliseconds and the like).
    mutating func next(in range: ClosedRange<Int>) -> Int {
        range.lowerBound + Int(next() % UInt64(range.upperBound - range.lowerBound + 1))
    }
}

/// One HTTP/1.1 request to 127.0.0.1 with plain sockets (short and local, so blocking is fine).
func httpRequest(method: String, port: Int, path: String) throws -> (status: Int, body: String) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw TestSetupError("socket failed") }
    defer { close(fd) }
    var timeout = timeval(tv_sec: 5, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard connected == 0 else { throw TestSetupError("cannot connect to 127.0.0.1:\(port)") }
    let request = Array("\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".utf8)
    guard request.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, 0) }) == request.count else {
        throw TestSetupError("cannot send the request")
    }
    var received: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65_536)
    while true {
        let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if count <= 0 { break }
        received.append(contentsOf: chunk[0..<count])
        if let length = completeLength(received), received.count >= length { break }
    }
    let text = String(decoding: received, as: UTF8.self)
    guard let statusLine = text.split(separator: "\r\n").first, let status = Int(statusLine.split(separator: " ").dropFirst().first ?? "") else {
        throw TestSetupError("no HTTP response from 127.0.0.1:\(port)\(path)")
    }
    let body = text.range(of: "\r\n\r\n").map { String(text[$0.upperBound...]) } ?? ""
    return (status, body)
}

/// The full length of a response whose head has arrived: head plus `content-length`.
private func completeLength(_ bytes: [UInt8]) -> Int? {
    let separator = Array("\r\n\r\n".utf8)
    guard bytes.count >= separator.count,
        let end = (0...(bytes.count - separator.count)).first(where: { bytes[$0..<($0 + separator.count)].elementsEqual(separator) })
    else { return nil }
    let head = String(decoding: bytes[..<end], as: UTF8.self).lowercased()
    guard let line = head.split(separator: "\r\n").first(where: { $0.hasPrefix("content-length:") }),
        let length = Int(line.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces))
    else { return nil }
    return end + separator.count + length
}
