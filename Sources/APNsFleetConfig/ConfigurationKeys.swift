/// One documented configuration key. The catalogue below is the single source of truth: the
/// decoder reads these keys, and a test checks that `docs/configuration.md` documents each.
public struct ConfigurationKey: Sendable, Hashable {
    public var name: String
    public var type: String
    public var defaultValue: String
    public var summary: String
    public var isSecret: Bool

    init(_ name: String, _ type: String, _ defaultValue: String, _ summary: String, secret: Bool = false) {
        self.name = name
        self.type = type
        self.defaultValue = defaultValue
        self.summary = summary
        self.isSecret = secret
    }

    /// The environment variable that sets this key (`<name>` stays a placeholder for app keys).
    public var environmentName: String {
        let parts = name.split(separator: ".", maxSplits: 2)
        guard parts.count == 3, parts[1] == "<name>" else { return ConfigurationLoader.environmentName(for: name) }
        return ConfigurationLoader.environmentName(for: String(parts[0])) + "_<NAME>_" + ConfigurationLoader.bareEnvironmentName(for: String(parts[2]))
    }
}

public enum ConfigurationKeys {
    public static let all: [ConfigurationKey] = [
        // Kafka
        .init("kafka.bootstrap-servers", "string", "127.0.0.1:9092", "Comma-separated Kafka brokers: host:port, [IPv6]:port, or scheme://host:port with the scheme of kafka.security-protocol; no spaces, no credentials. A port out of range, an unbracketed IPv6 address or another scheme stops the worker at start (librdkafka would never connect)."),
        .init("kafka.group-id", "string", "apns-fleet-push", "Consumer group of the push workers."),
        .init("kafka.feedback-group-id", "string", "apns-fleet-feedback", "Consumer group of the feedback worker."),
        .init("kafka.security-protocol", "plaintext | ssl | sasl_plaintext | sasl_ssl", "plaintext", "How clients talk to the brokers."),
        .init("kafka.sasl.mechanism", "PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512", "(none)", "SASL mechanism; required with a sasl_* protocol."),
        .init("kafka.sasl.username", "string", "(none)", "SASL user name."),
        .init("kafka.sasl.password", "secret string", "(none)", "SASL password; prefer kafka.sasl.password-file.", secret: true),
        .init("kafka.sasl.password-file", "path", "(none)", "File whose contents (trailing newline removed) are the SASL password."),
        .init("kafka.ssl.ca-file", "path", "(system roots)", "CA bundle that signs the brokers' certificates."),
        .init("kafka.ssl.certificate-file", "path", "(none)", "Client certificate (PEM) for mutual TLS with the brokers."),
        .init("kafka.ssl.key-file", "path", "(none)", "Client private key (PEM) for mutual TLS with the brokers."),
        .init("kafka.ssl.key-password", "secret string", "(none)", "Password of kafka.ssl.key-file; prefer kafka.ssl.key-password-file.", secret: true),
        .init("kafka.ssl.key-password-file", "path", "(none)", "File whose contents (trailing newline removed) are the password of kafka.ssl.key-file."),
        .init("kafka.properties", "list of name=value", "(none)", "Extra librdkafka properties, passed through; they win over the keys above. Refused, with the reason: those the delivery guarantees rest on (enable.idempotence, enable.auto.offset.store, enable.auto.commit, group.id, enable.partition.eof, delivery.report.only.error, offset.store.method), those with keys of their own (security.protocol, bootstrap.servers), auto.commit.interval.ms outside 1 to 300000 and a max.poll.interval.ms that is not positive."),
        // Topics
        .init("topics.jobs", "string", "apns.jobs", "Input topic of notification jobs."),
        .init("topics.retry", "string", "apns.jobs.retry", "Delayed retries."),
        .init("topics.dlq", "string", "apns.jobs.dlq", "Jobs that can never be sent, as the original bytes."),
        .init("topics.results", "string", "apns.results", "One result per notification."),
        .init("topics.token-events", "string", "apns.token-events", "Dead tokens (log-compacted)."),
        // Apps
        .init("apps", "list of names", "(none)", "The credential sets; each name has the app.<name>.* keys below."),
        .init("default-app", "string", "(the only app)", "App for jobs that name none and whose topic maps to none; also for those whose topic several apps share as their topic, if it is one of them."),
        .init("app.<name>.auth", "token | certificate", "token", "How this app authenticates to APNs."),
        .init("app.<name>.key-file", "path", "(required for token)", "The .p8 signing key (ES256). Never logged; warned about when world-readable."),
        .init("app.<name>.key-id", "10 characters", "(required for token)", "The key's id (JWT kid)."),
        .init("app.<name>.team-id", "10 characters", "(required for token)", "The developer team id (JWT iss)."),
        .init("app.<name>.certificate-file", "path", "(none)", "Client certificate, PEM (certificate auth)."),
        .init("app.<name>.private-key-file", "path", "(none)", "Client private key, PEM (certificate auth)."),
        .init("app.<name>.pkcs12-file", "path", "(none)", "Client certificate and key as PKCS#12 (certificate auth)."),
        .init("app.<name>.certificate-password", "secret string", "(none)", "Password of the PEM key or PKCS#12 bundle; prefer certificate-password-file.", secret: true),
        .init("app.<name>.certificate-password-file", "path", "(none)", "File whose contents (trailing newline removed) are the certificate password."),
        .init("app.<name>.topic", "string", "(none)", "Default apns-topic for this app's jobs: its bundle id (a push type that needs a suffix, such as `.voip`, gets it appended)."),
        .init("app.<name>.topics", "list of strings", "(none)", "Topics routed to this app when a job names no app."),
        .init("app.<name>.push-type", "push type", "alert", "Default apns-push-type."),
        .init("app.<name>.priority", "10 | 5 | 1", "10", "Default apns-priority."),
        .init("app.<name>.environment", "production | sandbox | custom", "production", "Which APNs: Apple's production or sandbox, or a custom host (a simulator)."),
        .init("app.<name>.environments", "list of production, sandbox", "(its environment)", "Environments this app's jobs may pick with their environment field; each gets a pool of app.<name>.connections. Must include the app's environment; not for custom or binary."),
        .init("app.<name>.host", "string", "(required for custom)", "APNs host for environment custom."),
        .init("app.<name>.port", "integer", "443", "APNs port for environment custom: 1 to 65535."),
        .init("app.<name>.ca-file", "path", "(system roots)", "CA that signs the certificate of the custom host and of the legacy endpoints; refused when none of them is set. TLS verification is never off."),
        .init("app.<name>.connections", "1-64", "2", "Long-lived connections per worker for this app: HTTP/2 connections, or binary gateway connections for protocol binary. Each adds 1,000 to the default worker.max-in-flight."),
        .init("app.<name>.protocol", "http2 | binary", "http2", "Transport: the HTTP/2 provider API, or the legacy binary interface (certificate auth)."),
        .init("app.<name>.legacy-gateway", "host:port", "(none; required for protocol binary)", "Legacy binary gateway, for protocol binary only (Apple closed its own in March 2021: a simulator or your own gateway). An IPv6 address goes in brackets, and then in quotes in YAML: '[::1]:2195'."),
        .init("app.<name>.legacy-feedback", "host:port", "(none)", "Legacy feedback service, polled by the feedback worker (Apple closed its own in March 2021)."),
        .init("app.<name>.legacy-tls", "bool", "true", "Whether the legacy endpoints use TLS (false only for local tests); refused without a legacy endpoint."),
        .init("app.<name>.legacy-format", "enhanced | simple", "enhanced", "Binary interface format: enhanced (command 1, identifiers and expiry) or simple (command 0); protocol binary only."),
        .init("app.<name>.legacy-quiet-period-ms", "10-60000", "1000", "Silence from the gateway after which a binary notification counts as delivered; at least 1 s below worker.request-timeout-seconds; protocol binary only. Below 500 towards a gateway on another host, a warning: error-responses slower than that cannot be attributed."),
        .init("app.<name>.legacy-error-reconnects-per-second", "1-1000", "5", "After a burst of ten, how many reconnects a second per connection follow error-responses that blame a notification (an invalid token closes the connection): a stale token list is handled this fast; Apple treats rapid reconnects as an attack. Protocol binary only."),
        // Worker
        .init("worker.id", "string", "worker-<host>-<pid>", "Written into every result's worker field (the feedback worker's default is feedback-<host>-<pid>)."),
        .init("worker.max-in-flight", "integer", "0 (from streams)", "Notifications in flight per worker, 0 to 1,000,000; 0 sizes it from the pool's streams."),
        .init("worker.max-tokens-per-job", "integer", "1000", "Most tokens one fan-out job may carry; at most 7500, about what a job record (512 KiB at most) can hold."),
        .init("worker.drain-timeout-seconds", "number", "25", "How long SIGTERM, or a revocation, waits for in-flight work: 0 to 3600, and at least 30 s below max.poll.interval.ms."),
        .init("worker.request-timeout-seconds", "number", "10", "Deadline of one APNs request: 0.1 to 600."),
        // Retry
        .init("retry.in-process-attempts", "integer", "3 (retry.max-attempts if that is lower)", "Attempts in process before the retry topic: 1 to 100, at most retry.max-attempts. A fan-out job's 429 TooManyRequests (one device's) goes to the retry topic at once, so as not to hold the job's other slots."),
        .init("retry.max-attempts", "integer", "12", "Attempts in all before the result is failed, 1 to 1000; the defaults retry for about 80 to 160 seconds (delays doubling from retry.base-delay-ms, at most retry.max-delay-ms, halved at random)."),
        .init("retry.base-delay-ms", "integer", "100", "First backoff delay: 1 to 3,600,000, at most retry.max-delay-ms."),
        .init("retry.max-delay-ms", "integer", "60000", "Largest backoff delay: 1 to 86,400,000."),
        .init("retry.possibly-delivered", "retry | give-up", "retry", "After an attempt APNs may have taken without answering (written, then a timeout, a lost or reset connection, a GOAWAY that covers it): retry sends it again, so a device may show it twice (a job's collapse_id merges the copies); give-up ends it failed, its reason saying it may have been delivered. HTTP/2 apps; the legacy binary interface's unanswered notifications are always retried."),
        // Admin
        .init("admin.host", "string", "127.0.0.1", "Address of /metrics, /healthz and /readyz."),
        .init("admin.port", "integer", "9464", "Port of /metrics, /healthz and /readyz; 0 takes a free port and logs it (tests, several workers on one host)."),
        .init("admin.liveness-stall-seconds", "number", "300 (more with long request or drain timeouts)", "/healthz fails once the Kafka consumer pipeline has been stalled this long (records waiting, none taken or finished, no attempt ended), unless messages wait in the producer for Kafka, so that the orchestrator restarts the process and its partitions move on; /readyz fails from the first minute of a stall. 0 (never), or from 60 to 86,400, and at least 30 above worker.drain-timeout-seconds, and 60 above what a notification's in-process attempts can take (retry.in-process-attempts × worker.request-timeout-seconds plus backoff); unset, it grows to that."),
        // Feedback worker
        .init("feedback.poll-interval-seconds", "number", "3600", "How often the feedback worker polls each app's legacy feedback service: 1 to 604,800 (a week). A failed poll is tried again sooner: 30 s later, doubling up to this."),
        .init("feedback.ledger-capacity", "integer", "1000000", "Invalidations the feedback worker remembers, so duplicate results do not repeat an event: 1,000 to 100,000,000."),
    ]
}
