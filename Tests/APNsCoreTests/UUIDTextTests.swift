import APNsCore
import Testing

@Suite("apns-id text")
struct UUIDTextTests {
    @Test("a lowercase version-4 UUID in canonical form, different every time")
    func canonicalVersion4() {
        var generator = SplitMix64(seed: 42)
        var seen = Set<String>()
        for _ in 0..<1000 {
            let text = UUIDText.random(using: &generator)
            let bytes = Array(text.utf8)
            #expect(bytes.count == 36)
            for (index, byte) in bytes.enumerated() {
                if [8, 13, 18, 23].contains(index) {
                    #expect(byte == UInt8(ascii: "-"), "\(text)")
                } else {
                    #expect((UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(byte), "\(text)")
                }
            }
            #expect(bytes[14] == UInt8(ascii: "4"), "version 4: \(text)")
            #expect(Array("89ab".utf8).contains(bytes[19]), "variant 1: \(text)")
            seen.insert(text)
        }
        #expect(seen.count == 1000)
    }

    @Test("the same seed gives the same ids; the bits land where a UUID puts them")
    func deterministicLayout() {
        var zeros = ConstantGenerator(value: 0)
        #expect(UUIDText.random(using: &zeros) == "00000000-0000-4000-8000-000000000000")
        var ones = ConstantGenerator(value: .max)
        #expect(UUIDText.random(using: &ones) == "ffffffff-ffff-4fff-bfff-ffffffffffff")
        var first = SplitMix64(seed: 7)
        var second = SplitMix64(seed: 7)
        #expect(UUIDText.random(using: &first) == UUIDText.random(using: &second))
    }
}

private struct ConstantGenerator: RandomNumberGenerator {
    let value: UInt64
    mutating func next() -> UInt64 { value }
}
