// swift-tools-version: 6.2
//
// apns-fleet: Kafka-fed Apple Push Notification delivery.
//
// Modules are layered by dependency weight, so the architecture shows in the tree:
//
//   APNsCore          pure: message contracts, validation, reason tables, JWT, codecs (no I/O)
//   APNsFleetConfig   typed configuration from file, environment and flags
//   CRdKafka/CNGHTTP2 system libraries (librdkafka, libnghttp2)
//   apns-fleet        the one executable, a thin argument-parser front end
//
// Later layers (Kafka transport, HTTP/2 transport, APNs client, simulator, worker services)
// are added beside these as their issues land.

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
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(
            url: "https://github.com/apple/swift-configuration.git",
            from: "1.4.0",
            traits: [.defaults, "YAML"]
        ),
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

        // MARK: - Configuration

        .target(
            name: "APNsFleetConfig",
            dependencies: [
                "APNsCore",
                .product(name: "Configuration", package: "swift-configuration"),
            ],
            swiftSettings: strictSettings
        ),

        // MARK: - Executable

        .executableTarget(
            name: "APNsFleetCLI",
            dependencies: [
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

        // MARK: - Tests

        .testTarget(
            name: "APNsCoreTests",
            dependencies: ["APNsCore"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "APNsFleetConfigTests",
            dependencies: ["APNsFleetConfig", "APNsCore"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "KafkaTransportTests",
            dependencies: [
                "KafkaTransport",
                "APNsCore",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings
        ),
    ]
)
