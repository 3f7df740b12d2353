import SwiftASN1
import X509

/// The push topics a client certificate grants, read from the certificate itself as APNs does.
///
/// Apple's push certificates carry the topics in the extension 1.2.840.113635.100.6.3.6, whose
/// value is a SEQUENCE alternating a UTF8String topic and a SEQUENCE of UTF8String kinds:
///
///     SEQUENCE {
///       UTF8String "com.example.app",      SEQUENCE { UTF8String "app" },
///       UTF8String "com.example.app.voip", SEQUENCE { UTF8String "voip" }
///     }
///
/// Older certificates have no such extension, only the marker 1.2.840.113635.100.6.3.1
/// (development) or .2 (production), and the bundle id in the subject's UID attribute; that UID
/// is then the single topic.
public struct CertificateTopics: Sendable, Hashable {
    /// One topic and the kinds of push it is for (`app`, `voip`, `complication`, ...).
    public struct Entry: Sendable, Hashable {
        public var topic: String
        public var kinds: [String]

        public init(topic: String, kinds: [String]) {
            self.topic = topic
            self.kinds = kinds
        }
    }

    /// Where the topics were found.
    public enum Source: String, Sendable, Hashable {
        /// The topics extension (1.2.840.113635.100.6.3.6).
        case topicsExtension = "topics extension"
        /// The subject's UID attribute (0.9.2342.19200300.100.1.1), of older certificates.
        case subjectUserID = "subject UID"
    }

    /// Apple's topics extension.
    public static let topicsExtensionOID: ASN1ObjectIdentifier = [1, 2, 840, 113_635, 100, 6, 3, 6]
    /// The UID attribute of a distinguished name.
    public static let userIDOID: ASN1ObjectIdentifier = [0, 9, 2342, 19_200_300, 100, 1, 1]

    public var entries: [Entry]
    public var source: Source

    public init(entries: [Entry], source: Source) {
        self.entries = entries
        self.source = source
    }

    /// The topics, in certificate order.
    public var topics: [String] { entries.map(\.topic) }

    /// The topics `certificate` grants: those of its topics extension when it has one, else its
    /// subject UID as the single topic, else nil (it names none).
    ///
    /// Throws `CertificateTopicsError` when the topics extension is present but malformed.
    public static func read(from certificate: Certificate) throws(CertificateTopicsError) -> CertificateTopics? {
        if let topicsExtension = certificate.extensions[oid: topicsExtensionOID] {
            return CertificateTopics(entries: try parseExtensionValue(topicsExtension.value), source: .topicsExtension)
        }
        for rdn in certificate.subject {
            for attribute in rdn where attribute.type == userIDOID {
                if let uid = String(attribute.value), !uid.isEmpty {
                    return CertificateTopics(entries: [Entry(topic: uid, kinds: [])], source: .subjectUserID)
                }
            }
        }
        return nil
    }

    /// Parses the value (the DER inside the extension's OCTET STRING) of a topics extension.
    public static func parseExtensionValue(_ value: ArraySlice<UInt8>) throws(CertificateTopicsError) -> [Entry] {
        do {
            let root = try DER.parse(value)
            let entries = try DER.sequence(root, identifier: .sequence) { nodes in
                var entries: [Entry] = []
                while let topicNode = nodes.next() {
                    let topic = try utf8String(topicNode, what: "topic \(entries.count + 1)")
                    guard !topic.isEmpty else { throw CertificateTopicsError("topic \(entries.count + 1) is empty") }
                    guard let kindsNode = nodes.next() else {
                        throw CertificateTopicsError("topic \"\(topic)\" is not followed by its SEQUENCE of kinds")
                    }
                    let kinds = try DER.sequence(kindsNode, identifier: .sequence) { kindNodes in
                        var kinds: [String] = []
                        while let kindNode = kindNodes.next() {
                            kinds.append(try utf8String(kindNode, what: "kind \(kinds.count + 1) of topic \"\(topic)\""))
                        }
                        return kinds
                    }
                    entries.append(Entry(topic: topic, kinds: kinds))
                }
                return entries
            }
            guard !entries.isEmpty else { throw CertificateTopicsError("the extension names no topic") }
            return entries
        } catch let error as CertificateTopicsError {
            throw error
        } catch {
            throw CertificateTopicsError("not a SEQUENCE of UTF8String topics and SEQUENCEs of kinds (\(error))")
        }
    }

    /// The topics extension for `entries` (non-critical, as in Apple's certificates).
    public static func makeExtension(_ entries: [Entry]) throws -> Certificate.Extension {
        var serializer = DER.Serializer()
        try serializer.appendConstructedNode(identifier: .sequence) { coder in
            for entry in entries {
                try coder.serialize(ASN1UTF8String(entry.topic))
                try coder.appendConstructedNode(identifier: .sequence) { kinds in
                    for kind in entry.kinds { try kinds.serialize(ASN1UTF8String(kind)) }
                }
            }
        }
        return Certificate.Extension(oid: topicsExtensionOID, critical: false, value: serializer.serializedBytes[...])
    }

    private static func utf8String(_ node: ASN1Node, what: String) throws -> String {
        guard node.identifier == .utf8String else {
            throw CertificateTopicsError("\(what) is not a UTF8String (found \(node.identifier))")
        }
        let string = try ASN1UTF8String(derEncoded: node)
        guard let text = String(validating: string.bytes, as: UTF8.self) else {
            throw CertificateTopicsError("\(what) is not valid UTF-8")
        }
        return text
    }
}

/// A topics extension (1.2.840.113635.100.6.3.6) that cannot be read.
public struct CertificateTopicsError: Error, Sendable, Hashable, CustomStringConvertible {
    public let message: String

    public init(_ message: String) {
        self.message = message
    }

    public var description: String { "malformed APNs topics extension (1.2.840.113635.100.6.3.6): \(message)" }
}
