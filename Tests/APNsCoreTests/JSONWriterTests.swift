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

    @Test("numbers at the edges of the digit path stay valid JSON: no trailing dot, no inf")
    func numbersAtTheEdges() throws {
        #expect(written(999_999_999_999_999.6, decimals: 0) == #"{"v":1000000000000000}"#)
        #expect(written(1e306, decimals: 3) == #"{"v":null}"#)
        for text in [written(999_999_999_999_999.6, decimals: 0), written(1e306)] {
            #expect((try? JSONParser.parse(Array(text.utf8))) != nil, "\(text)")
        }
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

    /// The escaping the writer must do, written the plain way: one byte at a time.
    private func referenceString(_ value: String) -> String {
        var out: [UInt8] = [UInt8(ascii: "\"")]
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "\""): out += Array(#"\""#.utf8)
            case UInt8(ascii: "\\"): out += Array(#"\\"#.utf8)
            case 0x0A: out += Array(#"\n"#.utf8)
            case 0x0D: out += Array(#"\r"#.utf8)
            case 0x09: out += Array(#"\t"#.utf8)
            case 0x00..<0x20, 0x7F: out += Array((#"\u00"# + (byte < 0x10 ? "0" : "") + String(byte, radix: 16)).utf8)
            default: out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
        return String(decoding: out, as: UTF8.self)
    }

    @Test("strings are escaped exactly as one byte at a time would: quotes, backslashes, controls, DEL, non-ASCII")
    func stringsAndIntegers() {
        var generator = SplitMix64(seed: 2027)
        // Mostly plain text, with every byte that needs care mixed in, at lengths around the
        // vector width (the fast path checks many bytes at once).
        let alphabet: [String] = ["a", "Z", "0", " ", "\"", "\\", "\n", "\r", "\t", "\u{0}", "\u{1F}", "\u{7F}", "é", "€", "😀", "/"]
        var values = ["", "plain", String(repeating: "x", count: 64), "\u{7F}", String(repeating: "a", count: 31) + "\""]
        for _ in 0..<3000 {
            let length = Int(generator.next() % 70)
            let plain = generator.next() % 2 == 0
            values.append((0..<length).map { _ in plain ? "q" : alphabet[Int(generator.next() % UInt64(alphabet.count))] }.joined())
        }
        for value in values {
            var writer = JSONWriter()
            writer.beginObject()
            writer.field("v", value)
            writer.field(JSONKey(value), 1 as Int?)
            writer.endObject()
            let expected = #"{"v":"# + referenceString(value) + "," + referenceString(value) + ":1}"
            #expect(String(decoding: writer.bytes, as: UTF8.self) == expected, "\(Array(value.utf8))")
        }
        for number: Int64 in [0, 1, -1, 9, 10, 99, 100, Int64.max, Int64.min, 1_767_225_600_123] {
            var writer = JSONWriter()
            writer.beginObject()
            writer.field("n", number as Int64?)
            writer.endObject()
            #expect(String(decoding: writer.bytes, as: UTF8.self) == #"{"n":\#(number)}"#)
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
