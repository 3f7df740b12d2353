import APNsCore
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle

/// Several apps' pools in one process: one `APNsClientPool` per app and environment, run and
/// shut down together as one `Service`.
///
/// ```swift
/// let clients = try APNsClients(apps: fleet.apps)
/// let outcome = await clients.send(notification, app: "example", environment: .production, deadline: deadline)
/// ```
public final class APNsClients: Service, Sendable {
    public struct Key: Sendable, Hashable, CustomStringConvertible {
        public var app: String
        /// Nil for a custom endpoint (a simulator), which serves both environments.
        public var environment: APNsEnvironment?

        public init(app: String, environment: APNsEnvironment?) {
            self.app = app
            self.environment = environment
        }

        public var description: String { environment.map { "\(app)/\($0.rawValue)" } ?? app }
    }

    public let pools: [Key: APNsClientPool]
    /// The same pools as a list, searched in order while there are few of them (the usual one to
    /// a few apps): comparing short app names costs less than hashing one per notification.
    private let poolList: [(key: Key, pool: APNsClientPool)]
    private static let listedPoolsAtMost = 16
    private let eventLoopGroup: any EventLoopGroup

    /// Pools from ready-made configurations; the key is the configuration's name and endpoint.
    public init(
        configurations: [APNsClientConfiguration],
        eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger = Logger(label: "apns-fleet.client")
    ) throws(APNsClientError) {
        var pools: [Key: APNsClientPool] = [:]
        for configuration in configurations {
            let key = Key(app: configuration.name, environment: Self.environment(of: configuration.endpoint))
            guard pools[key] == nil else { throw APNsClientError(.configuration, "two client pools for \(key)") }
            pools[key] = try APNsClientPool(configuration: configuration, eventLoopGroup: eventLoopGroup, logger: logger)
        }
        self.pools = pools
        self.poolList = pools.count <= Self.listedPoolsAtMost ? pools.map { ($0.key, $0.value) } : []
        self.eventLoopGroup = eventLoopGroup
    }

    /// Pools for the HTTP/2 apps in `apps`: one in each of an app's `environments`, or one for a
    /// custom endpoint (a simulator), which serves both.
    public convenience init(
        apps: [AppConfiguration],
        eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger = Logger(label: "apns-fleet.client")
    ) throws(APNsClientError) {
        var configurations: [APNsClientConfiguration] = []
        for app in apps where app.transport == .http2 {
            if case .custom = app.endpoint {
                configurations.append(try APNsClientConfiguration.load(app: app))
            } else {
                for environment in app.environments {
                    configurations.append(try APNsClientConfiguration.load(app: app, environment: environment))
                }
            }
        }
        try self.init(configurations: configurations, eventLoopGroup: eventLoopGroup, logger: logger)
    }

    static func environment(of endpoint: AppConfiguration.Endpoint) -> APNsEnvironment? {
        switch endpoint {
        case .production: .production
        case .sandbox: .sandbox
        case .custom: nil
        }
    }

    /// The pool for `app` and `environment` (or the app's custom-endpoint pool).
    public func pool(app: String, environment: APNsEnvironment) -> APNsClientPool? {
        guard !poolList.isEmpty else {
            return pools[Key(app: app, environment: environment)] ?? pools[Key(app: app, environment: nil)]
        }
        var custom: APNsClientPool?
        for entry in poolList where entry.key.app == app {
            if entry.key.environment == environment { return entry.pool }
            if entry.key.environment == nil { custom = entry.pool }
        }
        return custom
    }

    /// The pools a worker needs to be ready: each app's pool in the environment its jobs use by
    /// default (`defaultEnvironments`, by app name), or its custom endpoint's one pool. A pool in
    /// the other environment serves only the jobs that ask for it: an outage there (Apple's
    /// sandbox, say) fails those jobs; it does not make a production worker unready.
    public func essentialPools(defaultEnvironments: [String: APNsEnvironment]) -> [Key: APNsClientPool] {
        pools.filter { key, _ in
            guard let environment = key.environment, let expected = defaultEnvironments[key.app] else { return true }
            return environment == expected
        }
    }

    /// Sends through the right pool; an unknown app or environment is a connection failure
    /// that no retry can fix, so the worker should have rejected the job earlier.
    public func send(_ notification: APNsNotification, app: String, environment: APNsEnvironment, deadline: NIODeadline, sendBy: NIODeadline = .distantFuture) async -> APNsOutcome {
        guard let pool = pool(app: app, environment: environment) else { return Self.noPool(app: app, environment: environment) }
        return await pool.send(notification, deadline: deadline, sendBy: sendBy)
    }

    /// `submit` through the right pool (see ``APNsClientPool/submit(_:deadline:sendBy:to:tag:)``).
    public func submit(_ notification: APNsNotification, app: String, environment: APNsEnvironment, deadline: NIODeadline, sendBy: NIODeadline = .distantFuture, to receiver: any APNsOutcomeReceiver, tag: Int = 0) {
        guard let pool = pool(app: app, environment: environment) else {
            let outcome = Self.noPool(app: app, environment: environment)
            eventLoopGroup.any().execute { receiver.receive(outcome, tag: tag) }
            return
        }
        pool.submit(notification, deadline: deadline, sendBy: sendBy, to: receiver, tag: tag)
    }

    private static func noPool(app: String, environment: APNsEnvironment) -> APNsOutcome {
        // Retried like any connection failure, so that during a rollout that adds the
        // environment a worker with the new configuration can still take the job.
        .notAnswered(APNsNotAnswered(
            .connectionFailed,
            "no APNs connections for app '\(app)' in \(environment.rawValue): add it to app.\(app).environments to let its jobs use it",
            certainlyNotProcessed: true
        ))
    }

    public func run() async throws {
        // No HTTP/2 app (every one uses the binary interface): nothing to run, but a service
        // that returns early stops its whole group, so stay until asked to stop.
        guard !pools.isEmpty else {
            try? await gracefulShutdown()
            return
        }
        try await withThrowingDiscardingTaskGroup { group in
            for pool in pools.values {
                group.addTask { try await pool.run() }
            }
        }
    }

    /// Shuts every pool down (as graceful shutdown does).
    public func shutdown() {
        for pool in pools.values { pool.shutdown() }
    }
}
