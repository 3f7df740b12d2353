import APNsCore
import CoreMetrics
import Metrics
import Synchronization

/// The legacy gateway client's swift-metrics instruments (dimension `app`).
///
/// - `apns.legacy.verdicts` (counter; `verdict`: accepted, rejected, refused, not_answered;
///   `status`: the error-response status, empty otherwise).
/// - `apns.legacy.resends` (counter): notifications written again on a new connection.
/// - `apns.legacy.connections` (counter; `event`: ready, error_response, protocol_error,
///   connection_error, connect_failed, reconnect_paced).
final class LegacyMetrics: Sendable {
    let app: String
    let resends: Counter
    private let accepted: Counter
    private let counters = Mutex<[String: Counter]>([:])

    init(app: String) {
        self.app = app
        resends = Counter(label: "apns.legacy.resends", dimensions: [("app", app)])
        accepted = Counter(label: "apns.legacy.verdicts", dimensions: [("app", app), ("verdict", "accepted"), ("status", "")])
    }

    func record(_ verdict: LegacyGatewayVerdict) {
        switch verdict {
        case .accepted: accepted.increment()
        case .rejected(let status): verdictCounter("rejected", status: "\(status.code)").increment()
        case .refused(let status, _): verdictCounter("refused", status: "\(status.code)").increment()
        case .notAnswered: verdictCounter("not_answered", status: "").increment()
        }
    }

    func resent(_ count: Int) {
        resends.increment(by: count)
    }

    func event(_ name: String) {
        counter(key: "event \(name)") { Counter(label: "apns.legacy.connections", dimensions: [("app", self.app), ("event", name)]) }.increment()
    }

    private func verdictCounter(_ verdict: String, status: String) -> Counter {
        counter(key: "verdict \(verdict) \(status)") {
            Counter(label: "apns.legacy.verdicts", dimensions: [("app", self.app), ("verdict", verdict), ("status", status)])
        }
    }

    /// Counters are made once per label set (making one per event would be costly).
    private func counter(key: String, make: () -> Counter) -> Counter {
        counters.withLock { counters in
            if let counter = counters[key] { return counter }
            let counter = make()
            counters[key] = counter
            return counter
        }
    }
}
