import APNsCore
import Configuration
import SystemPackage

/// A configuration problem found at start, naming the key and what is wrong with it.
/// Secret values are never part of the message.
public struct ConfigurationError: Error, Sendable, Hashable, CustomStringConvertible {
    public var key: String?
    public var problem: String
    /// Where the key's value came from (`--set`, an environment variable, the file), when it was
    /// set at all: the file may say one thing while a variable says another.
    public var origin: String?

    public init(key: String?, _ problem: String) {
        self.key = key
        self.problem = problem
    }

    public var description: String {
        guard let key else { return "configuration: \(problem)" }
        return "configuration key '\(key)'\(origin.map { " (\($0))" } ?? ""): \(problem)"
    }
}

/// Reads `FleetConfiguration` from, in order of precedence:
///
/// 1. flags (`--set key=value`, and the dedicated flags of each subcommand),
/// 2. environment variables: the key upper-cased, `.` and `-` as `_`, prefixed `APNS_FLEET_`
///    (`kafka.bootstrap-servers` → `APNS_FLEET_KAFKA_BOOTSTRAP_SERVERS`),
/// 3. the configuration file (`--config`, YAML or JSON, by extension),
/// 4. the defaults documented on each key in `ConfigurationKeys`.
public struct ConfigurationLoader: Sendable {
    public static let environmentPrefix = "APNS_FLEET_"

    public var filePath: String?
    public var environment: [String: String]
    /// `key=value` pairs from the command line.
    public var overrides: [String]
    /// Hears of every key read, besides the library's own `CONFIG_ACCESS_LOG_FILE` log. Values
    /// reach it marked secret, so a well-behaved reporter writes none of them.
    public var accessReporter: (any AccessReporter)?

    public init(filePath: String? = nil, environment: [String: String] = [:], overrides: [String] = []) {
        self.filePath = filePath
        self.environment = environment
        self.overrides = overrides
    }

    /// Reads and checks everything. A key in the file or in `--set` that is not in the
    /// catalogue (or, in `--set`, belongs to an app not in `apps`) is an error, since nothing
    /// would read it.
    public func load() async throws(ConfigurationError) -> FleetConfiguration {
        let reader = try await makeReader()
        let file = try filePath.map { path throws(ConfigurationError) in try UnknownKeys.keys(ofFile: path) } ?? UnknownKeys.FileKeys()
        let flags = overrides.compactMap { pair in
            pair.firstIndex(of: "=").map { (key: String(pair[..<$0]), value: String(pair[pair.index(after: $0)...])) }
        }
        let flagKeys = flags.map(\.key)
        // An empty flag or variable counts as unset (see `makeReader`), so it does not excuse the
        // file's null either: the null would be read as its text.
        let settingFlagKeys = flags.filter { !$0.value.trimmingSpaces.isEmpty }.map(\.key)
        let settingEnvironment = environment.filter { !$0.value.trimmingSpaces.isEmpty }
        let source = "in \(filePath ?? "the config file")"
        try UnknownKeys.check(file.keys, source: source)
        try UnknownKeys.check(flagKeys, source: "in --set")
        // Values the file reader would misread are refused before decoding turns them into
        // confusing range errors; app keys once the listed apps are known.
        try UnknownKeys.checkValues(file.valueProblems, source: source, flagKeys: settingFlagKeys, environment: settingEnvironment, apps: nil)
        let configuration: FleetConfiguration
        do {
            configuration = try FleetConfigurationDecoder(reader: reader).decode()
        } catch {
            var named = error
            if let key = error.key {
                let variable = Self.environmentName(for: key)
                if settingFlagKeys.contains(key) {
                    named.origin = "from --set"
                } else if settingEnvironment[variable] != nil {
                    named.origin = "from \(variable)"
                } else if file.keys.contains(key) {
                    named.origin = source
                }
            }
            throw named
        }
        try UnknownKeys.checkApps(flagKeys, source: "in --set", apps: configuration.apps.map(\.name))
        try UnknownKeys.checkValues(file.valueProblems, source: source, flagKeys: settingFlagKeys, environment: settingEnvironment, apps: configuration.apps.map(\.name))
        return configuration
    }

    /// `APNS_FLEET_*` variables of `environment` that set no key of `configuration`: typos, or
    /// variables an orchestrator adds (Kubernetes' service links), so warned about, not refused.
    public func unknownEnvironmentVariables(for configuration: FleetConfiguration) -> [String] {
        UnknownKeys.unknownVariables(in: environment, apps: configuration.apps.map(\.name))
    }

    /// Environment variable name for a configuration key.
    public static func environmentName(for key: String) -> String {
        environmentPrefix + bareEnvironmentName(for: key)
    }

    /// As swift-configuration's environment provider names a key (it looks values up by this
    /// name, so `--set` and the documented names must agree with it): per dotted component, an
    /// `_` at each lower-to-upper case step (`myApp` → `MY_APP`), upper-cased, anything but
    /// letters and digits as `_`.
    static func bareEnvironmentName(for key: String) -> String {
        key.split(separator: ".", omittingEmptySubsequences: false).map { component in
            var characters: [Character] = []
            for character in component {
                if let previous = characters.last, previous.isLowercase, character.isUppercase { characters.append("_") }
                characters.append(character)
            }
            return String(characters).uppercased().map { $0.isLetter || $0.isNumber ? String($0) : "_" }.joined()
        }.joined(separator: "_")
    }

    private func makeReader() async throws(ConfigurationError) -> ConfigReader {
        var providers: [any ConfigProvider] = []

        var flagValues: [String: String] = [:]
        for (position, pair) in overrides.enumerated() {
            guard let equals = pair.firstIndex(of: "="), equals != pair.startIndex else {
                // Not echoed: `--set kafka.sasl.password:hunter2` would print the password.
                throw ConfigurationError(key: nil, "--set number \(position + 1) is not key=value (the argument is not shown, as it may hold a secret)")
            }
            let key = String(pair[..<equals])
            let value = String(pair[pair.index(after: equals)...])
            if !value.trimmingSpaces.isEmpty { flagValues[Self.bareEnvironmentName(for: key)] = value }
        }
        // Both flag and environment values are strings parsed by the same rules, so a flag and
        // its environment variable always mean the same thing.
        providers.append(EnvironmentVariablesProvider(environmentVariables: flagValues, secretsSpecifier: .all))

        // An empty value counts as unset, so that the file's value applies. Read as "", it would
        // hide the file's value and bring back the default (Compose writes an undefined
        // `${VAR}` as ""): a sandbox app silently sent to production, say.
        var prefixed: [String: String] = [:]
        for (name, value) in environment where name.hasPrefix(Self.environmentPrefix) && !value.trimmingSpaces.isEmpty {
            prefixed[String(name.dropFirst(Self.environmentPrefix.count))] = value
        }
        providers.append(EnvironmentVariablesProvider(environmentVariables: prefixed, secretsSpecifier: .all))

        if let filePath {
            let lower = filePath.lowercased()
            // Every value counts as secret, as in the environment providers above: the library's
            // access log (CONFIG_ACCESS_LOG_FILE) then writes none of them, so a password or a
            // `kafka.properties` entry holding one never reaches it in clear.
            do {
                if lower.hasSuffix(".yaml") || lower.hasSuffix(".yml") {
                    providers.append(try await FileProvider<YAMLSnapshot>(parsingOptions: .init(secretsSpecifier: .all), filePath: FilePath(filePath)))
                } else if lower.hasSuffix(".json") {
                    providers.append(try await FileProvider<JSONSnapshot>(parsingOptions: .init(secretsSpecifier: .all), filePath: FilePath(filePath)))
                } else {
                    throw ConfigurationError(key: nil, "config file \(filePath) must end in .yaml, .yml or .json")
                }
            } catch let error as ConfigurationError {
                throw error
            } catch {
                throw ConfigurationError(key: nil, "cannot read config file \(filePath): \(ConfigFileProblem.describe(error, path: filePath))")
            }
        }
        return ConfigReader(providers: providers, accessReporter: accessReporter)
    }
}
