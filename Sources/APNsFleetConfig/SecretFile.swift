import APNsCore
import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Reads secrets and checks key files. Nothing here ever puts file contents into an error.
public enum SecretFile {
    /// The most a secret file may hold: a password is one line, and a path mistyped to a large
    /// file (or `/dev/zero`) must not be read whole.
    static let maximumBytes = 64 * 1024

    /// Reads a small secret file (a password), dropping one trailing newline.
    static func read(_ path: String, key: String) throws(ConfigurationError) -> Secret {
        let data: Data
        do {
            guard let handle = FileHandle(forReadingAtPath: path) else { throw CocoaError(.fileReadNoSuchFile) }
            defer { try? handle.close() }
            data = try handle.read(upToCount: maximumBytes + 1) ?? Data()
        } catch {
            throw ConfigurationError(key: key, "cannot read \(path)")
        }
        guard data.count <= maximumBytes else {
            throw ConfigurationError(key: key, "\(path) is larger than \(maximumBytes / 1024) KiB; a password file holds one line")
        }
        // One line end, as an editor leaves it: "\n" or "\r\n". On bytes: a String sees "\r\n" as
        // one character, which ends neither with "\n" nor with "\r".
        var bytes = data[...]
        if bytes.last == UInt8(ascii: "\n") { bytes.removeLast() }
        if bytes.last == UInt8(ascii: "\r") { bytes.removeLast() }
        guard let text = String(data: bytes, encoding: .utf8) else {
            throw ConfigurationError(key: key, "\(path) is not UTF-8 text")
        }
        guard !text.isEmpty else { throw ConfigurationError(key: key, "\(path) is empty") }
        return Secret(text, file: path)
    }

    /// Warnings for key and password files that other users can read: a leaked .p8 key lets
    /// anyone push to every app of the team.
    public static func permissionWarnings(for configuration: FleetConfiguration) -> [String] {
        var warnings: [String] = []
        for app in configuration.apps {
            var files: [(String, String)] = []
            var password: Secret?
            switch app.authentication {
            case .token(let keyFile, _, _):
                files.append(("app.\(app.name).key-file", keyFile))
            case .certificate(.pem(_, let privateKeyFile, let secret)):
                files.append(("app.\(app.name).private-key-file", privateKeyFile))
                password = secret
            case .certificate(.pkcs12(let file, let secret)):
                files.append(("app.\(app.name).pkcs12-file", file))
                password = secret
            }
            if let file = password?.file { files.append(("app.\(app.name).certificate-password-file", file)) }
            for (key, path) in files {
                if let warning = worldReadableWarning(path: path, key: key) { warnings.append(warning) }
            }
        }
        for (key, path) in [
            ("kafka.ssl.key-file", configuration.kafka.sslKeyFile),
            ("kafka.ssl.key-password-file", configuration.kafka.sslKeyPassword?.file),
            ("kafka.sasl.password-file", configuration.kafka.saslPassword?.file),
        ] {
            if let path, let warning = worldReadableWarning(path: path, key: key) { warnings.append(warning) }
        }
        return warnings
    }

    static func worldReadableWarning(path: String, key: String) -> String? {
        // stat(2), which follows symbolic links: a Kubernetes secret volume mounts each key as a
        // link (mode 777) to the real file, and the link's own mode says nothing.
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        let mode = UInt16(truncatingIfNeeded: info.st_mode)
        guard mode & 0o004 != 0 else { return nil }
        return "\(key): \(path) is readable by every user (mode \(String(mode & 0o777, radix: 8))); run chmod 600 on it"
    }
}

extension KafkaSettings {
    /// Checks now that the TLS files the Kafka clients will load can be read: librdkafka's own
    /// error ("ssl.ca.location failed") names neither the configuration key nor the file.
    public func checkReadableFiles() throws(ConfigurationError) {
        guard securityProtocol.usesTLS else { return }
        for (key, path) in [("kafka.ssl.ca-file", sslCAFile), ("kafka.ssl.certificate-file", sslCertificateFile), ("kafka.ssl.key-file", sslKeyFile)] {
            guard let path else { continue }
            let descriptor = open(path, O_RDONLY)
            guard descriptor >= 0 else {
                throw ConfigurationError(key: key, "cannot read \(path): \(String(cString: strerror(errno)))")
            }
            close(descriptor)
        }
    }
}
