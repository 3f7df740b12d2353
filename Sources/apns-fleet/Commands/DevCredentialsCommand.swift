import APNsCore
import APNsSimulator
import ArgumentParser
import Foundation

/// `apns-fleet dev-credentials`: everything needed for local runs with TLS verification on.
struct DevCredentialsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dev-credentials",
        abstract: "Make a development CA, server and client certificates and an ES256 .p8 key.",
        discussion: """
            Writes into --out: ca.pem (the development CA) and ca-key.pem, server.pem and \
            server-key.pem (for localhost and 127.0.0.1), client.pem, client-key.pem and \
            client-bundle.pem (certificate auth; the certificate names the topic and its .voip \
            and .complication topics in Apple's topics extension), AuthKey_<KEY_ID>.p8 (token auth), \
            simulator.json (a simulator config trusting all of them) and credentials.json \
            (a summary with the key id, team id, topic and file names). Private keys are \
            written with mode 0600. Clients verify the simulator against ca.pem; there is no \
            way to turn verification off.

            With --print-token, prints a fresh provider token (JWT) signed with the key already \
            in --out, for tools such as h2load or curl.

            Example:
              apns-fleet dev-credentials --out ./dev --topic com.example.app   # once (--force replaces)
              apns-fleet simulator --config ./dev/simulator.json --no-single-stream-until-authenticated &
              echo '{"aps":{"alert":"hello"}}' > payload.json
              h2load -n 1000 -m 100 -d payload.json -H "apns-topic: com.example.app" \\
                -H "authorization: bearer $(apns-fleet dev-credentials --out ./dev --print-token)" \\
                http://127.0.0.1:2198/3/device/<64 hex digits>
            """
    )

    @Option(help: "Directory to write the credentials into.")
    var out: String

    @Option(name: .customLong("key-id"), help: "Key id of the signing key. Default: random 10 characters.")
    var keyID: String?

    @Option(name: .customLong("team-id"), help: "Team id. Default: random 10 characters.")
    var teamID: String?

    @Option(help: "The app's topic (bundle id).")
    var topic = "com.example.app"

    @Flag(help: "Replace credentials already in --out.")
    var force = false

    @Flag(name: .customLong("print-token"), help: "Print a fresh provider token from the key in --out instead of making credentials.")
    var printToken = false

    func validate() throws {
        // APNs (and the worker's configuration, and send) take 10 letters or digits.
        try checkAppleIdentifiers(["--key-id": keyID, "--team-id": teamID])
        // It goes into the client certificate's topics extension and the simulator's topic list.
        try check("--topic") { () throws(JobRejection) in _ = try JobRules.topic(topic) }
        // The simulator answers BadTopic to any topic with a space or a non-ASCII byte.
        guard RequestValidator.isWellFormedTopic(topic) else {
            throw ValidationError("--topic must be a bundle id: no spaces or non-ASCII characters, got \(JobRules.quoted(JobRules.clip(topic)))")
        }
    }

    func run() throws {
        if printToken {
            let summary = try DevCredentials.readSummary(from: out)
            let keyPath = (out as NSString).appendingPathComponent(summary.signingKeyFile)
            guard let pem = FileManager.default.contents(atPath: keyPath) else {
                throw UsageError("cannot read \(keyPath)")
            }
            let signer = try ProviderTokenSigner(privateKeyPEM: String(decoding: pem, as: UTF8.self), keyID: summary.keyID, teamID: summary.teamID)
            print(try signer.token(issuedAt: Int64(Date().timeIntervalSince1970)))
            return
        }
        let existing = (out as NSString).appendingPathComponent("credentials.json")
        if FileManager.default.fileExists(atPath: existing), !force {
            throw UsageError("\(out) already holds credentials; pass --force to replace them")
        }
        let credentials = try DevCredentials.generate(keyID: keyID, teamID: teamID, topic: topic)
        let summary = try credentials.write(to: out)
        print("""
            wrote development credentials to \(out)
              key id \(summary.keyID), team id \(summary.teamID), topic \(summary.topic)
              CA: \(summary.caFile); server: \(summary.serverCertificateFile); client: \(summary.clientBundleFile)
              signing key: \(summary.signingKeyFile); simulator config: \(summary.simulatorConfigFile)
            """)
    }
}
