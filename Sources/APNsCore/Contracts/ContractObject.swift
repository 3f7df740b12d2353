/// Why a result, token event or header set read from Kafka does not match its contract.
public struct ContractDecodingError: Error, Sendable, Hashable, CustomStringConvertible {
    public var contract: String
    public var field: String?
    public var message: String

    public init(contract: String, field: String? = nil, _ message: String) {
        self.contract = contract
        self.field = field
        self.message = message
    }

    public var description: String {
        guard let field else { return "\(contract): \(message)" }
        return "\(contract): \(field): \(message)"
    }
}

/// A JSON object read for one of the outgoing contracts, with typed, error-naming accessors.
/// Keys listed as raw keep their bytes (so `meta` is copied verbatim, never re-encoded).
struct ContractObject {
    let contract: String
    private var values: [String: JSONValue] = [:]
    private var rawRanges: [String: Range<Int>] = [:]

    init(_ bytes: [UInt8], contract: String, rawKeys: Set<String> = ["meta"]) throws(ContractDecodingError) {
        self.contract = contract
        var parser = JSONParser(bytes: bytes)
        do {
            try parser.beginObject()
            var first = true
            while let key = try parser.nextKey(first: first) {
                first = false
                if rawKeys.contains(key) {
                    rawRanges[key] = try parser.skipValueReturningRange()
                } else {
                    values[key] = try parser.parseValue()
                }
            }
            try parser.expectEnd()
        } catch {
            throw ContractDecodingError(contract: contract, error.description)
        }
    }

    private init(contract: String, members: [JSONMember]) {
        self.contract = contract
        for member in members { values[member.key] = member.value }
    }

    private func present(_ key: String) -> JSONValue? {
        guard let value = values[key], value != .null else { return nil }
        return value
    }

    private func mismatch(_ key: String, _ expected: String, _ value: JSONValue) -> ContractDecodingError {
        ContractDecodingError(contract: contract, field: key, "expected \(expected), got \(value.typeName)")
    }

    private func missing(_ key: String) -> ContractDecodingError {
        ContractDecodingError(contract: contract, field: key, "required field is missing")
    }

    func optionalString(_ key: String) throws(ContractDecodingError) -> String? {
        guard let value = present(key) else { return nil }
        guard case .string(let text) = value else { throw mismatch(key, "a string", value) }
        return text
    }

    func requiredString(_ key: String) throws(ContractDecodingError) -> String {
        guard let text = try optionalString(key) else { throw missing(key) }
        return text
    }

    func optionalInt(_ key: String) throws(ContractDecodingError) -> Int64? {
        guard let value = present(key) else { return nil }
        guard let number = value.int64 else { throw mismatch(key, "an integer", value) }
        return number
    }

    func requiredInt(_ key: String) throws(ContractDecodingError) -> Int64 {
        guard let number = try optionalInt(key) else { throw missing(key) }
        return number
    }

    func requiredDouble(_ key: String) throws(ContractDecodingError) -> Double {
        guard let value = present(key) else { throw missing(key) }
        guard let number = value.double else { throw mismatch(key, "a number", value) }
        return number
    }

    func requiredObject(_ key: String) throws(ContractDecodingError) -> ContractObject {
        guard let value = present(key) else { throw missing(key) }
        guard case .object(let members) = value else { throw mismatch(key, "an object", value) }
        return ContractObject(contract: contract, members: members)
    }

    func optionalRawObject(_ key: String, in bytes: [UInt8]) throws(ContractDecodingError) -> RawJSON? {
        guard let range = rawRanges[key] else { return nil }
        let slice = bytes[range]
        if slice.elementsEqual("null".utf8) { return nil }
        guard slice.first == UInt8(ascii: "{") else {
            throw ContractDecodingError(contract: contract, field: key, "expected an object")
        }
        return RawJSON(bytes: slice)
    }
}
