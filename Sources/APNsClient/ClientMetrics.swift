import APNsCore
import CoreMetrics
import Metrics
import Synchronization

/// The client's swift-metrics instruments for one pool (dimensions `app` and `environment`:
/// production, sandbox or custom). One app can have a pool per environment, and without the
/// second dimension their gauges overwrote each other.
///
/// - `apns.client.requests` (counter; `status`, `reason`): APNs answers.
/// - `apns.client.not_answered` (counter; `kind`): the `APNsNotAnswered.Kind` descriptions
///   (`connection failed`, `refused stream`, `GOAWAY`, `timeout`, `too late`, `client shut down`,
///   `answer cut short`).
/// - `apns.client.unprocessed_retries` (counter; `kind`): requests re-sent on another connection.
/// - `apns.client.latency` (timer): request to answer.
/// - `apns.client.in_flight`, `apns.client.waiting` (gauges): streams open, callers waiting.
/// - `apns.client.stream_limit` (gauge): the sum of the connections' stream limits.
/// - `apns.client.connections` (counter; `event`: ready, goaway, closed, dead, retired, connect_failed).
/// - `apns.client.connections.usable` (gauge).
/// - `apns.client.connections.open` (gauge; `state`: connecting, ready, going_away): the pool's
///   connections by state; one still connecting, or draining after a GOAWAY, is not usable.
/// - `apns.client.stream_limit.min` (gauge): the smallest stream limit of a usable connection,
///   which shows one held to a single stream (a provider token not yet accepted, a rejection)
///   that the sum hides.
/// - `apns.client.tokens_minted` (counter).
final class ClientMetrics: Sendable {
    let app: String
    let environment: String
    let latency: Metrics.Timer
    let inFlight: Gauge
    let waiting: Gauge
    let streamLimit: Gauge
    let usableConnections: Gauge
    let smallestStreamLimit: Gauge
    private let connectionsByState: (connecting: Gauge, ready: Gauge, goingAway: Gauge)
    let tokensMinted: Counter
    private let ok: Counter
    private let answers = Mutex<[String: Counter]>([:])
    private let notAnswered = Mutex<[String: Counter]>([:])
    private let events = Mutex<[String: Counter]>([:])
    private let retries = Mutex<[String: Counter]>([:])

    init(app: String, environment: String) {
        self.app = app
        self.environment = environment
        let dimensions = [("app", app), ("environment", environment)]
        latency = Metrics.Timer(label: "apns.client.latency", dimensions: dimensions)
        inFlight = Gauge(label: "apns.client.in_flight", dimensions: dimensions)
        waiting = Gauge(label: "apns.client.waiting", dimensions: dimensions)
        streamLimit = Gauge(label: "apns.client.stream_limit", dimensions: dimensions)
        usableConnections = Gauge(label: "apns.client.connections.usable", dimensions: dimensions)
        smallestStreamLimit = Gauge(label: "apns.client.stream_limit.min", dimensions: dimensions)
        connectionsByState = (
            Gauge(label: "apns.client.connections.open", dimensions: dimensions + [("state", "connecting")]),
            Gauge(label: "apns.client.connections.open", dimensions: dimensions + [("state", "ready")]),
            Gauge(label: "apns.client.connections.open", dimensions: dimensions + [("state", "going_away")])
        )
        tokensMinted = Counter(label: "apns.client.tokens_minted", dimensions: dimensions)
        ok = Counter(label: "apns.client.requests", dimensions: [("app", app), ("environment", environment), ("status", "200"), ("reason", "")])
    }

    func record(_ outcome: APNsOutcome) {
        switch outcome {
        case .answered(let response):
            latency.recordNanoseconds(Int64(response.latency.components.seconds) * 1_000_000_000 + response.latency.components.attoseconds / 1_000_000_000)
            if response.status == 200, response.reason == nil {
                ok.increment()
            } else {
                // The server's free text becomes a label only when it is a reason APNs documents.
                let reason = response.reason.map { $0.known != nil ? $0.rawValue : "unknown" } ?? ""
                counter(in: answers, key: "\(response.status) \(reason)") {
                    Counter(label: "apns.client.requests", dimensions: [("app", self.app), ("environment", self.environment), ("status", String(response.status)), ("reason", reason)])
                }.increment()
            }
        case .notAnswered(let why):
            let kind = why.kind.description
            counter(in: notAnswered, key: kind) {
                Counter(label: "apns.client.not_answered", dimensions: [("app", self.app), ("environment", self.environment), ("kind", kind)])
            }.increment()
        }
    }

    /// Records a batch of outcomes: 200s are counted once for the batch.
    func record<Outcomes: Sequence<APNsOutcome>>(_ outcomes: Outcomes) {
        var answeredOK = 0
        for outcome in outcomes {
            if case .answered(let response) = outcome, response.status == 200, response.reason == nil {
                latency.recordNanoseconds(Int64(response.latency.components.seconds) * 1_000_000_000 + response.latency.components.attoseconds / 1_000_000_000)
                answeredOK += 1
            } else {
                record(outcome)
            }
        }
        if answeredOK > 0 { ok.increment(by: answeredOK) }
    }

    func recordPool(streamLimit: Int, smallestStreamLimit: Int, connections: (connecting: Int, ready: Int, goingAway: Int), inFlight: Int) {
        self.streamLimit.record(streamLimit)
        self.smallestStreamLimit.record(smallestStreamLimit)
        usableConnections.record(connections.ready)
        connectionsByState.connecting.record(connections.connecting)
        connectionsByState.ready.record(connections.ready)
        connectionsByState.goingAway.record(connections.goingAway)
        self.inFlight.record(inFlight)
    }

    func recordWaiting(_ count: Int) {
        waiting.record(count)
    }

    func connectionEvent(_ event: String) {
        counter(in: events, key: event) {
            Counter(label: "apns.client.connections", dimensions: [("app", self.app), ("environment", self.environment), ("event", event)])
        }.increment()
    }

    func unprocessedRetry(_ kind: APNsNotAnswered.Kind) {
        let name = kind.description
        counter(in: retries, key: name) {
            Counter(label: "apns.client.unprocessed_retries", dimensions: [("app", self.app), ("environment", self.environment), ("kind", name)])
        }.increment()
    }

    private func counter(in table: borrowing Mutex<[String: Counter]>, key: String, make: () -> Counter) -> Counter {
        table.withLock { table in
            if let counter = table[key] { return counter }
            let counter = make()
            table[key] = counter
            return counter
        }
    }
}
