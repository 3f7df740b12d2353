import Foundation

/// Quantiles of a histogram in Prometheus's text format, as `/metrics` serves it.
///
/// A quantile is the upper bound of the first bucket whose cumulative count reaches it: "p99 ≤
/// 2 ms", not an interpolation. Label sets of the same histogram are added together.
public struct PrometheusHistogram: Sendable {
    /// Cumulative counts by bucket upper bound (seconds for durations), `+Inf` last.
    public private(set) var buckets: [(upperBound: Double, count: Double)] = []

    /// The histogram `name` (without the `_bucket` suffix) from `text`, or nil if it has no bucket.
    public init?(_ text: String, name: String) {
        var counts: [Double: Double] = [:]
        let prefix = name + "_bucket"
        for line in text.split(separator: "\n") where line.hasPrefix(prefix) {
            guard let le = line.range(of: "le=\""), let close = line[le.upperBound...].firstIndex(of: "\""),
                let space = line.lastIndex(of: " "), let count = Double(line[line.index(after: space)...])
            else { continue }
            let bound = line[le.upperBound..<close] == "+Inf" ? Double.infinity : Double(line[le.upperBound..<close])
            guard let bound else { continue }
            counts[bound, default: 0] += count
        }
        guard !counts.isEmpty else { return nil }
        buckets = counts.sorted { $0.key < $1.key }.map { (upperBound: $0.key, count: $0.value) }
    }

    /// Observations in all.
    public var count: Double { buckets.last?.count ?? 0 }

    /// The upper bound of the bucket holding quantile `q` (0...1); nil without observations.
    public func quantileUpperBound(_ q: Double) -> Double? {
        let total = count
        guard total > 0 else { return nil }
        return buckets.first { $0.count >= q * total }?.upperBound
    }
}
