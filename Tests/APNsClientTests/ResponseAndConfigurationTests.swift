import APNsCore
import APNsSimulator
import FleetTestSupport
import Foundation
import NIOCore
import Testing

@testable import APNsClient

@Suite("Responses and configuration", .timeLimit(.minutes(1)))
struct ResponseAndConfigurationTests {
    @Test("Error bodies become a typed reason and the 410 timestamp; unknown reasons are kept")
    func bodies() {
        let gone = APNsConnection.parseBody(ByteBuffer(string: #"{"reason":"Unregistered","timestamp":1767225600123}"#))
        #expect(gone.0 == .unregistered && gone.1 == 1_767_225_600_123)
        let odd = APNsConnection.parseBody(ByteBuffer(string: #"{"reason":"SomethingNew"}"#))
        #expect(odd.0?.rawValue == "SomethingNew" && odd.0?.isKnown == false && odd.1 == nil)
        let junk = APNsConnection.parseBody(ByteBuffer(string: "<html>"))
        #expect(junk.0 == nil && junk.1 == nil)
    }

    @Test("Outcomes feed the delivery policy")
    func attemptResults() {
        let policy = DeliveryPolicy()
        let now = UnixMillis(1_767_225_600_000)
        let delivered = APNsOutcome.answered(APNsResponse(status: 200))
        #expect(policy.after(attempt: 1, result: delivered.attemptResult, now: now, deadline: nil, expiration: nil, jitter: 0) == .finish(.delivered, status: 200, reason: nil))
        let gone = APNsOutcome.answered(APNsResponse(status: 410, reason: .unregistered, timestamp: 1))
        #expect(policy.after(attempt: 1, result: gone.attemptResult, now: now, deadline: nil, expiration: nil, jitter: 0) == .finish(.rejected, status: 410, reason: "Unregistered"))
        let refused = APNsOutcome.notAnswered(APNsNotAnswered(.refusedStream, "the server refused stream 7", certainlyNotProcessed: true))
        #expect(refused.attemptResult == .notAnswered("refused stream: the server refused stream 7"))
        if case .retryInProcess = policy.after(attempt: 1, result: refused.attemptResult, now: now, deadline: nil, expiration: nil, jitter: 0) {} else {
            Issue.record("an unanswered attempt is retried")
        }
    }

    @Test("Missing or wrong credentials are clear errors that name the file, not the key")
    func credentials() throws {
        let directory = temporaryTestPath("apns-client-config")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let missing = directory + "/AuthKey_NOPE.p8"
        #expect(throws: APNsClientError.self) { try APNsAuthentication.loadToken(keyFile: missing, keyID: "ABC123DEFG", teamID: "DEF123GHIJ") }
        do {
            _ = try APNsAuthentication.loadToken(keyFile: missing, keyID: "ABC123DEFG", teamID: "DEF123GHIJ")
        } catch {
            #expect(error.code == .credentials && error.description.contains(missing))
        }
        let secret = "-----BEGIN PRIVATE KEY-----\nTk9UQUtFWQ==\n-----END PRIVATE KEY-----\n"
        let bad = directory + "/bad.p8"
        #expect(FileManager.default.createFile(atPath: bad, contents: Data(secret.utf8)))
        do {
            _ = try APNsAuthentication.loadToken(keyFile: bad, keyID: "ABC123DEFG", teamID: "DEF123GHIJ")
            Issue.record("a broken key was accepted")
        } catch {
            #expect(!error.description.contains("Tk9UQUtFWQ"), "key material never appears in errors")
        }
        #expect(throws: APNsClientError.self) { try APNsAuthentication.loadPEM(certificateFile: missing, privateKeyFile: missing, password: nil) }

        // A path mistyped to a device or a large file is refused before it is read.
        #expect(throws: APNsClientError(.credentials, "the provider token key file /dev/zero is not a regular file")) {
            try APNsAuthentication.loadToken(keyFile: "/dev/zero", keyID: "ABC123DEFG", teamID: "DEF123GHIJ")
        }
        let large = directory + "/backup.tar"
        #expect(FileManager.default.createFile(atPath: large, contents: Data(count: 3 << 20)))
        #expect(throws: APNsClientError(.credentials, "the PKCS#12 bundle \(large) is 3145728 bytes; such files hold a few kilobytes (at most 1024 KiB)")) {
            try APNsAuthentication.loadPKCS12(file: large, password: nil)
        }
        #expect(throws: APNsClientError(.credentials, "the private key file \(directory) is not a regular file")) {
            try APNsAuthentication.loadPEM(certificateFile: bad, privateKeyFile: directory, password: nil)
        }
        // A key mounted as a link to the real file (how Kubernetes mounts secrets) is read.
        let realKey = directory + "/..data-AuthKey.p8"
        #expect(FileManager.default.createFile(atPath: realKey, contents: Data(try DevCredentials.generate().signingKeyPEM.utf8)))
        let linkedKey = directory + "/AuthKey.p8"
        try FileManager.default.createSymbolicLink(atPath: linkedKey, withDestinationPath: realKey)
        _ = try APNsAuthentication.loadToken(keyFile: linkedKey, keyID: "ABC123DEFG", teamID: "DEF123GHIJ")
    }

    @Test("Invalid settings are refused; an app's other environment maps to the other endpoint")
    func settings() throws {
        let signer = try ProviderTokenSigner(privateKeyPEM: try DevCredentials.generate().signingKeyPEM, keyID: "ABC123DEFG", teamID: "DEF123GHIJ")
        var configuration = APNsClientConfiguration(endpoint: .production, authentication: .token(signer))
        configuration.connections = 0
        #expect(throws: APNsClientError.self) { try configuration.validate() }
        configuration.connections = 1
        try configuration.validate()
        configuration.endpoint = .custom(host: "", port: 443, caFile: nil)
        #expect(throws: APNsClientError.self) { try configuration.validate() }
        #expect(APNsClients.environment(of: .sandbox) == .sandbox)
        #expect(APNsClients.environment(of: .custom(host: "h", port: 1, caFile: nil)) == nil)
    }
}
