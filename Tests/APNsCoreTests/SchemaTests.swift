import APNsCore
import Foundation
import ProcessLaunch
import Testing

/// The Swift codecs and the published JSON Schemas must agree: the same examples pass and fail
/// both, and what the worker writes validates against the schema analytics reads with.
@Suite("JSON Schemas agree with the codecs")
struct SchemaTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let examples = root.appendingPathComponent("schemas/examples")

    static func files(_ contract: String, _ verdict: String) throws -> [URL] {
        let folder = examples.appendingPathComponent(contract).appendingPathComponent(verdict)
        return try FileManager.default.contentsOfDirectory(at: folder, includingPropertiesForKeys: nil)
            .filter { $0.pathExtension == "json" }
            .sorted { $0.path < $1.path }
    }

    /// Whether the Swift side accepts an example of a contract.
    static func swiftAccepts(_ contract: String, _ bytes: [UInt8]) -> Bool {
        switch contract {
        // Resolved against an app whose topic is its bundle id, as the worker does.
        case "job": (try? JobDecoder().decodeEnvelope(bytes).resolved(defaults: JobDefaults(topic: "com.example.app"))) != nil
        case "result": (try? NotificationResult(decoding: bytes)) != nil
        case "token-event": (try? TokenEvent(decoding: bytes)) != nil
        default: false
        }
    }

    @Test("the Swift codecs accept exactly the valid examples", arguments: ["job", "result", "token-event"])
    func swiftAgrees(contract: String) throws {
        let valid = try Self.files(contract, "valid")
        let invalid = try Self.files(contract, "invalid")
        #expect(!valid.isEmpty && !invalid.isEmpty)
        for file in valid {
            #expect(Self.swiftAccepts(contract, Array(try Data(contentsOf: file))), "\(file.lastPathComponent) should be accepted")
        }
        for file in invalid {
            #expect(!Self.swiftAccepts(contract, Array(try Data(contentsOf: file))), "\(file.lastPathComponent) should be rejected")
        }
    }

    @Test("a standard JSON Schema validator agrees with the example folders")
    func schemasAgree() async throws {
        let (status, output) = try await Self.runChecker([])
        #expect(status == 0, "\(output)")
    }

    @Test("results and token events the Swift code writes validate against their schemas")
    func writtenValuesValidate() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("apns-fleet-schema-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let token = String(repeating: "ab", count: 32)
        let source = SourcePosition(topic: "apns.jobs", partition: 1, offset: 2)
        let results = [
            NotificationResult(jobID: "j", token: token, topic: "t", app: "a", outcome: .delivered, status: 200, apnsID: "x",
                               attempts: 1, latencyMs: 3.25, sentAt: UnixMillis(1_795_341_600_123), worker: "w", meta: RawJSON(#"{"k":1}"#), source: source),
            NotificationResult(jobID: "j", token: "", outcome: .invalid, reason: "payload: payload is missing",
                               attempts: 0, latencyMs: 0, sentAt: UnixMillis(0), worker: "w", source: source),
            NotificationResult(jobID: "j", token: token, topic: "t", outcome: .rejected, status: 410, reason: "Unregistered",
                               unregisteredAt: 1_767_225_600_000, attempts: 2, latencyMs: 40, sentAt: UnixMillis(5), worker: "w", source: source),
        ]
        var resultFiles: [String] = []
        for (index, result) in results.enumerated() {
            let file = directory.appendingPathComponent("result-\(index).json")
            try Data(result.encoded()).write(to: file)
            resultFiles.append(file.path)
        }
        let eventFile = directory.appendingPathComponent("event.json")
        let event = TokenEvent(token: token, topic: "t", app: nil, reason: "Unregistered", invalidatedAt: 1, source: .feedbackService)
        try Data(event.encoded()).write(to: eventFile)

        let (resultStatus, resultOutput) = try await Self.runChecker(["result"] + resultFiles)
        #expect(resultStatus == 0, "\(resultOutput)")
        let (eventStatus, eventOutput) = try await Self.runChecker(["token-event", eventFile.path])
        #expect(eventStatus == 0, "\(eventOutput)")
    }

    static func runChecker(_ arguments: [String]) async throws -> (Int32, String) {
        let process = try LaunchedProcess(
            executable: "/usr/bin/python3", arguments: [root.appendingPathComponent("scripts/check_schemas.py").path] + arguments,
            standardOutput: .pipe, standardError: .standardOutput
        )
        let output = String(decoding: await process.standardOutput?.collect() ?? [], as: UTF8.self)
        return (await process.waitForExit().status, output)
    }
}
