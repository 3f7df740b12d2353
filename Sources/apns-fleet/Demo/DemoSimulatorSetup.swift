import APNsSimulator
import FleetLoad
import Foundation

/// The demo's local APNs: development credentials (made once, kept in the demo directory), a
/// simulator configuration that knows the generator's dead tokens, and the fleet configuration
/// that points the workers at it.
struct DemoSimulatorSetup {
    let credentialsDirectory: String
    let summary: DevCredentials.Summary
    let generator: JobGenerator
    let simulatorConfigPath: String
    private let demoDirectory: String

    init(directory: String, runID: String, mix: JobMix) throws {
        demoDirectory = directory
        (credentialsDirectory, summary) = try Self.credentials(in: directory)
        generator = JobGenerator(mix: mix, topic: summary.topic, app: "demo", idPrefix: "demo-\(runID)")

        // The credentials' simulator config, plus the dead tokens (answered 410 with a fixed time).
        let base = (credentialsDirectory as NSString).appendingPathComponent(summary.simulatorConfigFile)
        guard let data = FileManager.default.contents(atPath: base),
            var config = try JSONSerialization.jsonObject(with: data) as? [String: Any]
        else {
            throw UsageError("cannot read \(base); delete \(credentialsDirectory) to make new credentials")
        }
        let unregisteredAt = Int64(Date().timeIntervalSince1970 * 1000) - 86_400_000
        config["unregistered_tokens"] = Dictionary(uniqueKeysWithValues: generator.deadTokens.map { ($0, unregisteredAt) })
        simulatorConfigPath = (credentialsDirectory as NSString).appendingPathComponent("demo-simulator.json")
        let output = try JSONSerialization.data(withJSONObject: config, options: [.prettyPrinted, .sortedKeys])
        guard FileManager.default.createFile(atPath: simulatorConfigPath, contents: output) else {
            throw CommandFailure("cannot write \(simulatorConfigPath)")
        }
    }

    /// Development credentials under `directory/credentials`, made on first use and kept.
    static func credentials(in directory: String) throws -> (directory: String, summary: DevCredentials.Summary) {
        let credentialsDirectory = (directory as NSString).appendingPathComponent("credentials")
        if FileManager.default.fileExists(atPath: (credentialsDirectory as NSString).appendingPathComponent("credentials.json")) {
            return (credentialsDirectory, try DevCredentials.readSummary(from: credentialsDirectory))
        }
        FileHandle.standardError.write(Data("Making development credentials in \(credentialsDirectory) (first run)\n".utf8))
        return (credentialsDirectory, try DevCredentials.generate(topic: "com.example.app").write(to: credentialsDirectory))
    }

    /// Writes `fleet.yaml` for the workers and returns the arguments that use it.
    func writeFleetConfiguration(bootstrap: String, simulatorPort: Int, embeddedKafka: Bool) throws -> [String] {
        func path(_ file: String) -> String { (credentialsDirectory as NSString).appendingPathComponent(file) }
        // The mock cluster answers a Fetch only when fetch.wait.max.ms has passed, even when records
        // arrive meanwhile (a real broker answers at once): with the default 500 ms every job
        // would wait up to half a second in Kafka. Real brokers keep librdkafka's default.
        let properties = embeddedKafka ? "session.timeout.ms=6000, fetch.wait.max.ms=10" : "session.timeout.ms=6000"
        let yaml = """
            # Written by `apns-fleet demo`: one app on the local APNs simulator. See docs/configuration.md.
            kafka:
              bootstrap-servers: \(bootstrap)
              # A short session timeout: faster rebalances when a worker stops.
              properties: [\(properties)]
            apps: [demo]
            app:
              demo:
                auth: token
                key-file: \(path(summary.signingKeyFile))
                key-id: \(summary.keyID)
                team-id: \(summary.teamID)
                topic: \(summary.topic)
                environment: custom
                host: 127.0.0.1
                port: \(simulatorPort)
                ca-file: \(path(summary.caFile))
                connections: 2
            worker:
              drain-timeout-seconds: 15

            """
        let file = (demoDirectory as NSString).appendingPathComponent("fleet.yaml")
        guard FileManager.default.createFile(atPath: file, contents: Data(yaml.utf8)) else {
            throw CommandFailure("cannot write \(file)")
        }
        return ["--config", file]
    }
}
