import APNsCore
import Foundation
import Yams

/// A key nobody reads is a mistake: `app.example.enviroment: sandbox` would leave the app on
/// production without a word. The configuration file and `--set` may hold only catalogued keys
/// (`ConfigurationKeys`); `--set` app keys only for listed apps (a file shared by deployments
/// that pick different `apps` may configure more). Environment variables are only warned
/// about, because Kubernetes adds `<SERVICE>_PORT`-style variables of its own.
enum UnknownKeys {
    /// What a configuration file sets: its keys, and the values the file reader would take
    /// for something other than what was written.
    struct FileKeys {
        var keys: [String] = []
        /// Settings given as `~`/`null`, which the reader takes as that text, and JSON `true` or
        /// `false` for a number, which it takes as 1 or 0; with what is wrong.
        var valueProblems: [(key: String, problem: String)] = []
    }

    /// The keys of a configuration file, flattened the way swift-configuration reads them:
    /// nested mappings joined with `.`; lists and scalars are values; nulls set nothing (an
    /// empty section). Top-level `x-*` keys are left alone, as holders of YAML anchors.
    static func keys(ofFile path: String) throws(ConfigurationError) -> FileKeys {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ConfigurationError(key: nil, "cannot read config file \(path)")
        }
        var file = FileKeys()
        do {
            let lower = path.lowercased()
            if lower.hasSuffix(".json") {
                // Syntax errors as Foundation's reader (the one that reads the values) sees them.
                _ = try JSONSerialization.jsonObject(with: data)
                // The exact parser keeps a name given twice, which Foundation's reader drops
                // silently, and tells `true` from 1 for an integer key.
                // A byte-order mark (Windows editors write one) is not JSON; Foundation skips it.
                var bytes = Array(data)
                if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { bytes.removeFirst(3) }
                let value = try JSONParser.parse(bytes)
                file.keys = flatten(json: value, prefix: nil)
                jsonValueProblems(value, prefix: nil, into: &file.valueProblems)
            } else {
                guard let node = try Yams.compose(yaml: String(decoding: data, as: UTF8.self)) else { return file }
                file.keys = flatten(yaml: node, prefix: nil, nullSettings: &file.valueProblems)
            }
        } catch {
            throw ConfigurationError(key: nil, "cannot read config file \(path): \(ConfigFileProblem.describe(error, path: path))")
        }
        // A name given twice in one JSON object, or a YAML key given both dotted
        // (`app.example.key-id:`) and nested: one of the two would be dropped without a word.
        var seen = Set<String>()
        if let twice = file.keys.first(where: { !seen.insert($0).inserted }) {
            throw ConfigurationError(key: twice, "is given twice in \(path) (a name repeated in one object, or given both as a dotted key and nested); one would be ignored")
        }
        return file
    }

    /// The keys under `node`, and into `nullSettings` the settings (catalogued keys, not sections)
    /// given as `~` or `null`, unquoted: the reader takes them as that text. (Nothing after the
    /// colon reads as the default.)
    private static func flatten(yaml node: Node, prefix: String?, nullSettings: inout [(key: String, problem: String)]) -> [String] {
        if node.null != nil {
            if let prefix, let scalar = node.scalar, scalar.style == .plain || scalar.style == .any, !scalar.string.isEmpty, isCatalogued(prefix) {
                nullSettings.append((prefix, nullProblem))
            }
            return []
        }
        guard let mapping = node.mapping else { return prefix.map { [$0] } ?? [] }
        return mapping.flatMap { key, value -> [String] in
            let name = key.string ?? "\(key)"
            if prefix == nil, name.hasPrefix("x-") { return [] }
            return flatten(yaml: value, prefix: prefix.map { "\($0).\(name)" } ?? name, nullSettings: &nullSettings)
        }
    }

    private static let nullProblem = "is null (~ or null), which would be read as that text; give it a value, or remove it for its default"

    /// Refuses the first of `problems` that decides a value: not for a key a flag or an
    /// environment variable sets (they win over the file), nor for an app not in `apps`; with
    /// `apps` nil (before they are known), for no app key.
    static func checkValues(_ problems: [(key: String, problem: String)], source: String, flagKeys: [String], environment: [String: String], apps: [String]?) throws(ConfigurationError) {
        for (key, problem) in problems {
            if flagKeys.contains(key) || environment[ConfigurationLoader.environmentName(for: key)] != nil { continue }
            if let app = appName(in: key), !(apps ?? []).contains(app) { continue }
            throw ConfigurationError(key: key, "\(problem) (\(source))")
        }
    }

    /// `true`/`false` in a JSON file for a key that is not a boolean (the reader takes it as 1 or 0).
    /// A JSON `null` sets nothing, like an empty YAML value.
    private static func jsonValueProblems(_ value: JSONValue, prefix: String?, into problems: inout [(key: String, problem: String)]) {
        switch value {
        case .object(let members):
            for member in members {
                if prefix == nil, member.key.hasPrefix("x-") { continue }
                jsonValueProblems(member.value, prefix: prefix.map { "\($0).\(member.key)" } ?? member.key, into: &problems)
            }
        case .bool(let flag):
            if let prefix, let type = catalogueType(of: prefix), type != "bool" {
                problems.append((prefix, "must be \(["integer": "an integer", "number": "a number"][type] ?? type), got \(flag)"))
            }
        default:
            break
        }
    }

    static func catalogueType(of key: String) -> String? {
        if let type = typesByName[key] { return type }
        guard let (app, suffix) = appKey(key), !app.isEmpty else { return nil }
        return typesByName[appPrefix + suffix]
    }

    private static let typesByName = Dictionary(ConfigurationKeys.all.map { ($0.name, $0.type) }, uniquingKeysWith: { first, _ in first })

    private static func flatten(json value: JSONValue, prefix: String?) -> [String] {
        switch value {
        case .null:
            return []
        case .object(let members):
            return members.flatMap { member -> [String] in
                if prefix == nil, member.key.hasPrefix("x-") { return [] }
                return flatten(json: member.value, prefix: prefix.map { "\($0).\(member.key)" } ?? member.key)
            }
        default:
            return prefix.map { [$0] } ?? []
        }
    }

    /// Checks `keys` (from `source`, for the message) against the catalogue: the first unknown
    /// key is an error, with the nearest known key as a suggestion.
    static func check(_ keys: [String], source: String) throws(ConfigurationError) {
        for key in keys.sorted() where !isCatalogued(key) {
            // A value that parsed as a mapping (a password starting with "{", say): name the
            // key only, never what follows it.
            if let parent = catalogued(prefixOf: key) {
                // Said by the key's own type: "a single value" misleads for a list of name=value.
                let type = catalogueType(of: parent) ?? "a single value"
                let expected = type.hasPrefix("list")
                    ? "must be a \(type) ([a, b] in YAML or JSON), not a mapping"
                    : "must be a single value (\(type)), not a mapping"
                throw ConfigurationError(key: parent, "\(expected) (\(source))")
            }
            if key.split(separator: ".").contains("<<") {
                throw ConfigurationError(key: key, "YAML merge keys (<<) are not supported; write the keys out (\(source))")
            }
            let hint = suggestion(for: key).map { " (did you mean \($0)?)" } ?? ""
            throw ConfigurationError(key: key, "is not a configuration key\(hint); see docs/configuration.md (\(source))")
        }
    }

    /// The catalogued key that `key` extends with more dotted components, if any.
    private static func catalogued(prefixOf key: String) -> String? {
        var end = key.endIndex
        while let dot = key[..<end].lastIndex(of: ".") {
            let candidate = String(key[..<dot])
            if isCatalogued(candidate) { return candidate }
            end = dot
        }
        return nil
    }

    /// App keys name listed apps only: a `--set` for an app missing from `apps` is never read.
    static func checkApps(_ keys: [String], source: String, apps: [String]) throws(ConfigurationError) {
        for key in keys.sorted() {
            guard let app = appName(in: key), !apps.contains(app) else { continue }
            let listed = apps.isEmpty ? "none" : apps.joined(separator: ", ")
            throw ConfigurationError(key: key, "app \(app) is not in apps (listed: \(listed)), so this is never read (\(source))")
        }
    }

    /// Names of `APNS_FLEET_*` variables in `environment` that set no key of `configuration`.
    static func unknownVariables(in environment: [String: String], apps: [String]) -> [String] {
        var known = Set<String>()
        for key in ConfigurationKeys.all {
            if key.name.hasPrefix(appPrefix) {
                for app in apps { known.insert(ConfigurationLoader.environmentName(for: key.name.replacingOccurrences(of: "<name>", with: app))) }
            } else {
                known.insert(key.environmentName)
            }
        }
        return environment.keys.filter { $0.hasPrefix(ConfigurationLoader.environmentPrefix) && !known.contains($0) }.sorted()
    }

    private static let appPrefix = "app.<name>."

    private static let plainKeys = Set(ConfigurationKeys.all.map(\.name).filter { !$0.hasPrefix(appPrefix) })
    private static let appKeySuffixes = Set(ConfigurationKeys.all.map(\.name).filter { $0.hasPrefix(appPrefix) }.map { String($0.dropFirst(appPrefix.count)) })

    /// `app.<name>.<suffix>` split into name and suffix, if `key` has that shape.
    private static func appKey(_ key: String) -> (app: String, suffix: String)? {
        let parts = key.split(separator: ".", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0] == "app" else { return nil }
        return (String(parts[1]), String(parts[2]))
    }

    /// `app.<name>.<suffix>`'s name, if `key` has that shape.
    private static func appName(in key: String) -> String? { appKey(key)?.app }

    private static func isCatalogued(_ key: String) -> Bool { catalogueType(of: key) != nil }

    /// The catalogued key closest to `key` (at most a third of its characters different).
    private static func suggestion(for key: String) -> String? {
        var candidates = plainKeys
        if let app = appName(in: key) {
            candidates.formUnion(appKeySuffixes.map { "app.\(app).\($0)" })
        }
        let scored = candidates.map { ($0, editDistance(Array(key.utf8), Array($0.utf8))) }
        guard let best = scored.min(by: { $0.1 < $1.1 || ($0.1 == $1.1 && $0.0 < $1.0) }), best.1 <= max(2, key.utf8.count / 3) else { return nil }
        return best.0
    }

    private static func editDistance(_ a: [UInt8], _ b: [UInt8]) -> Int {
        var previous = Array(0...b.count)
        for (i, x) in a.enumerated() {
            var current = [i + 1] + Array(repeating: 0, count: b.count)
            for (j, y) in b.enumerated() {
                current[j + 1] = min(previous[j + 1] + 1, current[j] + 1, previous[j] + (x == y ? 0 : 1))
            }
            previous = current
        }
        return previous[b.count]
    }
}
