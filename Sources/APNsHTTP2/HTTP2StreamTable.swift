/// A connection's open streams by stream id, looked up several times per request or response.
///
/// Client-initiated stream ids are odd and increasing, so `id >> 1` modulo a power of two at least
/// twice the stream limit maps the streams in flight to distinct slots: a direct-mapped table,
/// no hashing and no probing. A stream that outlives `slots` newer ones (and so meets a newer
/// stream on its slot) goes to a small dictionary instead. Confined to one event loop, like
/// its owner.
///
/// Inlinable, so that users in other modules get it specialized for their value type (unspecialized,
/// every call looked up generic metadata at run time).
public struct HTTP2StreamTable<Value> {
    @usableFromInline var keys: [Int32]
    @usableFromInline var values: [Value?]
    @usableFromInline let mask: Int
    @usableFromInline var overflow: [Int32: Value] = [:]
    @usableFromInline var entries = 0

    @inlinable
    public var count: Int { entries }

    @inlinable
    public init(minimumCapacity: Int = 64) {
        var size = 16
        while size < minimumCapacity * 2 { size <<= 1 }
        keys = Array(repeating: 0, count: size)
        values = Array(repeating: nil, count: size)
        mask = size - 1
    }

    @inlinable
    public var isEmpty: Bool { entries == 0 }

    @inlinable @inline(__always)
    func home(_ key: Int32) -> Int { Int(truncatingIfNeeded: key >> 1) & mask }

    /// Where `key` is: a slot of the direct-mapped table, or the overflow dictionary.
    public enum Location {
        case slot(Int)
        case overflow
    }

    @inlinable
    public func location(of key: Int32) -> Location? {
        let slot = home(key)
        if keys[slot] == key, key != 0 { return .slot(slot) }
        if !overflow.isEmpty, overflow[key] != nil { return .overflow }
        return nil
    }

    @inlinable
    public func contains(_ key: Int32) -> Bool { location(of: key) != nil }

    /// Changes the value of `key`, if present, in place.
    @inlinable
    public mutating func update(_ key: Int32, at location: Location, _ change: (inout Value) -> Void) {
        switch location {
        case .slot(let slot):
            // Taken out and put back, so the value is uniquely referenced while it changes.
            guard keys[slot] == key, var value = values[slot].take() else { return }
            change(&value)
            values[slot] = value
        case .overflow:
            if var value = overflow.removeValue(forKey: key) {
                change(&value)
                overflow[key] = value
            }
        }
    }

    /// Inserts or replaces the value of `key` (ids are positive).
    @inlinable
    public mutating func insert(_ value: consuming Value, for key: Int32) {
        let slot = home(key)
        if keys[slot] == key {
            values[slot] = value
        } else if keys[slot] == 0 {
            // A key in the overflow (its home slot was taken when it came, and freed since) is
            // replaced there, not stored a second time.
            if !overflow.isEmpty, overflow[key] != nil {
                overflow[key] = value
                return
            }
            keys[slot] = key
            values[slot] = value
            entries += 1
        } else if overflow.updateValue(value, forKey: key) == nil {
            entries += 1
        }
    }

    @inlinable
    public mutating func removeValue(forKey key: Int32) -> Value? {
        let slot = home(key)
        if keys[slot] == key, key != 0 {
            keys[slot] = 0
            entries -= 1
            return values[slot].take()
        }
        guard !overflow.isEmpty, let value = overflow.removeValue(forKey: key) else { return nil }
        entries -= 1
        return value
    }

    /// Every stream id in the table, in increasing order.
    @inlinable
    public var sortedKeys: [Int32] {
        (keys.filter { $0 != 0 } + overflow.keys).sorted()
    }

    /// Removes everything; returns the entries in increasing stream order.
    @inlinable
    public mutating func removeAll() -> [(stream: Int32, value: Value)] {
        var all: [(stream: Int32, value: Value)] = []
        all.reserveCapacity(count)
        for slot in keys.indices where keys[slot] != 0 {
            if let value = values[slot].take() { all.append((keys[slot], value)) }
            keys[slot] = 0
        }
        for (key, value) in overflow { all.append((key, value)) }
        overflow.removeAll()
        entries = 0
        return all.sorted { $0.stream < $1.stream }
    }

    /// Calls `body` for every entry (in no particular order).
    @inlinable
    public func forEach(_ body: (Int32, Value) -> Void) {
        for slot in keys.indices where keys[slot] != 0 {
            if let value = values[slot] { body(keys[slot], value) }
        }
        for (key, value) in overflow { body(key, value) }
    }
}
