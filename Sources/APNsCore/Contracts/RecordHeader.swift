/// One Kafka record header. Kafka allows a header without a value, and allows a key to repeat.
public struct RecordHeader: Sendable, Hashable {
    public var key: String
    public var value: [UInt8]?

    public init(key: String, value: [UInt8]?) {
        self.key = key
        self.value = value
    }

    public init(_ key: String, _ text: String) {
        self.key = key
        self.value = Array(text.utf8)
    }

    /// Bytes of the key and the value (what Kafka's size limits count, besides length fields).
    public var byteCount: Int { key.utf8.count + (value?.count ?? 0) }

    /// The value as text, when it is valid UTF-8.
    public var text: String? {
        guard let value, UTF8Validation.isValid(value) else { return nil }
        return String(decoding: value, as: UTF8.self)
    }
}

extension Array where Element == RecordHeader {
    /// The value of the first header with this key, as text.
    public func text(_ key: String) -> String? {
        first(where: { $0.key == key })?.text
    }
}
