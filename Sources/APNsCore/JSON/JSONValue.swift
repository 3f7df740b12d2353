/// A parsed JSON value.
///
/// Numbers keep their literal text so that integers of any size are judged exactly
/// (a priority of `1e400` or `10.0` is a different thing from `10`).
/// Object members keep their order, and duplicates are visible to the caller.
public enum JSONValue: Sendable, Hashable {
    case null
    case bool(Bool)
    case number(literal: String)
    case string(String)
    case array([JSONValue])
    case object([JSONMember])

    /// The name of this value's JSON type, for error messages ("expected a string, got an array").
    public var typeName: String {
        switch self {
        case .null: "null"
        case .bool: "a boolean"
        case .number: "a number"
        case .string: "a string"
        case .array: "an array"
        case .object: "an object"
        }
    }

    /// The value as an exact `Int64`, when it is a plain integer literal within range.
    public var int64: Int64? {
        guard case .number(let literal) = self else { return nil }
        return Int64(literal)
    }

    public var string: String? {
        guard case .string(let value) = self else { return nil }
        return value
    }

    public var double: Double? {
        guard case .number(let literal) = self else { return nil }
        return Double(literal)
    }

    /// The first member with this key, for objects.
    public subscript(key: String) -> JSONValue? {
        guard case .object(let members) = self else { return nil }
        return members.first(where: { $0.key == key })?.value
    }
}

public struct JSONMember: Sendable, Hashable {
    public var key: String
    public var value: JSONValue

    public init(key: String, value: JSONValue) {
        self.key = key
        self.value = value
    }
}

/// Why a byte sequence is not acceptable JSON, with the byte offset where it went wrong.
public struct JSONSyntaxError: Error, Sendable, Hashable, CustomStringConvertible {
    public var message: String
    public var offset: Int

    public init(_ message: String, at offset: Int) {
        self.message = message
        self.offset = offset
    }

    public var description: String { "invalid JSON at byte \(offset): \(message)" }
}
