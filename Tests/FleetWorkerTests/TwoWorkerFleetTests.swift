import APNsCore
import APNsSimulator
import FleetTestSupport
import Foundation
import KafkaTransport
import Logging
import Testing

/// 10,000 jobs of every kind through two `apns-fleet worker` processes sharing the group, with
/// `kafka-dev` as a process and the simulator in this one.
@Suite("Two workers, 10,000 jobs", .timeLimit(.minutes(3)))
struct TwoWorkerFleetTests {
    @Test("each token gets its result, the DLQ holds exactly the unusable jobs, committed offsets reach the end")
    func tenThousandJobs() async throws {
        var logger = Logger(label: "two-worker-test")
        logger.logLevel = .warning
        let binary = try apnsFleetBinary()
        let directory = temporaryTestPath("apns-fleet-two-workers")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let partitions = 8
        let kafka = try await KafkaDevProcess.start(binary: binary, partitions: partitions)
        defer { kafka.process.kill() }

        let dead = (0..<50).map { String(format: "%08x", 0xdead_0000 + $0) + String(repeating: "de", count: 28) }
        let credentials = try DevCredentials.generate(topic: "com.example.app")
        let summary = try credentials.write(to: directory)
        var simulatorConfiguration = try credentials.simulatorConfiguration()
        simulatorConfiguration.listeners.http2TLSPort = 0
        simulatorConfiguration.behaviour.unregisteredTokens = Dictionary(uniqueKeysWithValues: dead.map { ($0, 1_767_225_600_000) })
        let simulator = try await APNsSimulator.start(simulatorConfiguration, logger: logger)
        let config = try writeFleetFile(
            directory: directory, summary: summary, simulatorPort: try #require(simulator.port(.http2TLS)), bootstrap: kafka.bootstrap,
            extra: "worker:\n  drain-timeout-seconds: 20"
        )

        // The jobs and what each (job, token) must get.
        var plan = JobPlan(count: 10_000, dead: dead)
        let notificationCount = plan.notifications
        let deadLetterCount = plan.deadLetters.count

        var client = KafkaClientConfiguration(bootstrapServers: [kafka.bootstrap])
        client.statisticsInterval = nil
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: client), logger: logger)
        var readerConfiguration = KafkaConsumerConfiguration(client: client, groupID: "reader", topics: ["apns.results", "apns.jobs.dlq"])
        readerConfiguration.sessionTimeout = .seconds(6)
        let reader = try KafkaConsumer(configuration: readerConfiguration, logger: logger)
        let results = Shared<[String: [NotificationResult]]>([:])
        let resultCount = Shared<Int>(0)
        let deadLetters = Collected<[UInt8]>()
        let derivedIDs = Collected<String>()

        // Both workers join before there is work, so that both get partitions and both do work.
        let workers = try ["w1", "w2"].map { try startWorker(binary: binary, config: config, id: $0) }
        defer { for worker in workers { worker.kill() } }

        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await producer.run() }
            group.addTask { try await reader.run() }
            group.addTask {
                for try await batch in reader.batches {
                    var decoded: [NotificationResult] = []
                    for record in batch {
                        if record.topic == "apns.jobs.dlq" {
                            deadLetters.append(record.value)
                        } else {
                            decoded.append(try NotificationResult(decoding: record.value))
                        }
                    }
                    results.update { results in
                        for result in decoded { results[JobPlan.key(result), default: []].append(result) }
                    }
                    resultCount.update { $0 += decoded.count }
                    reader.markFinished(batch)
                }
            }
            try await waitUntil("both workers to be assigned partitions", timeout: 40) {
                workers.allSatisfy { !$0.output(containing: "partitions assigned").isEmpty }
            }
            // Publish as fast as the producer takes them: acknowledgements are awaited together.
            try await withThrowingTaskGroup(of: Void.self) { publishing in
                for (index, job) in plan.jobs.enumerated() {
                    let malformed = plan.malformed.contains(index)
                    publishing.addTask {
                        let report = try await producer.send(job)
                        // A job that is not JSON gets an id from where it was read.
                        if malformed { derivedIDs.append("apns.jobs-\(report.partition)-\(report.offset)") }
                    }
                    if index % 1000 == 999 { try await publishing.waitForAll() }
                }
                try await publishing.waitForAll()
            }
            for id in derivedIDs.items { plan.expected["\(id)/"] = "invalid" }
            try await waitUntil("a result for every notification", timeout: 90) { resultCount.value >= notificationCount }
            try await waitUntil("the DLQ copies", timeout: 10) { deadLetters.count >= deadLetterCount }
            // Let a late duplicate arrive before judging.
            try await Task.sleep(for: .milliseconds(500))

            // A rolling stop, as a deployment does it: w1 drains, commits and leaves; w2 takes its
            // partitions over, then drains, commits and leaves. (Stopping both at once, the mock
            // cluster refuses the later commit with REBALANCE_IN_PROGRESS, because the other
            // member's leaving started a rebalance: duplicates on restart, not losses.)
            let assignedBefore = workers[1].output(containing: "partitions assigned").count
            workers[0].signal(SIGTERM)
            #expect(try await workers[0].waitForExit(timeout: 40) == 0, "a drained worker exits 0")
            try await waitUntil("w2 to take over w1's partitions", timeout: 30) {
                workers[1].output(containing: "partitions assigned").dropFirst(assignedBefore).contains { $0.contains("apns.jobs[") }
            }
            workers[1].signal(SIGTERM)
            #expect(try await workers[1].waitForExit(timeout: 40) == 0, "a drained worker exits 0")
            reader.close()
            await producer.shutdown(flushTimeout: .seconds(5))
            group.cancelAll()
        }
        await simulator.stop(gracePeriod: .zero)

        // Each notification has exactly its expected result; duplicates only from a rebalance.
        let seen = results.value
        let missing = plan.expected.keys.filter { seen[$0] == nil }
        #expect(missing.isEmpty, "lost: \(missing.sorted().prefix(5))")
        #expect(Set(seen.keys).subtracting(plan.expected.keys).isEmpty, "results nobody asked for: \(Set(seen.keys).subtracting(plan.expected.keys).prefix(5))")
        var wrong: [String] = []
        for (key, outcome) in plan.expected where seen[key]?.allSatisfy({ JobPlan.describe($0) == outcome }) != true {
            wrong.append("\(key): expected \(outcome), got \(seen[key]?.map(JobPlan.describe) ?? [])")
        }
        #expect(wrong.isEmpty, "\(wrong.count) wrong, e.g. \(wrong.prefix(3))")
        let duplicates = seen.values.reduce(0) { $0 + $1.count - 1 }
        // The workers joined before the jobs were published, so nothing should be redone; allow
        // one in-flight window of a worker in case the group rebalanced anyway.
        #expect(duplicates <= 1000, "duplicates: \(duplicates)")
        let workersSeen = Set(seen.values.flatMap { $0.map(\.worker) })
        #expect(workersSeen == ["w1", "w2"], "both workers sent notifications: \(workersSeen)")

        // The DLQ holds exactly the unusable jobs, byte for byte.
        var dlq = deadLetters.items.map { String(decoding: $0, as: UTF8.self) }
        var unusable = plan.deadLetters
        dlq.sort()
        unusable.sort()
        #expect(dlq.count == unusable.count, "DLQ: \(dlq.count), unusable jobs: \(unusable.count)")
        #expect(dlq == unusable)

        // Committed offsets: a new member of the group gets every partition and nothing to read.
        var checkConfiguration = KafkaConsumerConfiguration(client: client, groupID: "apns-fleet-push", topics: ["apns.jobs"])
        checkConfiguration.sessionTimeout = .seconds(6)
        let check = try KafkaConsumer(configuration: checkConfiguration, logger: logger)
        let leftOver = Shared<Int>(0)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await check.run() }
            group.addTask {
                for try await batch in check.batches {
                    leftOver.update { $0 += batch.count }
                    check.markFinished(batch)
                }
            }
            try await waitUntil("the check consumer's assignment", timeout: 30) { check.assignment.count == partitions }
            try await Task.sleep(for: .seconds(2))
            check.close()
            group.cancelAll()
        }
        #expect(leftOver.value == 0, "records after the committed offsets")
        if leftOver.value != 0 {
            for worker in workers { print(worker.lines.value.filter { !$0.contains("job is invalid") }.joined(separator: "\n")) }
        }
    }
}

/// 10,000 jobs: mostly good single-token jobs, with 410s, fan-outs and unusable jobs mixed in.
struct JobPlan {
    var jobs: [KafkaOutgoingMessage] = []
    /// "job/token" → "outcome[/status[/reason]]"; unusable jobs by their id alone ("job/").
    var expected: [String: String] = [:]
    /// The values the DLQ must hold.
    var deadLetters: [String] = []
    /// Indices of the jobs that are not JSON: their ids come from their offsets.
    var malformed: Set<Int> = []
    /// Before the ids of the malformed jobs are known.
    var notifications: Int { expected.count + malformed.count }

    init(count: Int, dead: [String]) {
        func token(_ index: Int, _ variant: Int = 0) -> String {
            String(format: "%056x%08x", variant, index)
        }
        func add(_ value: String, id: String, _ outcomes: [(token: String, outcome: String)], unusable: Bool = false) {
            jobs.append(KafkaOutgoingMessage(topic: "apns.jobs", key: Array(id.utf8), value: Array(value.utf8)))
            for (token, outcome) in outcomes { expected["\(id)/\(token)"] = outcome }
            if unusable { deadLetters.append(value) }
        }
        for index in 0..<count {
            let id = "j\(index)"
            let good = token(index)
            let gone = dead[index % dead.count]
            switch index % 50 {
            case 0:  // fan-out: two good devices and an unregistered one
                let other = token(index, 1)
                add(#"{"id":"\#(id)","tokens":["\#(good)","\#(gone)","\#(other)"],"payload":{"aps":{"alert":"fan"}}}"#, id: id, [
                    (good, "delivered/200"), (gone, "rejected/410/Unregistered"), (other, "delivered/200"),
                ])
            case 1, 2, 3, 4:  // unregistered
                add(#"{"id":"\#(id)","token":"\#(gone)","payload":{"aps":{}}}"#, id: id, [(gone, "rejected/410/Unregistered")])
            case 5:  // a token that is not hex
                add(#"{"id":"\#(id)","token":"not-a-token-\#(index)","payload":{}}"#, id: id, [("", "invalid")], unusable: true)
            case 6:  // over 4 KiB
                add(#"{"id":"\#(id)","token":"\#(good)","push_type":"alert","payload":{"b":"\#(String(repeating: "x", count: 4200))"}}"#, id: id, [("", "invalid")], unusable: true)
            case 7:  // not JSON at all: expected under the id derived from its offset, once published
                add("not JSON: \(id)", id: id, [], unusable: true)
                malformed.insert(index)
            case 8:  // an app nobody configured
                add(#"{"id":"\#(id)","token":"\#(good)","payload":{},"app":"ghost"}"#, id: id, [("", "invalid")], unusable: true)
            default:
                add(#"{"id":"\#(id)","token":"\#(good)","payload":{"aps":{"alert":"\#(index)"}}}"#, id: id, [(good, "delivered/200")])
            }
        }
    }

    static func key(_ result: NotificationResult) -> String {
        // Unusable jobs: matched by job id; whether their result names a token depends on how far
        // decoding got, so that is not part of the key.
        result.outcome == .invalid ? "\(result.jobID)/" : "\(result.jobID)/\(result.token)"
    }

    static func describe(_ result: NotificationResult) -> String {
        var text = result.outcome.rawValue
        if let status = result.status { text += "/\(status)" }
        if result.outcome == .rejected, let reason = result.reason { text += "/\(reason)" }
        return text
    }
}
