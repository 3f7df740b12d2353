import Foundation

/// A one-line progress bar with the rate and an ETA, redrawn in place on a terminal and printed
/// every few seconds otherwise (so CI logs stay short).
public struct ProgressLine: Sendable {
    public let label: String
    public let total: Int
    private let isTerminal: Bool
    private let started: ContinuousClock.Instant
    private var lastPrinted: ContinuousClock.Instant?

    public init(label: String, total: Int) {
        self.label = label
        self.total = max(total, 1)
        self.isTerminal = isatty(STDERR_FILENO) == 1
        self.started = .now
    }

    public mutating func update(_ done: Int, detail: String = "") {
        let now = ContinuousClock.now
        if !isTerminal, let lastPrinted, now - lastPrinted < .seconds(3), done < total { return }
        lastPrinted = now
        let elapsed = (now - started).seconds
        // No rate until there is time to measure it over: a first update that finds work done
        // before the line began would divide it by microseconds (a "511,851,597/s" once).
        let rate = elapsed >= Self.minimumRateWindow ? Double(done) / elapsed : 0
        let fraction = min(Double(done) / Double(total), 1)
        let width = 30
        let filled = Int(fraction * Double(width))
        let bar = String(repeating: "█", count: filled) + String(repeating: "░", count: width - filled)
        let remaining = rate > 0 ? Double(total - done) / rate : .infinity
        let eta = done >= total ? "done" : remaining.isFinite ? "ETA \(Self.clock(remaining))" : "ETA --"
        let rateText = rate > 0 ? Self.grouped(Int(rate)) : "--"
        let text = "\(label) \(bar) \(Self.grouped(done))/\(Self.grouped(total))  \(rateText)/s  \(eta)\(detail.isEmpty ? "" : "  " + detail)"
        write(isTerminal ? "\r\u{1B}[2K" + text : text + "\n")
    }

    /// Ends the line on a terminal.
    public func finish() {
        if isTerminal { write("\n") }
    }

    private func write(_ text: String) {
        FileHandle.standardError.write(Data(text.utf8))
    }

    /// Seconds since the line began before a rate is shown.
    static let minimumRateWindow = 0.5

    static func clock(_ seconds: Double) -> String {
        let total = Int(seconds.rounded())
        return total >= 60 ? "\(total / 60)m\(format2(total % 60))s" : "\(total)s"
    }

    private static func format2(_ value: Int) -> String { value < 10 ? "0\(value)" : "\(value)" }

    /// 12345678 → "12,345,678".
    public static func grouped(_ value: Int) -> String {
        let digits = String(abs(value))
        var out = ""
        for (index, character) in digits.enumerated() {
            if index > 0, (digits.count - index) % 3 == 0 { out.append(",") }
            out.append(character)
        }
        return value < 0 ? "-" + out : out
    }
}
