import FleetLoad
import Testing

@Suite("Reading a histogram from /metrics")
struct PrometheusHistogramTests {
    @Test("quantiles are bucket bounds; label sets and workers add up; other metrics are ignored")
    func quantiles() throws {
        let first = """
            # TYPE apns_worker_added_latency histogram
            apns_worker_added_latency_bucket{le="0.00025"} 10
            apns_worker_added_latency_bucket{le="0.001"} 80
            apns_worker_added_latency_bucket{le="0.002"} 97
            apns_worker_added_latency_bucket{le="+Inf"} 100
            apns_worker_added_latency_sum 0.07
            apns_worker_added_latency_count 100
            apns_client_latency_bucket{le="0.005"} 999
            """
        let second = """
            apns_worker_added_latency_bucket{app="b",le="0.00025"} 0
            apns_worker_added_latency_bucket{app="b",le="0.001"} 0
            apns_worker_added_latency_bucket{app="b",le="0.002"} 0
            apns_worker_added_latency_bucket{app="b",le="+Inf"} 100
            """
        let one = try #require(PrometheusHistogram(first, name: "apns_worker_added_latency"))
        #expect(one.count == 100)
        #expect(one.quantileUpperBound(0.5) == 0.001)
        #expect(one.quantileUpperBound(0.97) == 0.002)
        #expect(one.quantileUpperBound(0.99) == .infinity)

        let both = try #require(PrometheusHistogram(first + "\n" + second, name: "apns_worker_added_latency"))
        #expect(both.count == 200)
        #expect(both.quantileUpperBound(0.4) == 0.001)
        #expect(both.quantileUpperBound(0.5) == .infinity)

        // The window after a first reading: its 100 observations are gone, the second's 100
        // (all above 2 ms) are what is left.
        let window = both.subtracting(one)
        #expect(window.count == 100)
        #expect(window.quantileUpperBound(0.5) == .infinity)
        #expect(one.subtracting(one).quantileUpperBound(0.5) == nil)

        #expect(PrometheusHistogram(first, name: "apns_missing") == nil)
        #expect(PrometheusHistogram("apns_worker_added_latency_bucket{le=\"0.001\"} 0\n", name: "apns_worker_added_latency")?.quantileUpperBound(0.5) == nil)
    }
}
