import APNsCore
import Crypto
import Foundation
import SwiftASN1
import Testing
import X509

@testable import APNsSimulator

/// DER built by hand (short lengths only), independent of the code under test.
enum HandDER {
    static func utf8(_ text: String) -> [UInt8] { node(0x0C, Array(text.utf8)) }
    static func sequence(_ content: [UInt8]...) -> [UInt8] { node(0x30, content.flatMap { $0 }) }
    static func integer(_ value: UInt8) -> [UInt8] { node(0x02, [value]) }

    static func node(_ tag: UInt8, _ content: [UInt8]) -> [UInt8] {
        precondition(content.count < 128, "hand-built DER uses short lengths only")
        return [tag, UInt8(content.count)] + content
    }
}

/// Client certificates issued by the dev CA, with whatever subject and extra extensions a test needs.
enum TestClientCertificate {
    static func issue(
        by credentials: DevCredentials,
        commonName: String = "apns-fleet test client",
        userID: String? = nil,
        extra: [Certificate.Extension] = []
    ) throws -> (certificatePEM: String, keyPEM: String) {
        let ca = try Certificate(pemEncoded: credentials.caCertificatePEM)
        let caKey = try P256.Signing.PrivateKey(pemRepresentation: credentials.caKeyPEM)
        let key = P256.Signing.PrivateKey()
        let publicKey = Certificate.PublicKey(key.publicKey)
        var attributes = [
            RelativeDistinguishedName.Attribute(type: ASN1ObjectIdentifier.RDNAttributeType.organizationName, utf8String: "apns-fleet"),
            RelativeDistinguishedName.Attribute(type: ASN1ObjectIdentifier.RDNAttributeType.commonName, utf8String: commonName),
        ]
        if let userID { attributes.append(RelativeDistinguishedName.Attribute(type: CertificateTopics.userIDOID, utf8String: userID)) }
        let now = Date()
        let certificate = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: publicKey,
            notValidBefore: now.addingTimeInterval(-3600),
            notValidAfter: now.addingTimeInterval(86400),
            issuer: ca.subject,
            subject: try DistinguishedName(attributes),
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true, keyAgreement: true))
                try ExtendedKeyUsage([.clientAuth])
                for item in extra { item }
            },
            issuerPrivateKey: Certificate.PrivateKey(caKey)
        )
        return (try certificate.serializeAsPEM().pemString + "\n", key.pemRepresentation + "\n")
    }
}

@Suite("Certificate topics: the extension parser and certificate auth over mTLS", .serialized, .timeLimit(.minutes(3)))
struct CertificateTopicsTests {
    static let good = String(repeating: "ab", count: 32)

    // MARK: Parser

    @Test("a hand-built topics extension: topics and kinds, in order")
    func parsesHandBuiltExtension() throws {
        let value = HandDER.sequence(
            HandDER.utf8("com.example.app"), HandDER.sequence(HandDER.utf8("app")),
            HandDER.utf8("com.example.app.voip"), HandDER.sequence(HandDER.utf8("voip")),
            HandDER.utf8("com.example.app.complication"), HandDER.sequence(HandDER.utf8("complication"), HandDER.utf8("app")),
            HandDER.utf8("com.example.bare"), HandDER.sequence()
        )
        let entries = try CertificateTopics.parseExtensionValue(value[...])
        #expect(entries == [
            CertificateTopics.Entry(topic: "com.example.app", kinds: ["app"]),
            CertificateTopics.Entry(topic: "com.example.app.voip", kinds: ["voip"]),
            CertificateTopics.Entry(topic: "com.example.app.complication", kinds: ["complication", "app"]),
            CertificateTopics.Entry(topic: "com.example.bare", kinds: []),
        ])
        // What dev-credentials writes is the same encoding.
        let written = try CertificateTopics.makeExtension(Array(entries.prefix(3)))
        #expect(written.oid == CertificateTopics.topicsExtensionOID)
        #expect(!written.critical)
        let expected = HandDER.sequence(
            HandDER.utf8("com.example.app"), HandDER.sequence(HandDER.utf8("app")),
            HandDER.utf8("com.example.app.voip"), HandDER.sequence(HandDER.utf8("voip")),
            HandDER.utf8("com.example.app.complication"), HandDER.sequence(HandDER.utf8("complication"), HandDER.utf8("app"))
        )
        #expect(Array(written.value) == expected)
    }

    @Test(
        "a malformed topics extension is an error",
        arguments: [
            ("not DER", [0xFF, 0x01, 0x02]),
            ("truncated", Array(HandDER.sequence(HandDER.utf8("com.example.app"), HandDER.sequence(HandDER.utf8("app"))).dropLast())),
            ("trailing bytes", HandDER.sequence(HandDER.utf8("a.b"), HandDER.sequence()) + [0x00]),
            ("not a SEQUENCE", HandDER.utf8("com.example.app")),
            ("empty", HandDER.sequence()),
            ("topic not a UTF8String", HandDER.sequence(HandDER.integer(7), HandDER.sequence(HandDER.utf8("app")))),
            ("topic without kinds", HandDER.sequence(HandDER.utf8("com.example.app"))),
            ("kinds not a SEQUENCE", HandDER.sequence(HandDER.utf8("com.example.app"), HandDER.utf8("app"))),
            ("kind not a UTF8String", HandDER.sequence(HandDER.utf8("com.example.app"), HandDER.sequence(HandDER.integer(1)))),
            ("empty topic", HandDER.sequence(HandDER.utf8(""), HandDER.sequence(HandDER.utf8("app")))),
            ("invalid UTF-8", HandDER.sequence(HandDER.node(0x0C, [0xC3, 0x28]), HandDER.sequence(HandDER.utf8("app")))),
        ] as [(String, [UInt8])]
    )
    func rejectsMalformedExtension(_ name: String, _ value: [UInt8]) {
        #expect(throws: CertificateTopicsError.self, "\(name)") { try CertificateTopics.parseExtensionValue(value[...]) }
    }

    @Test("a certificate's topics: the extension first, then the subject UID, else none")
    func readsCertificate() throws {
        let credentials = try DevCredentials.generate(topic: "com.example.app")
        let dev = try CertificateTopics.read(from: try Certificate(pemEncoded: credentials.clientCertificatePEM))
        #expect(dev?.source == .topicsExtension)
        #expect(dev?.entries == [
            CertificateTopics.Entry(topic: "com.example.app", kinds: ["app"]),
            CertificateTopics.Entry(topic: "com.example.app.voip", kinds: ["voip"]),
            CertificateTopics.Entry(topic: "com.example.app.complication", kinds: ["complication"]),
        ])

        let both = try TestClientCertificate.issue(
            by: credentials, userID: "com.example.uid",
            extra: [try CertificateTopics.makeExtension([.init(topic: "com.example.ext", kinds: ["app"])])]
        )
        #expect(try CertificateTopics.read(from: try Certificate(pemEncoded: both.certificatePEM))?.topics == ["com.example.ext"])

        let uid = try CertificateTopics.read(from: try Certificate(pemEncoded: try TestClientCertificate.issue(by: credentials, userID: "com.example.uid").certificatePEM))
        #expect(uid == CertificateTopics(entries: [.init(topic: "com.example.uid", kinds: [])], source: .subjectUserID))

        #expect(try CertificateTopics.read(from: try Certificate(pemEncoded: try TestClientCertificate.issue(by: credentials).certificatePEM)) == nil)

        let malformed = try TestClientCertificate.issue(
            by: credentials, userID: "com.example.uid",
            extra: [Certificate.Extension(oid: CertificateTopics.topicsExtensionOID, critical: false, value: HandDER.utf8("com.example.app")[...])]
        )
        #expect(throws: CertificateTopicsError.self) { try CertificateTopics.read(from: try Certificate(pemEncoded: malformed.certificatePEM)) }
    }

    // MARK: End to end

    /// One request over TLS with `certificate` as the client certificate (nghttp `--cert`/`--key`).
    static func request(
        port: Int, certificate: (certificatePEM: String, keyPEM: String), headers: [String: String], credentials: TestCredentials
    ) async throws -> SimulatorIntegrationTests.Answer {
        let name = UUID().uuidString
        let certificateFile = credentials.path("client-\(name).pem")
        let keyFile = credentials.path("client-\(name)-key.pem")
        try certificate.certificatePEM.write(toFile: certificateFile, atomically: true, encoding: .utf8)
        try certificate.keyPEM.write(toFile: keyFile, atomically: true, encoding: .utf8)
        return try await SimulatorIntegrationTests.nghttpRequest(
            "https://localhost:\(port)/3/device/\(good)",
            headers: headers,
            options: ["--cert=\(certificateFile)", "--key=\(keyFile)"],
            directory: credentials.directory
        )
    }

    @Test("mTLS with no certificate_topics configured: the dev certificate's topics decide")
    func certificateTopicsOverMTLS() async throws {
        let credentials = try TestCredentials.make()
        defer { credentials.remove() }
        try await withSimulator(credentials, { $0.authentication.certificateTopics = [] }) { simulator in
            let port = try #require(simulator.port(.http2TLS))
            let client = (credentials.credentials.clientCertificatePEM, credentials.credentials.clientKeyPEM)
            struct Case {
                let name: String
                let headers: [String: String]
                let status: Int
                let reason: String?
            }
            let cases = [
                Case(name: "granted topic", headers: ["apns-topic": "com.example.app"], status: 200, reason: nil),
                Case(name: "granted VoIP topic", headers: ["apns-topic": "com.example.app.voip", "apns-push-type": "voip"], status: 200, reason: nil),
                Case(name: "another topic", headers: ["apns-topic": "com.example.other"], status: 400, reason: "TopicDisallowed"),
                Case(name: "no topic, three topics in the certificate", headers: [:], status: 400, reason: "MissingTopic"),
            ]
            for item in cases {
                let answer = try await Self.request(port: port, certificate: client, headers: item.headers, credentials: credentials)
                #expect(answer.status == item.status, "\(item.name): \(answer)")
                #expect(answer.reason == item.reason, "\(item.name): \(answer)")
            }
            let connections = simulator.counters.snapshot().connections
            #expect(connections.count == cases.count)
            #expect(connections.allSatisfy { $0.authentication == "certificate" }, "\(connections.map(\.authentication))")
        }
    }

    @Test("mTLS: a single topic is implied, the UID is the topic of older certificates, config is the fallback, a malformed extension is 403 BadCertificate")
    func precedenceOverMTLS() async throws {
        let credentials = try TestCredentials.make()
        defer { credentials.remove() }
        try await withSimulator(credentials, { $0.authentication.certificateTopics = ["com.example.configured"] }) { simulator in
            let port = try #require(simulator.port(.http2TLS))
            let dev = credentials.credentials
            let single = try TestClientCertificate.issue(
                by: dev, userID: "com.example.ignored",
                extra: [try CertificateTopics.makeExtension([.init(topic: "com.example.single", kinds: ["app"])])]
            )
            let legacy = try TestClientCertificate.issue(by: dev, userID: "com.example.legacy")
            let plain = try TestClientCertificate.issue(by: dev)
            let malformed = try TestClientCertificate.issue(
                by: dev,
                extra: [Certificate.Extension(oid: CertificateTopics.topicsExtensionOID, critical: false, value: HandDER.sequence(HandDER.utf8("com.example.app"))[...])]
            )
            struct Case {
                let name: String
                let certificate: (certificatePEM: String, keyPEM: String)
                let headers: [String: String]
                let status: Int
                let reason: String?
            }
            let cases = [
                Case(name: "single topic implied", certificate: single, headers: [:], status: 200, reason: nil),
                Case(name: "single topic, UID and config not granted", certificate: single, headers: ["apns-topic": "com.example.ignored"], status: 400, reason: "TopicDisallowed"),
                Case(name: "UID implied", certificate: legacy, headers: [:], status: 200, reason: nil),
                Case(name: "UID, config not granted", certificate: legacy, headers: ["apns-topic": "com.example.configured"], status: 400, reason: "TopicDisallowed"),
                // A single-topic certificate grants its bundle id, not the push-type topics beside it.
                Case(name: "UID, its VoIP topic", certificate: legacy, headers: ["apns-topic": "com.example.legacy.voip", "apns-push-type": "voip"], status: 400, reason: "TopicDisallowed"),
                Case(name: "UID, VoIP implied", certificate: legacy, headers: ["apns-push-type": "voip"], status: 400, reason: "BadTopic"),
                Case(name: "config fallback", certificate: plain, headers: ["apns-topic": "com.example.configured"], status: 200, reason: nil),
                Case(name: "config fallback, other topic", certificate: plain, headers: ["apns-topic": "com.example.app"], status: 400, reason: "TopicDisallowed"),
                Case(name: "malformed extension", certificate: malformed, headers: ["apns-topic": "com.example.app"], status: 403, reason: "BadCertificate"),
                Case(name: "malformed extension, no topic", certificate: malformed, headers: [:], status: 403, reason: "BadCertificate"),
            ]
            for item in cases {
                let answer = try await Self.request(port: port, certificate: item.certificate, headers: item.headers, credentials: credentials)
                #expect(answer.status == item.status, "\(item.name): \(answer)")
                #expect(answer.reason == item.reason, "\(item.name): \(answer)")
            }
            #expect(simulator.counters.snapshot().count(reason: "BadCertificate") == 2)
        }
    }
}
