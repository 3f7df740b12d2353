import APNsSimulator
import FleetTestSupport
import Foundation

// Helpers for the suites that run `apns-fleet worker` as a real process beside `kafka-dev`:
// the fleet file, workers whose log lines can be read, and plain HTTP against the admin endpoint.

/// `apns-fleet kafka-dev` with the project's topics, and its bootstrap servers.
struct KafkaDevProcess {
    let process: ChildProcess
    let bootstrap: String

    static func start(binary: String, partitions: Int) async throws -> KafkaDevProcess {
        let process = ChildProcess(binary, ["kafka-dev", "--brokers", "1", "--partitions", String(partitions), "--no-stdin"])
        try process.start()
        do {
            return KafkaDevProcess(process: process, bootstrap: try await process.line(1))
        } catch {
            process.kill()
            throw error
        }
    }
}

/// A fleet file for one app on the simulator (dev credentials written to `directory`).
func writeFleetFile(
    directory: String, summary: DevCredentials.Summary, simulatorPort: Int, bootstrap: String,
    extra: String = ""
) throws -> String {
    let path = (directory as NSString).appendingPathComponent("fleet-\(UUID().uuidString.prefix(8)).yaml")
    try """
        kafka:
          bootstrap-servers: \(bootstrap)
          # The mock cluster rebalances after about session.timeout.ms (PITFALLS.md): keep it short.
          properties: [session.timeout.ms=6000]
        apps: [example]
        app:
          example:
            key-file: \((directory as NSString).appendingPathComponent(summary.signingKeyFile))
            key-id: \(summary.keyID)
            team-id: \(summary.teamID)
            topic: com.example.app
            environment: custom
            host: 127.0.0.1
            port: \(simulatorPort)
            ca-file: \((directory as NSString).appendingPathComponent(summary.caFile))
            connections: 1
        admin:
          port: 0
        \(extra)
        """.write(toFile: path, atomically: true, encoding: .utf8)
    return path
}

/// `apns-fleet worker` with its log (standard error) merged into the lines the test reads. The
/// shell `exec`s the worker, so the child's pid is the worker's and signals reach it directly.
func startWorker(binary: String, config: String, id: String, logLevel: String = "info") throws -> ChildProcess {
    let worker = ChildProcess("/bin/sh", ["-c", #"exec "$0" worker --config "$1" --set "worker.id=$2" --log-level "$3" 2>&1"#, binary, config, id, logLevel])
    try worker.start()
    return worker
}

extension ChildProcess {
    /// The admin port the worker logged ("admin endpoint listening … http://127.0.0.1:PORT").
    func adminPort(timeout: Double = 30) async throws -> Int {
        var port: Int?
        try await waitUntil("the worker's admin endpoint", timeout: timeout) {
            lines.value.contains { $0.contains("admin endpoint listening") }
        }
        for line in lines.value where line.contains("admin endpoint listening") {
            if let range = line.range(of: "http://127.0.0.1:") {
                port = Int(line[range.upperBound...].prefix { $0.isNumber })
            }
        }
        guard let port else { throw TestSetupError("no admin port in: \(lines.value.suffix(5))") }
        return port
    }

    func output(containing text: String) -> [String] { lines.value.filter { $0.contains(text) } }
}

/// One HTTP/1.1 GET to 127.0.0.1, with plain sockets (short and local, so blocking is fine).
func httpGet(port: Int, path: String) throws -> (status: Int, body: String) {
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
    let request = Array("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".utf8)
    guard request.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, 0) }) == request.count else {
        throw TestSetupError("cannot send the request")
    }
    var received: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65_536)
    while true {
        let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if count <= 0 { break }
        received.append(contentsOf: chunk[0..<count])
        // Stop at the end of the body rather than wait for the server to close.
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

/// One sample of Prometheus text exposition.
struct PrometheusSample: Hashable {
    var name: String
    var labels: [String: String]
    var value: Double
}

/// Parses Prometheus text (label values here never hold quotes or commas).
func prometheusSamples(_ text: String) -> [PrometheusSample] {
    var samples: [PrometheusSample] = []
    for line in text.split(separator: "\n") where !line.hasPrefix("#") {
        guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
        let series = line[..<space]
        var labels: [String: String] = [:]
        var name = String(series)
        if let open = series.firstIndex(of: "{"), let close = series.lastIndex(of: "}") {
            name = String(series[..<open])
            for pair in series[series.index(after: open)..<close].split(separator: ",") {
                let parts = pair.split(separator: "=", maxSplits: 1)
                guard parts.count == 2 else { continue }
                labels[String(parts[0])] = parts[1].trimmingCharacters(in: CharacterSet(charactersIn: "\""))
            }
        }
        samples.append(PrometheusSample(name: name, labels: labels, value: value))
    }
    return samples
}
