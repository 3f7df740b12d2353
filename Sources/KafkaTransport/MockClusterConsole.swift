/// A line-oriented control language for a ``MockKafkaCluster``, used by `apns-fleet kafka-dev` on
/// stdin so that reliability tests in other processes can inject faults. Each command returns one
/// line: `ok ...` or `error: ...`.
public struct MockClusterConsole: Sendable {
    public let cluster: MockKafkaCluster

    public init(cluster: MockKafkaCluster) {
        self.cluster = cluster
    }

    public static let help = """
        commands (one per line; each answers "ok ..." or "error: ..."):
          broker-down BROKER                    take a broker down (ids 1..N)
          broker-up BROKER                      bring it back
          rtt BROKER MILLISECONDS               delay the broker's responses
          request-errors API COUNT ERROR        fail the next COUNT requests of API with ERROR
                                                (e.g. request-errors Produce 3 NOT_LEADER_FOR_PARTITION)
          clear-request-errors API              forget pushed errors of API
          leader TOPIC PARTITION BROKER         move a partition's leader
          create-topic TOPIC PARTITIONS [RF]    create a topic
          bootstrap                             print the bootstrap servers
          help                                  this text
        APIs: \(KafkaAPIKey.knownNames.joined(separator: ", ")) (or a number)
        ERROR: a librdkafka error name (NOT_LEADER_FOR_PARTITION, REQUEST_TIMED_OUT, ...) or number
        """

    /// Runs one command line and returns the answer (without a trailing newline; `help` answers
    /// several lines, the last one starting with `ok`).
    public func execute(_ line: String) -> String {
        let words = line.split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
        guard let command = words.first?.lowercased() else { return "error: empty command (try help)" }
        let arguments = Array(words.dropFirst())
        do {
            return try run(command, arguments)
        } catch let error as KafkaError {
            return "error: \(error.message)"
        } catch {
            return "error: \(error)"
        }
    }

    private func run(_ command: String, _ arguments: [String]) throws -> String {
        switch command {
        case "help", "?":
            return Self.help + "\nok help"
        case "bootstrap":
            try expect(arguments, 0, "bootstrap")
            return "ok \(cluster.bootstrapServers)"
        case "broker-down", "broker-up":
            try expect(arguments, 1, "\(command) BROKER")
            let broker = try int32(arguments[0], "broker id")
            if command == "broker-down" { try cluster.setBrokerDown(broker) } else { try cluster.setBrokerUp(broker) }
            return "ok broker \(broker) \(command == "broker-down" ? "down" : "up")"
        case "rtt":
            try expect(arguments, 2, "rtt BROKER MILLISECONDS")
            let broker = try int32(arguments[0], "broker id")
            let milliseconds = try int(arguments[1], "milliseconds")
            try cluster.setRoundTripTime(broker: broker, milliseconds: milliseconds)
            return "ok broker \(broker) rtt \(milliseconds) ms"
        case "request-errors":
            try expect(arguments, 3, "request-errors API COUNT ERROR")
            let api = try apiKey(arguments[0])
            let count = try int(arguments[1], "count")
            guard count >= 1, count <= 100_000 else { throw usage("count must be 1...100000, not \(count)") }
            guard let code = KafkaErrorCodes.code(named: arguments[2]) else {
                throw usage("unknown error '\(arguments[2])' (use a librdkafka error name such as NOT_LEADER_FOR_PARTITION)")
            }
            cluster.pushRequestErrors(api: api, errors: Array(repeating: code, count: count))
            return "ok next \(count) \(api) request(s) fail with \(KafkaErrorCodes.name(of: code))"
        case "clear-request-errors":
            try expect(arguments, 1, "clear-request-errors API")
            let api = try apiKey(arguments[0])
            cluster.clearRequestErrors(api: api)
            return "ok cleared \(api) errors"
        case "leader":
            try expect(arguments, 3, "leader TOPIC PARTITION BROKER")
            let partition = try int32(arguments[1], "partition")
            let broker = try int32(arguments[2], "broker id")
            try cluster.setPartitionLeader(topic: arguments[0], partition: partition, broker: broker)
            return "ok \(arguments[0])[\(partition)] leader is broker \(broker)"
        case "create-topic":
            guard arguments.count == 2 || arguments.count == 3 else {
                throw usage("usage: create-topic TOPIC PARTITIONS [REPLICATION_FACTOR]")
            }
            let partitions = try int(arguments[1], "partitions")
            let replication = arguments.count == 3 ? try int(arguments[2], "replication factor") : 1
            try cluster.createTopic(arguments[0], partitions: partitions, replicationFactor: replication)
            return "ok created \(arguments[0]) with \(partitions) partition(s)"
        default:
            throw usage("unknown command '\(command)' (try help)")
        }
    }

    private func expect(_ arguments: [String], _ count: Int, _ form: String) throws(KafkaError) {
        guard arguments.count == count else { throw usage("usage: \(form)") }
    }

    private func usage(_ message: String) -> KafkaError {
        KafkaError(code: .invalidArgument, message: message)
    }

    private func int(_ text: String, _ what: String) throws(KafkaError) -> Int {
        guard let value = Int(text) else { throw usage("\(what) must be a number, not '\(text)'") }
        return value
    }

    private func int32(_ text: String, _ what: String) throws(KafkaError) -> Int32 {
        guard let value = Int32(text) else { throw usage("\(what) must be a number, not '\(text)'") }
        return value
    }

    private func apiKey(_ text: String) throws(KafkaError) -> KafkaAPIKey {
        guard let api = KafkaAPIKey(name: text) else {
            throw usage("unknown API '\(text)' (known: \(KafkaAPIKey.knownNames.joined(separator: ", ")))")
        }
        return api
    }
}
