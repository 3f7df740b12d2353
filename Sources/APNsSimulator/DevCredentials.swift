import APNsCore
import Crypto
import Foundation
import SwiftASN1
import X509

/// Development credentials for local runs with TLS verification on: a CA, a server
/// certificate for localhost and 127.0.0.1, a client certificate naming its topics (certificate auth), and an
/// ES256 `.p8` signing key with a key id and team id (token auth).
public struct DevCredentials: Sendable {
    /// The summary written as `credentials.json`, which scripts and the demo read.
    public struct Summary: Codable, Sendable, Hashable {
        public var keyID: String
        public var teamID: String
        public var topic: String
        public var signingKeyFile: String
        public var caFile: String
        public var serverCertificateFile: String
        public var serverKeyFile: String
        public var clientCertificateFile: String
        public var clientKeyFile: String
        /// Client certificate and key in one file (what many clients load).
        public var clientBundleFile: String
        /// A simulator config file using these credentials.
        public var simulatorConfigFile: String

        enum CodingKeys: String, CodingKey {
            case keyID = "key_id", teamID = "team_id", topic
            case signingKeyFile = "signing_key_file", caFile = "ca_file"
            case serverCertificateFile = "server_certificate_file", serverKeyFile = "server_key_file"
            case clientCertificateFile = "client_certificate_file", clientKeyFile = "client_key_file"
            case clientBundleFile = "client_bundle_file", simulatorConfigFile = "simulator_config_file"
        }
    }

    public var caCertificatePEM: String
    public var caKeyPEM: String
    public var serverCertificatePEM: String
    public var serverKeyPEM: String
    public var clientCertificatePEM: String
    public var clientKeyPEM: String
    /// The `.p8` ES256 key (PKCS#8 PEM).
    public var signingKeyPEM: String
    public var keyID: String
    public var teamID: String
    public var topic: String

    /// Makes a fresh set. Key id and team id are random 10-character ids unless given.
    public static func generate(keyID: String? = nil, teamID: String? = nil, topic: String = "com.example.app", now: Date = Date()) throws -> DevCredentials {
        let caKey = P256.Signing.PrivateKey()
        let caName = try DistinguishedName {
            OrganizationName("apns-fleet")
            CommonName("apns-fleet development CA")
        }
        let caPublicKey = Certificate.PublicKey(caKey.publicKey)
        let notBefore = now.addingTimeInterval(-3600)
        let notAfter = now.addingTimeInterval(825 * 86400)
        let ca = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: caPublicKey,
            notValidBefore: notBefore,
            notValidAfter: notAfter,
            issuer: caName,
            subject: caName,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                SubjectKeyIdentifier(hash: caPublicKey)
            },
            issuerPrivateKey: Certificate.PrivateKey(caKey)
        )
        let authorityKeyID = AuthorityKeyIdentifier(keyIdentifier: SubjectKeyIdentifier(hash: caPublicKey).keyIdentifier)

        func leaf(
            commonName: String, usage: ExtendedKeyUsage.Usage, names: [GeneralName], extra: Certificate.Extension? = nil
        ) throws -> (Certificate, P256.Signing.PrivateKey) {
            let key = P256.Signing.PrivateKey()
            let publicKey = Certificate.PublicKey(key.publicKey)
            let subject = try DistinguishedName {
                OrganizationName("apns-fleet")
                CommonName(commonName)
            }
            let certificate = try Certificate(
                version: .v3,
                serialNumber: Certificate.SerialNumber(),
                publicKey: publicKey,
                notValidBefore: notBefore,
                notValidAfter: notAfter,
                issuer: caName,
                subject: subject,
                signatureAlgorithm: .ecdsaWithSHA256,
                extensions: try Certificate.Extensions {
                    Critical(BasicConstraints.notCertificateAuthority)
                    Critical(KeyUsage(digitalSignature: true, keyAgreement: true))
                    try ExtendedKeyUsage([usage])
                    SubjectKeyIdentifier(hash: publicKey)
                    authorityKeyID
                    if !names.isEmpty { SubjectAlternativeNames(names) }
                    if let extra { extra }
                },
                issuerPrivateKey: Certificate.PrivateKey(caKey)
            )
            return (certificate, key)
        }

        let (server, serverKey) = try leaf(
            commonName: "localhost",
            usage: .serverAuth,
            names: [.dnsName("localhost"), .ipAddress(ASN1OctetString(contentBytes: [127, 0, 0, 1]))]
        )
        // The client certificate names its topics as Apple's do (extension 1.2.840.113635.100.6.3.6,
        // non-critical): the app, its VoIP and its complication topics.
        let (client, clientKey) = try leaf(
            commonName: "apns-fleet development client (\(topic))",
            usage: .clientAuth,
            names: [],
            extra: try CertificateTopics.makeExtension(Self.clientCertificateTopics(topic))
        )
        let signingKey = P256.Signing.PrivateKey()

        return DevCredentials(
            caCertificatePEM: try ca.serializeAsPEM().pemString + "\n",
            caKeyPEM: caKey.pemRepresentation + "\n",
            serverCertificatePEM: try server.serializeAsPEM().pemString + "\n",
            serverKeyPEM: serverKey.pemRepresentation + "\n",
            clientCertificatePEM: try client.serializeAsPEM().pemString + "\n",
            clientKeyPEM: clientKey.pemRepresentation + "\n",
            signingKeyPEM: signingKey.pemRepresentation + "\n",
            keyID: keyID ?? randomID(),
            teamID: teamID ?? randomID(),
            topic: topic
        )
    }

    /// Writes every file into `directory` (created if needed); private keys get mode 0600.
    @discardableResult
    public func write(to directory: String) throws -> Summary {
        let manager = FileManager.default
        try manager.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
        let summary = Summary(
            keyID: keyID,
            teamID: teamID,
            topic: topic,
            signingKeyFile: "AuthKey_\(keyID).p8",
            caFile: "ca.pem",
            serverCertificateFile: "server.pem",
            serverKeyFile: "server-key.pem",
            clientCertificateFile: "client.pem",
            clientKeyFile: "client-key.pem",
            clientBundleFile: "client-bundle.pem",
            simulatorConfigFile: "simulator.json"
        )
        func put(_ name: String, _ text: String, secret: Bool) throws {
            let path = (directory as NSString).appendingPathComponent(name)
            // Created with the final mode, so a secret is never readable by others, even briefly.
            if manager.fileExists(atPath: path) { try manager.removeItem(atPath: path) }
            guard manager.createFile(atPath: path, contents: Data(text.utf8), attributes: [.posixPermissions: secret ? 0o600 : 0o644]) else {
                throw SimulatorConfigurationError("cannot write \(path)")
            }
        }
        try put(summary.caFile, caCertificatePEM, secret: false)
        try put("ca-key.pem", caKeyPEM, secret: true)
        try put(summary.serverCertificateFile, serverCertificatePEM, secret: false)
        try put(summary.serverKeyFile, serverKeyPEM, secret: true)
        try put(summary.clientCertificateFile, clientCertificatePEM, secret: false)
        try put(summary.clientKeyFile, clientKeyPEM, secret: true)
        try put(summary.clientBundleFile, clientCertificatePEM + clientKeyPEM, secret: true)
        try put(summary.signingKeyFile, signingKeyPEM, secret: true)

        let simulatorConfig: [String: Any] = [
            "certificate_file": summary.serverCertificateFile,
            "private_key_file": summary.serverKeyFile,
            "client_ca_file": summary.caFile,
            "token_keys": [["key_id": keyID, "team_id": teamID, "key_file": summary.signingKeyFile]],
            "team_topics": [teamID: [topic]],
            "certificate_topics": [topic],
        ]
        let configData = try JSONSerialization.data(withJSONObject: simulatorConfig, options: [.prettyPrinted, .sortedKeys])
        try put(summary.simulatorConfigFile, String(decoding: configData, as: UTF8.self) + "\n", secret: false)

        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        try put("credentials.json", String(decoding: try encoder.encode(summary), as: UTF8.self) + "\n", secret: false)
        return summary
    }

    /// Reads `credentials.json` from `directory`.
    public static func readSummary(from directory: String) throws -> Summary {
        let path = (directory as NSString).appendingPathComponent("credentials.json")
        guard let data = FileManager.default.contents(atPath: path) else {
            throw SimulatorConfigurationError("no credentials.json in \(directory); run apns-fleet dev-credentials --out \(directory)")
        }
        return try JSONDecoder().decode(Summary.self, from: data)
    }

    /// A simulator configuration that trusts these credentials (token key, client CA, server identity).
    public func simulatorConfiguration() throws -> APNsSimulatorConfiguration {
        var configuration = APNsSimulatorConfiguration()
        configuration.tls = .init(certificateChainPEM: serverCertificatePEM, privateKeyPEM: serverKeyPEM, clientCAPEM: caCertificatePEM)
        configuration.authentication.tokenKeys = [try ProviderTokenKey(keyID: keyID, teamID: teamID, pem: signingKeyPEM)]
        configuration.authentication.teamTopics = [teamID: [topic]]
        configuration.authentication.certificateTopics = [topic]
        return configuration
    }

    /// The topics of the development client certificate: `topic` (app), `topic.voip` (voip) and
    /// `topic.complication` (complication).
    public static func clientCertificateTopics(_ topic: String) -> [CertificateTopics.Entry] {
        [
            CertificateTopics.Entry(topic: topic, kinds: ["app"]),
            CertificateTopics.Entry(topic: topic + ".voip", kinds: ["voip"]),
            CertificateTopics.Entry(topic: topic + ".complication", kinds: ["complication"]),
        ]
    }

    private static func randomID() -> String {
        let alphabet = Array("ABCDEFGHJKLMNPQRSTUVWXYZ23456789")
        return String((0..<10).map { _ in alphabet[Int.random(in: 0..<alphabet.count)] })
    }
}
