import APNsCore
import Testing

@Suite("JSON writer and timestamps")
struct JSONWriterTests {
    private func written(_ value: Double, decimals: Int = 3) -> String {
        var writer = JSONWriter()
        writer.beginObject()
        writer.field("v", value, decimals: decimals)
        writer.endObject()
        return String(decoding: writer.bytes, as: UTF8.self)
    }

    /// What the writer printed before it wrote digits itself: Swift's own description of the
    /// rounded value (integers without a fraction).
    private func reference(_ value: Double, decimals: Int = 3) -> String {
        guard value.isFinite else { return #"{"v":null}"# }
        var scale = 1.0
        for _ in 0..<decimals { scale *= 10 }
        let rounded = (value * scale).rounded() / scale
        if rounded == rounded.rounded(), abs(rounded) < 1e15 { return #"{"v":\#(Int64(rounded))}"# }
        return #"{"v":\#(rounded)}"#
    }

    @Test("numbers come out as Swift's description of the rounded value: latencies, negatives, edges")
    func doublesMatchTheDescription() {
        var generator = SplitMix64(seed: 2026)
        var values: [Double] = [0, -0.0, 0.0004, 0.0005, 0.001, 0.1, 0.25, 1.5, 31.4, 999.9995, 12_345.678, -2.5, -0.001, 1e12 + 0.5, .nan, .infinity]
        for _ in 0..<5000 { values.append(Double(generator.next() % 10_000_000) / 997.0) }
        for _ in 0..<1000 { values.append(-Double(generator.next() % 1_000_000) / 13.0) }
        for value in values {
            #expect(written(value) == reference(value), "\(value)")
            #expect(written(value, decimals: 1) == reference(value, decimals: 1), "\(value)")
        }
    }

    @Test("nested objects and arrays get their commas right")
    func commas() {
        var writer = JSONWriter()
        writer.beginObject()
        writer.field("a", 1 as Int?)
        writer.beginObject("b")
        writer.field("c", "x")
        writer.beginArray("d")
        writer.element("e")
        writer.element("f")
        writer.endArray()
        writer.endObject()
        writer.field("g", true)
        writer.endObject()
        #expect(String(decoding: writer.bytes, as: UTF8.self) == #"{"a":1,"b":{"c":"x","d":["e","f"]},"g":true}"#)
    }

    @Test("timestamps are RFC 3339 UTC with milliseconds, written in place, and read back")
    func timestamps() {
        #expect(UnixMillis(0).rfc3339 == "1970-01-01T00:00:00.000Z")
        #expect(UnixMillis(-1).rfc3339 == "1969-12-31T23:59:59.999Z")
        #expect(UnixMillis(1_767_225_600_123).rfc3339 == "2026-01-01T00:00:00.123Z")
        #expect(UnixMillis(951_782_400_000).rfc3339 == "2000-02-29T00:00:00.000Z")
        var writer = JSONWriter()
        writer.beginObject()
        writer.field("t", UnixMillis(1_767_225_600_123))
        writer.endObject()
        #expect(String(decoding: writer.bytes, as: UTF8.self) == #"{"t":"2026-01-01T00:00:00.123Z"}"#)
        var generator = SplitMix64(seed: 7)
        for _ in 0..<2000 {
            let millis = Int64(generator.next() % 4_102_444_800_000)  // 1970 … 2100
            let text = UnixMillis(millis).rfc3339
            #expect(text.utf8.count == 24, "\(text)")
            #expect(UnixMillis(rfc3339: text)?.value == millis, "\(millis) → \(text)")
        }
    }
}
