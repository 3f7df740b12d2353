/// The field rules of the job contract, shared by both encodings so that a header job and an
/// envelope job are judged alike and get the same reason text.
public enum JobRules {
    public static let maximumCollapseIDBytes = 64
    public static let maximumMetaBytes = 1024
    public static let maximumIdentifierBytes = 256

    /// Topic: non-empty, no control characters.
    public static func topic(_ text: String) throws(JobRejection) -> String {
        try checkText(text, field: "topic", maximumBytes: maximumIdentifierBytes)
        return text
    }

    public static func pushType(_ text: String) throws(JobRejection) -> PushType {
        guard let value = PushType(rawValue: text) else {
            throw JobRejection(field: "push_type", "unknown push type \(quoted(clip(text))); expected one of \(PushType.allNames)")
        }
        return value
    }

    public static func priority(_ value: Int64?, literal: String) throws(JobRejection) -> NotificationPriority {
        guard let value, let priority = NotificationPriority(rawValue: Int(value)) else {
            throw JobRejection(field: "priority", "priority is \(escaped(clip(literal))); it must be 10, 5 or 1")
        }
        return priority
    }

    /// The last second of year 9999: later "unix seconds" are almost surely milliseconds or
    /// nanoseconds, which would otherwise send a job long after its time or never expire it.
    public static let latestUnixSeconds: Int64 = 253_402_300_799

    public static func expiration(_ value: Int64?, literal: String) throws(JobRejection) -> Int64 {
        try unixSeconds(value, literal: literal, field: "expiration", meaning: "unix seconds, 0 for now-or-never")
    }

    public static func deadline(_ value: Int64?, literal: String) throws(JobRejection) -> Int64 {
        try unixSeconds(value, literal: literal, field: "deadline", meaning: "unix seconds")
    }

    /// A time field in unix seconds, up to `latestUnixSeconds`.
    private static func unixSeconds(_ value: Int64?, literal: String, field: String, meaning: String) throws(JobRejection) -> Int64 {
        guard let value, value >= 0 else {
            throw JobRejection(field: field, "\(field) is \(escaped(clip(literal))); it must be a non-negative integer (\(meaning))")
        }
        guard value <= latestUnixSeconds else {
            throw JobRejection(field: field, "\(field) is \(value); it must be unix seconds, at most \(latestUnixSeconds) (the end of year 9999): is it in milliseconds?")
        }
        return value
    }

    /// Collapse id: at most 64 bytes of UTF-8, no control characters (they could split headers).
    public static func collapseID(_ text: String) throws(JobRejection) -> String {
        let count = text.utf8.count
        guard count <= maximumCollapseIDBytes else {
            throw JobRejection(field: "collapse_id", "collapse id is \(count) bytes; at most \(maximumCollapseIDBytes) are allowed")
        }
        try checkText(text, field: "collapse_id", maximumBytes: maximumCollapseIDBytes)
        return text
    }

    /// `apns-id`: a canonical UUID, 8-4-4-4-12 hex digits.
    public static func apnsID(_ text: String) throws(JobRejection) -> String {
        let utf8 = Array(text.utf8)
        let hyphens: Set<Int> = [8, 13, 18, 23]
        let wellFormed = utf8.count == 36 && utf8.indices.allSatisfy { index in
            hyphens.contains(index) ? utf8[index] == UInt8(ascii: "-") : JSONParser.hexValue(utf8[index]) != nil
        }
        guard wellFormed else {
            throw JobRejection(field: "apns_id", "apns-id \(quoted(clip(text))) is not a canonical UUID (8-4-4-4-12 hex digits)")
        }
        return text.lowercased()
    }

    public static func environment(_ text: String) throws(JobRejection) -> APNsEnvironment {
        guard let value = APNsEnvironment(rawValue: text) else {
            throw JobRejection(field: "environment", "unknown environment \(quoted(clip(text))); expected production or sandbox")
        }
        return value
    }

    public static func identifier(_ text: String, field: String) throws(JobRejection) -> String {
        try checkText(text, field: field, maximumBytes: maximumIdentifierBytes)
        return text
    }

    public static func checkPayloadSize(_ count: Int, pushType: PushType) throws(JobRejection) {
        guard count <= pushType.maximumPayloadBytes else {
            throw JobRejection(
                field: "payload",
                "payload is \(count) bytes; at most \(pushType.maximumPayloadBytes) are allowed for push type \(pushType.rawValue)"
            )
        }
    }

    static func checkText(_ text: String, field: String, maximumBytes: Int) throws(JobRejection) {
        guard !text.isEmpty else { throw JobRejection(field: field, "\(field) is empty") }
        let count = text.utf8.count
        guard count <= maximumBytes else {
            throw JobRejection(field: field, "\(field) is \(count) bytes; at most \(maximumBytes) are allowed")
        }
        // Control characters are single bytes in UTF-8 (no multi-byte sequence contains one), so a
        // byte scan finds them; the scalars are walked only to say where, for the error.
        let isControl = { (byte: UInt8) in byte < 0x20 || byte == 0x7F }
        guard text.utf8.withContiguousStorageIfAvailable({ $0.contains(where: isControl) }) ?? text.utf8.contains(where: isControl) else { return }
        for (offset, scalar) in text.unicodeScalars.enumerated() where scalar.value < 0x20 || scalar.value == 0x7F {
            throw JobRejection(
                field: field,
                "\(field) contains control character U+\(String(scalar.value, radix: 16, uppercase: true).leftPadded(to: 4)) at position \(offset + 1)"
            )
        }
    }

    /// A value quoted for an error message, with anything unprintable escaped.
    public static func quoted(_ text: String) -> String {
        "\"" + escaped(text) + "\""
    }

    /// A value for an error message with anything unprintable escaped: a reason travels in a
    /// Kafka header, a result and a log line, where a raw CR, LF or NUL could forge a line.
    static func escaped(_ text: String) -> String {
        var out = ""
        for scalar in text.unicodeScalars {
            if scalar.value < 0x20 || scalar.value == 0x7F {
                out += "\\u" + String(scalar.value, radix: 16).leftPadded(to: 4)
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    /// An integer written as JSON writes it (`-?(0|[1-9][0-9]*)`), for header values: Swift's
    /// `Int64(_:)` also takes `+10` and `0010`, which an envelope job could not carry.
    public static func integer(_ text: String) -> Int64? {
        var digits = Substring(text)[...]
        if digits.first == "-" { digits = digits.dropFirst() }
        guard let first = digits.utf8.first, first >= UInt8(ascii: "0"), first <= UInt8(ascii: "9"),
            digits.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
            first != UInt8(ascii: "0") || digits.utf8.count == 1
        else { return nil }
        return Int64(text)
    }

    /// Long hostile values are cut in messages so that reasons stay readable. Counted in
    /// scalars, not Characters: one letter with 200,000 combining marks is one Character.
    public static func clip(_ text: String, to limit: Int = 40) -> String {
        let scalars = text.unicodeScalars
        guard scalars.count > limit else { return text }
        var clipped = String.UnicodeScalarView()
        clipped.append(contentsOf: scalars.prefix(limit))
        return String(clipped) + "…"
    }
}

extension String {
    func leftPadded(to width: Int, with pad: Character = "0") -> String {
        count >= width ? self : String(repeating: pad, count: width - count) + self
    }
}
