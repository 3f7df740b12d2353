// swift-tools-version: 6.2
//
// The pure core (APNsCore) and its unit tests, on their own, for the builds that instrument
// everything they compile: ThreadSanitizer, AddressSanitizer and libFuzzer (`make sanitize`,
// `make fuzz`).
//
// Why a package of its own: a sanitizer flag applies to every module of a build, so sanitizing
// the root package's tests would rebuild NIO, swift-nio-ssl, the Kafka and HTTP/2 layers and the
// simulator once per sanitizer. This package sees only APNsCore, through symlinks to the very
// sources the root package builds (Sources/APNsCore, Tests/APNsCoreTests), so nothing is copied
// and nothing can drift. Each flavour builds into its own scratch path (.build-tsan, .build-asan,
// .build-fuzz, all ignored by git) and takes about a minute from cold.
//
// Left out, on purpose:
// - Auth/ProviderToken.swift (ES256 JWTs) and its tests: the only code that needs swift-crypto,
//   whose BoringSSL alone would take 5 CPU-minutes per sanitizer to build; it is value types
//   around CryptoKit calls, with no shared state for TSan to watch.
// - SchemaTests.swift: it reads schemas/ relative to its own path and runs python3; it checks
//   example files against schemas, which the root package's `make test` already does.

import PackageDescription

let warningsAsErrors = Context.environment["WARNINGS_AS_ERRORS"] == "1"

let strictSettings: [SwiftSetting] =
    [
        .enableUpcomingFeature("ExistentialAny"),
        .enableUpcomingFeature("MemberImportVisibility"),
    ] + (warningsAsErrors ? [.treatAllWarnings(as: .error)] : [])

let package = Package(
    name: "apns-fleet-sanitized",
    platforms: [.macOS(.v15)],
    targets: [
        .target(
            name: "APNsCore",
            exclude: ["Auth/ProviderToken.swift"],
            swiftSettings: strictSettings
        ),
        // The libFuzzer target: job intake (both encodings) and the legacy PDU parsers. Built
        // with `-sanitize=fuzzer,address -D FUZZING` by `make fuzz`; built plainly it is a
        // replayer that runs the given files or directories through the same checks.
        .executableTarget(
            name: "CoreFuzz",
            dependencies: ["APNsCore", "CLibFuzzer"],
            swiftSettings: strictSettings
        ),
        // The declaration of libFuzzer's driver entry point (no code).
        .target(name: "CLibFuzzer"),
        .testTarget(
            name: "APNsCoreTests",
            dependencies: ["APNsCore"],
            exclude: ["ProviderTokenTests.swift", "SchemaTests.swift"],
            swiftSettings: strictSettings
        ),
    ]
)
