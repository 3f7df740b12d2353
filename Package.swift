// swift-tools-version: 6.2
//
// apns-fleet: Kafka-fed Apple Push Notification delivery.
//
// Modules are layered by dependency weight, so the architecture shows in the tree:
//
//   APNsCore          pure: message contracts, validation, reason tables, JWT, codecs (no I/O)
//   APNsFleetConfig   typed configuration from file, environment and flags
//   CRdKafka/CNGHTTP2 system libraries (librdkafka, libnghttp2); CJemalloc, the executable's malloc
//   KafkaTransport    librdkafka wrapper: producer, consumer, mock cluster
//   APNsHTTP2         libnghttp2 session driven by SwiftNIO (client and server)
//   APNsClient        APNs HTTP/2 client: long-lived connections, pools per app
//   APNsSimulator     APNs simulator: HTTP/2 provider API, legacy gateway and feedback service
//   APNsLegacyClient  the legacy binary interface: gateway connections, feedback reader
//   FleetWorker       the worker services: push worker, feedback worker, admin endpoint
//   FleetLoad         job generator, publisher with progress, result tallies (publish, demo, bench)
//   FleetTestSupport  helpers for tests that start real processes
//   apns-fleet        the one executable, a thin argument-parser front end

import PackageDescription

// CI (`.ci/run`) sets WARNINGS_AS_ERRORS=1 so that no warning lands; local builds stay forgiving.
let warningsAsErrors = Context.environment["WARNINGS_AS_ERRORS"] == "1"

let strictSettings: [SwiftSetting] =
    [
        .enableUpcomingFeature("ExistentialAny"),
        .enableUpcomingFeature("MemberImportVisibility"),
    ] + (warningsAsErrors ? [.treatAllWarnings(as: .error)] : [])

let package = Package(
    name: "apns-fleet",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "apns-fleet", targets: ["APNsFleetCLI"]),
        .library(name: "APNsCore", targets: ["APNsCore"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        // Named directly for SwiftASN1 types (a certificate's IP address SAN); already resolved via swift-certificates.
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.7.4"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-collections.git", from: "1.3.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        // Within 1.4: a missing key is told from a mistyped one by the library's error text (its
        // error type is not public), which a later minor release could reword.
        .package(
            url: "https://github.com/apple/swift-configuration.git",
            .upToNextMinor(from: "1.4.0"),
            traits: [.defaults, "YAML"]
        ),
        // Named directly to list a configuration file's keys; already resolved via swift-configuration's YAML trait.
        .package(url: "https://github.com/jpsim/Yams.git", from: "6.0.0"),
    ],
    targets: [
        // MARK: - System libraries

        .systemLibrary(
            name: "CRdKafka",
            pkgConfig: "rdkafka",
            providers: [.apt(["librdkafka-dev"])]
        ),
        .systemLibrary(
            name: "CNGHTTP2",
            pkgConfig: "libnghttp2",
            providers: [.apt(["libnghttp2-dev"])]
        ),
        // The executable's malloc. glibc's malloc cost the worker about four times the CPU per
        // notification (allocations freed on other threads: NIO, Swift concurrency, librdkafka).
        .systemLibrary(
            name: "CJemalloc",
            pkgConfig: "jemalloc",
            providers: [.apt(["libjemalloc-dev"])]
        ),
        // jemalloc's options for the executable (a C global it reads before main).
        .target(name: "MallocSettings", path: "Sources/MallocSettings"),

        // posix_spawn behind a safe type, for the demo, the benchmarks and the test suites
        // (Foundation's Process.run() crashes now and then on Linux; see LaunchedProcess).
        .target(name: "ProcessLaunch", swiftSettings: strictSettings),

        // MARK: - Pure core

        .target(
            name: "APNsCore",
            dependencies: [
                // ES256 provider tokens are pure computation, so they belong in the core.
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strictSettings
        ),

        // MARK: - Kafka transport

        // Safe Swift types over librdkafka (producer, consumer, mock cluster). The only module that
        // touches librdkafka's pointers.
        .target(
            name: "KafkaTransport",
            dependencies: [
                "CRdKafka",
                "APNsCore",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strictSettings
        ),

        // MARK: - HTTP/2 transport

        // A safe Swift session over libnghttp2 (client and server), driven by a SwiftNIO handler.
        // The only module that touches libnghttp2's pointers.
        .target(
            name: "APNsHTTP2",
            dependencies: [
                "CNGHTTP2",
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: strictSettings
        ),

        // MARK: - APNs client

        // The APNs HTTP/2 client: long-lived connections on libnghttp2, pooled per app.
        .target(
            name: "APNsClient",
            dependencies: [
                "APNsCore",
                "APNsHTTP2",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strictSettings
        ),

        // The legacy binary provider interface (gateway 2195, feedback 2196): certificate-auth TLS
        // connections, error-response bookkeeping, the feedback stream reader.
        .target(
            name: "APNsLegacyClient",
            dependencies: [
                "APNsCore",
                "APNsClient",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strictSettings
        ),

        // MARK: - Configuration

        .target(
            name: "APNsFleetConfig",
            dependencies: [
                "APNsCore",
                .product(name: "Configuration", package: "swift-configuration"),
                .product(name: "Yams", package: "Yams"),
            ],
            swiftSettings: strictSettings
        ),

        // MARK: - APNs simulator

        // The APNs simulator (HTTP/2 provider API, legacy binary gateway and feedback service), usable
        // in-process by tests and as `apns-fleet simulator`.
        .target(
            name: "APNsSimulator",
            dependencies: [
                "APNsCore",
                "APNsHTTP2",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strictSettings
        ),

        // MARK: - Worker services

        // The push worker's pipeline (and, later, the feedback worker): Kafka in, APNs out, results back.
        .target(
            name: "FleetWorker",
            dependencies: [
                "APNsCore",
                "APNsClient",
                "APNsLegacyClient",
                "KafkaTransport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strictSettings
        ),

        // MARK: - Executable

        .executableTarget(
            name: "APNsFleetCLI",
            dependencies: [
                "CJemalloc",
                "MallocSettings",
                "ProcessLaunch",
                "FleetWorker",
                "FleetLoad",
                "APNsLegacyClient",
                .product(name: "Prometheus", package: "swift-prometheus"),
                "APNsSimulator",
                "APNsClient",
                "APNsCore",
                "APNsFleetConfig",
                "KafkaTransport",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Sources/apns-fleet",
            swiftSettings: strictSettings
        ),

        // MARK: - Load tools

        // Job generation, publishing with progress, and result tallies: shared by `publish`,
        // `demo` and `bench`.
        .target(
            name: "FleetLoad",
            dependencies: [
                "APNsCore",
                "KafkaTransport",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings
        ),

        // MARK: - Test support

        // Helpers for suites that start real processes and servers (bounded waits, child processes).
        .target(
            name: "FleetTestSupport",
            dependencies: ["FleetLoad", "ProcessLaunch"],
            swiftSettings: strictSettings
        ),

        // MARK: - Tests

        .testTarget(
            name: "ProcessLaunchTests",
            dependencies: ["ProcessLaunch"],
            swiftSettings: strictSettings
        ),

        .testTarget(
            name: "APNsSimulatorTests",
            dependencies: [
                "APNsSimulator",
                "APNsHTTP2",
                "APNsCore",
                "FleetTestSupport",
                "ProcessLaunch",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ],
            swiftSettings: strictSettings
        ),

        .testTarget(
            name: "APNsClientTests",
            dependencies: [
                "APNsClient",
                "APNsSimulator",
                "APNsCore",
                "APNsHTTP2",
                "FleetTestSupport",
                "ProcessLaunch",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "APNsLegacyClientTests",
            dependencies: [
                "APNsLegacyClient",
                "FleetTestSupport",
                "APNsClient",
                "APNsSimulator",
                "APNsCore",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "FleetWorkerTests",
            dependencies: [
                "FleetWorker",
                "FleetLoad",
                "APNsLegacyClient",
                "FleetTestSupport",
                "APNsClient",
                "APNsSimulator",
                "KafkaTransport",
                "APNsCore",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "FleetLoadTests",
            dependencies: ["FleetLoad", "APNsCore", "KafkaTransport"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "APNsCoreTests",
            dependencies: ["APNsCore", "ProcessLaunch"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "APNsFleetConfigTests",
            dependencies: ["APNsFleetConfig", "APNsCore", "FleetTestSupport", .product(name: "Configuration", package: "swift-configuration")],
            swiftSettings: strictSettings
        ),
        // Reliability: kills, Kafka faults and APNs faults against real processes, "nothing lost"
        // measured (APNS_FLEET_SOAK=1 for the longer soak, `make soak`).
        .testTarget(
            name: "ReliabilityTests",
            dependencies: [
                "FleetTestSupport",
                "ProcessLaunch",
                "FleetLoad",
                "KafkaTransport",
                "APNsSimulator",
                "APNsClient",
                "APNsCore",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "KafkaTransportTests",
            dependencies: [
                "KafkaTransport",
                "FleetTestSupport",
                "APNsCore",
                "FleetLoad",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            swiftSettings: strictSettings
        ),
    ]
)
