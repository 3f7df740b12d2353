import Foundation

/// One sample of Prometheus's text format, as `/metrics` serves it.
public struct PrometheusSample: Hashable, Sendable {
    public var name: String
    public var labels: [String: String]
    public var value: Double

    public init(name: String, labels: [String: String], value: Double) {
        self.name = name
        self.labels = labels
        self.value = value
    }
}

/// Parses Prometheus text (for our own exports, whose label values hold no quotes or commas).
public func prometheusSamples(_ text: String) -> [PrometheusSample] {
    var samples: [PrometheusSample] = []
    for line in text.split(separator: "\n") where !line.hasPrefix("#") {
        guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
        let series = line[..<space]
        var labels: [String: String] = [:]
        var name = String(series)
        if let open = series.firstIndex(of: "{"), let close = series.lastIndex(of: "}") {
            name = String(series[..<open])
            for pair in series[series.index(after: open)..<close].split(separator: ",") {
                let parts = pair.split(separator: "=", maxSplits: 1)
                guard parts.count == 2 else { continue }
                labels[String(parts[0])] = parts[1].trimmingCharacters(in: CharacterSet(charactersIn: "\""))
            }
        }
        samples.append(PrometheusSample(name: name, labels: labels, value: value))
    }
    return samples
}

/// Quantiles of a histogram in Prometheus's text format.
///
/// A quantile is the upper bound of the first bucket whose cumulative count reaches it: "p99 ≤
/// 2 ms", not an interpolation. Label sets of the same histogram are added together.
public struct PrometheusHistogram: Sendable {
    /// Cumulative counts by bucket upper bound (seconds for durations), `+Inf` last.
    public private(set) var buckets: [(upperBound: Double, count: Double)] = []

    /// The histogram `name` (without the `_bucket` suffix) from `text`, or nil if it has no bucket.
    public init?(_ text: String, name: String) {
        var counts: [Double: Double] = [:]
        let bucketName = name + "_bucket"
        for sample in prometheusSamples(text) where sample.name == bucketName {
            guard let le = sample.labels["le"], let bound = le == "+Inf" ? Double.infinity : Double(le) else { continue }
            counts[bound, default: 0] += sample.value
        }
        guard !counts.isEmpty else { return nil }
        buckets = counts.sorted { $0.key < $1.key }.map { (upperBound: $0.key, count: $0.value) }
    }

    /// What was observed since `earlier`, a reading of the same histogram: a window of a run,
    /// such as the part after its warm-up. A bucket `earlier` lacks counts from zero.
    public func subtracting(_ earlier: PrometheusHistogram) -> PrometheusHistogram {
        var window = self
        for index in window.buckets.indices {
            let bound = window.buckets[index].upperBound
            let before = earlier.buckets.first { $0.upperBound == bound }?.count ?? 0
            window.buckets[index].count = max(0, window.buckets[index].count - before)
        }
        return window
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
