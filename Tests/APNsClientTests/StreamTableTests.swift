import APNsHTTP2
import Testing

@Suite("Stream table: the open streams of a connection by id")
struct StreamTableTests {
    @Test("Streams in flight are found, changed in place and removed")
    func directSlots() {
        var table = HTTP2StreamTable<String>(minimumCapacity: 4)
        for stream in stride(from: Int32(1), through: 15, by: 2) { table.insert("s\(stream)", for: stream) }
        #expect(table.count == 8)
        #expect(table.contains(7))
        #expect(!table.contains(17))
        if let location = table.location(of: 7) { table.update(7, at: location) { $0 += "!" } }
        #expect(table.removeValue(forKey: 7) == "s7!")
        #expect(table.removeValue(forKey: 7) == nil)
        #expect(table.count == 7)
        #expect(table.sortedKeys == [1, 3, 5, 9, 11, 13, 15])
    }

    @Test("A stream that outlives newer ones on its slot moves to the overflow and is still found")
    func longLivedStreamOverflows() {
        var table = HTTP2StreamTable<Int>(minimumCapacity: 4)  // 8 slots: stream 1 and 17 share one
        table.insert(1, for: 1)
        table.insert(17, for: 17)
        table.insert(33, for: 33)
        #expect(table.count == 3)
        let location = table.location(of: 33)
        #expect(location != nil)
        if let location { table.update(33, at: location) { $0 += 1 } }
        #expect(table.removeValue(forKey: 1) == 1)
        #expect(table.removeValue(forKey: 33) == 34)
        #expect(table.contains(17))
        table.insert(49, for: 49)
        let all = table.removeAll()
        #expect(all.map(\.stream) == [17, 49])
        #expect(table.isEmpty)
    }

    @Test("Replacing a stream kept in the overflow after its slot was freed keeps one entry")
    func replaceInOverflow() {
        var table = HTTP2StreamTable<Int>(minimumCapacity: 4)  // 8 slots: streams 1 and 17 share one
        table.insert(1, for: 1)
        table.insert(17, for: 17)  // to the overflow
        #expect(table.removeValue(forKey: 1) == 1)  // the shared slot is free again
        table.insert(170, for: 17)
        #expect(table.count == 1)
        #expect(table.removeValue(forKey: 17) == 170)
        #expect(table.removeValue(forKey: 17) == nil, "no older copy comes back")
        #expect(table.isEmpty)
    }
}
