import APNsCore
import Foundation

/// One benchmark run's figures, in a fixed field order: printed as one JSON line, folded into a
/// median over runs, and written as a Markdown table row.
struct BenchRecord {
    enum Value {
        case int(Int)
        case number(Double, decimals: Int)
        case text(String)

        var double: Double? {
            switch self {
            case .int(let value): Double(value)
            case .number(let value, _): value
            case .text: nil
            }
        }

        var display: String {
            switch self {
            case .int(let value): "\(value)"
            case .number(let value, let decimals): String(format: "%.\(decimals)f", value)
            case .text(let value): value
            }
        }
    }

    private(set) var fields: [(key: String, value: Value)] = []

    subscript(key: String) -> Value? {
        get { fields.first { $0.key == key }?.value }
        set {
            guard let newValue else { fields.removeAll { $0.key == key }; return }
            if let index = fields.firstIndex(where: { $0.key == key }) { fields[index].value = newValue } else { fields.append((key, newValue)) }
        }
    }

    mutating func set(_ key: String, _ value: Int) { self[key] = .int(value) }
    mutating func set(_ key: String, _ value: Double, decimals: Int = 1) { self[key] = .number(value, decimals: decimals) }
    mutating func set(_ key: String, _ value: String) { self[key] = .text(value) }

    var jsonLine: String {
        var writer = JSONWriter()
        writer.beginObject()
        for (key, value) in fields {
            switch value {
            case .int(let number): writer.field(JSONKey(key), number)
            case .number(let number, let decimals): writer.field(JSONKey(key), number, decimals: decimals)
            case .text(let text): writer.field(JSONKey(key), text)
            }
        }
        writer.endObject()
        return String(decoding: writer.bytes, as: UTF8.self)
    }

    /// The median of each numeric field over `runs` (text fields from the first run), marked
    /// `"run": "median"`.
    static func median(of runs: [BenchRecord]) -> BenchRecord? {
        guard var result = runs.first else { return nil }
        guard runs.count > 1 else { return result }
        for (key, value) in result.fields {
            let values = runs.compactMap { $0[key]?.double }.sorted()
            guard !values.isEmpty else { continue }
            let middle = values.count % 2 == 1 ? values[values.count / 2] : (values[values.count / 2 - 1] + values[values.count / 2]) / 2
            switch value {
            case .text: continue
            case .int: result[key] = middle == middle.rounded() ? .int(Int(middle)) : .number(middle, decimals: 1)
            case .number(_, let decimals): result.set(key, middle, decimals: decimals)
            }
        }
        result.set("run", "median of \(runs.count)")
        return result
    }

    /// A Markdown table of `records` with the given columns (title, key).
    static func markdown(_ records: [BenchRecord], columns: [(String, String)]) -> String {
        var lines = ["| " + columns.map(\.0).joined(separator: " | ") + " |", "|" + columns.map { _ in "---|" }.joined()]
        for record in records {
            lines.append("| " + columns.map { record[$0.1]?.display ?? "" }.joined(separator: " | ") + " |")
        }
        return lines.joined(separator: "\n") + "\n"
    }
}

/// What every multi-run suite does with its records: a JSON line each as they come, then the
/// median line, and optionally a Markdown table (appended to a file, so suites can share one).
struct BenchOutput {
    let markdownPath: String?
    let title: String
    let columns: [(String, String)]

    func emit(_ record: BenchRecord) { Self.write(record) }

    static func write(_ record: BenchRecord) {
        // Straight to the descriptor, so a pipe sees each line as its run ends.
        FileHandle.standardOutput.write(Data((record.jsonLine + "\n").utf8))
    }

    func finish(_ records: [BenchRecord], machine: String) throws {
        guard let median = BenchRecord.median(of: records) else { return }
        if records.count > 1 { emit(median) }
        try finishTable(records + (records.count > 1 ? [median] : []), machine: machine)
    }

    /// Writes `records` as they are (already medians, say) to the Markdown file.
    func finishTable(_ records: [BenchRecord], machine: String) throws {
        guard let markdownPath else { return }
        var text = "### \(title)\n\n\(machine)\n\n" + BenchRecord.markdown(records, columns: columns) + "\n"
        if let existing = FileManager.default.contents(atPath: markdownPath) {
            text = String(decoding: existing, as: UTF8.self) + text
        }
        guard FileManager.default.createFile(atPath: markdownPath, contents: Data(text.utf8)) else {
            throw UsageError("cannot write \(markdownPath)")
        }
    }

    /// The machine a figure came from: CPU model, cores and memory.
    static var machine: String {
        let cpuInfo = (try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8)) ?? ""
        let model = cpuInfo.split(separator: "\n").first { $0.hasPrefix("model name") }?.split(separator: ":").last.map { $0.trimmingCharacters(in: .whitespaces) } ?? "unknown CPU"
        let memory = ProcessInfo.processInfo.physicalMemory / 1_073_741_824
        return "Machine: \(model), \(ProcessInfo.processInfo.activeProcessorCount) cores, \(memory) GiB."
    }
}
