import Foundation
import Yams

/// Why a configuration file could not be read, in words that never quote it: YAML parsers cite
/// the offending line (and, for a key given twice, the whole document), and the file may hold a
/// password.
enum ConfigFileProblem {
    static func describe(_ error: any Error, path: String) -> String {
        if let yaml = error as? YamlError { return describe(yaml) }
        // Another layer (swift-configuration) may have wrapped the parser's error, text and all:
        // parse the file again to find the syntax error, and describe only that.
        if let data = FileManager.default.contents(atPath: path) {
            if path.lowercased().hasSuffix(".json") {
                if (try? JSONSerialization.jsonObject(with: data)) == nil { return "it is not valid JSON" }
            } else {
                do {
                    _ = try Yams.compose(yaml: String(decoding: data, as: UTF8.self))
                } catch let yaml as YamlError {
                    return describe(yaml)
                } catch {
                    return "it is not valid YAML"
                }
            }
        }
        // The syntax is fine (or the file is unreadable): the error is about reading it.
        return "\(error)"
    }

    private static func describe(_ error: YamlError) -> String {
        switch error {
        case let .scanner(_, problem, mark, _), let .parser(_, problem, mark, _), let .composer(_, problem, mark, _):
            return "YAML syntax error at line \(mark.line), column \(mark.column): \(problem)"
        case let .duplicatedKeysInMapping(duplicates, context):
            return "YAML mapping near line \(context.mark.line) gives a key more than once: \(duplicates.sorted().joined(separator: ", "))"
        case let .reader(problem, _, _, _):
            return "YAML that cannot be read: \(problem)"
        default:
            return "it is not valid YAML"
        }
    }
}
