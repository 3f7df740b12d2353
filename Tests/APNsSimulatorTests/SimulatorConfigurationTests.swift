import Foundation
import Testing

@testable import APNsSimulator

@Suite("Simulator configuration file")
struct SimulatorConfigurationTests {
    func apply(_ json: String) throws -> APNsSimulatorConfiguration {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("simulator-config-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("simulator.json").path
        try Data(json.utf8).write(to: URL(fileURLWithPath: path))
        var configuration = APNsSimulatorConfiguration()
        configuration.listeners.http2CleartextPort = 2198
        configuration.listeners.adminPort = 9197
        let (file, base) = try APNsSimulatorConfigFile.load(path: path)
        try file.apply(to: &configuration, relativeTo: base, now: 1_767_225_600)
        return configuration
    }

    @Test("-1 turns a listener off, as the docs say (it was kept, and the simulator tried to bind port -1)")
    func negativePortsTurnListenersOff() throws {
        let configuration = try apply(#"{"h2c_port": -1, "admin_port": -1}"#)
        #expect(configuration.listeners.http2CleartextPort == nil)
        #expect(configuration.listeners.adminPort == nil)
        #expect(try apply("{}").listeners.adminPort == 9197)
    }

    @Test("a file without a certificate applies (the command drops the TLS ports later), and validates once they are off")
    func noCertificate() throws {
        var configuration = try apply(#"{"admin_port": -1}"#)
        configuration.listeners.http2TLSPort = 2197
        #expect(throws: SimulatorConfigurationError.self) { try configuration.validate() }
        configuration.listeners.http2TLSPort = nil
        try configuration.validate()
    }

    @Test(
        "values that would crash the simulator or quietly mean something else are refused at start, naming the setting",
        arguments: [
            (#"{"h2c_port": 70000}"#, "h2c port must be 0 to 65535"),
            (#"{"latency_ms": 9223372036854775}"#, "latency_ms must be between 0 and a day"),
            (#"{"latency_ms": -5}"#, "latency_ms must be between 0 and a day"),
            (#"{"per_device_limit": 5, "per_device_window_ms": -1}"#, "per_device_window_ms must be positive"),
            (#"{"idle_timeout_seconds": 0}"#, "idle_timeout_seconds must be positive"),
            (#"{"max_token_age_seconds": 0}"#, "max_token_age_seconds must be positive"),
            (#"{"team_topics": {"TEAM000001": []}}"#, "an empty list would grant every topic"),
        ]
    )
    func dangerousValues(json: String, message: String) throws {
        do {
            try apply(json).validate()
            Issue.record("\(json) was accepted")
        } catch let error as SimulatorConfigurationError {
            #expect(error.description.contains(message), "\(error)")
        }
    }

    @Test("environment: development makes the simulator answer as APNs's development server; production is the default")
    func environment() throws {
        #expect(try apply(#"{"environment": "development"}"#).behaviour.development)
        #expect(try !apply(#"{"environment": "production"}"#).behaviour.development)
        #expect(try !apply("{}").behaviour.development)
        #expect(try apply(#"{"environment": "sandbox"}"#).behaviour.development, "the fleet's name for it")
        #expect(throws: SimulatorConfigurationError.self) { try apply(#"{"environment": "staging"}"#) }
    }

    @Test("a misspelt setting is refused, not silently left at its default")
    func unknownSetting() {
        #expect(throws: SimulatorConfigurationError.self) { try apply(#"{"certificat_file": "server.pem"}"#) }
    }

    @Test("a GOAWAY reason that would break GOAWAY's JSON is refused at start")
    func goAwayReason() throws {
        #expect(throws: SimulatorConfigurationError.self) { try apply(#"{"goaway_reason": "Shut \"down\""}"#).validate() }
        #expect(try apply(#"{"goaway_reason": "Maintenance"}"#).behaviour.goAwayReason == "Maintenance")
    }

    @Test("token keys are matched lowercased: the file's are lowercased, and an uppercase one set through the library is refused rather than never matching")
    func tokenKeysAreLowercase() throws {
        let upper = String(repeating: "AB", count: 32)
        let fromFile = try apply(#"{"unregistered_tokens": {"\#(upper)": 1767225600000}, "device_topics": {"\#(upper)": "com.example.app"}}"#)
        try fromFile.validate()
        #expect(fromFile.behaviour.unregisteredTokens.keys.sorted() == [upper.lowercased()])
        #expect(fromFile.behaviour.deviceTopics.keys.sorted() == [upper.lowercased()])
        var direct = APNsSimulatorConfiguration()
        direct.listeners.http2CleartextPort = 2198
        direct.behaviour.unregisteredTokens[upper] = 1_767_225_600_000
        #expect((#expect(throws: SimulatorConfigurationError.self) { try direct.validate() })?.message == "unregistered token ABABABABABABABAB… is not 64 to 200 lowercase hex digits")
        direct.behaviour.unregisteredTokens = [:]
        direct.behaviour.deviceTopics[upper] = "com.example.app"
        #expect((#expect(throws: SimulatorConfigurationError.self) { try direct.validate() })?.message == "device_topics token ABABABABABABABAB… is not 64 to 200 lowercase hex digits")
        direct.behaviour.deviceTopics = [upper.lowercased(): "com.example.app"]
        try direct.validate()
    }
}
