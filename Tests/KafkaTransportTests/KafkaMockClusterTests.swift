import FleetLoad
import FleetTestSupport
import APNsCore
import Foundation
import KafkaTransport
import Logging
import Prometheus
import Synchronization
import Testing

@Suite("Kafka against the mock cluster", .timeLimit(.minutes(3)))
struct KafkaMockClusterTests {
    @Test func produceConsumeRoundTripWithKeysAndHeaders() async throws {
        let (cluster, producer) = try clusterWithProducer(topic: "rt", partitions: 3)

        var reports: [String: KafkaDeliveryReport] = [:]
        var partitionOfKey: [String: Int32] = [:]
        for index in 0..<30 {
            let key = "key-\(index % 5)"
            let message = KafkaOutgoingMessage(
                topic: "rt",
                key: key.bytes,
                value: "value-\(index)".bytes,
                headers: [RecordHeader("attempt", "\(index)"), RecordHeader(key: "empty", value: nil)]
            )
            let report = try await producer.send(message)
            #expect(report.topic == "rt")
            reports["value-\(index)"] = report
            // One key, one partition.
            if let earlier = partitionOfKey[key] { #expect(earlier == report.partition) }
            partitionOfKey[key] = report.partition
        }

        let received = ReceivedRecords()
        let consumer = try KafkaConsumer(
            configuration: consumerConfiguration(cluster, group: "rt-group", topics: ["rt"]),
            logger: testLogger
        )
        try await withTimeout(90, "30 records") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await consumer.run() }
                group.addTask { await consumeLoop(consumer, into: received) }
                try await waitUntil("30 records") { received.count >= 30 }
                consumer.close()
                try await group.waitForAll()
            }
        }
        let records = received.all
        #expect(records.count == 30)
        for record in records {
            let value = String(decoding: record.value, as: UTF8.self)
            let index = Int(value.dropFirst("value-".count)) ?? -1
            #expect(record.topic == "rt")
            #expect(record.key == "key-\(index % 5)".bytes)
            #expect(record.headers == [RecordHeader("attempt", "\(index)"), RecordHeader(key: "empty", value: nil)])
            #expect(record.timestamp != nil)
            #expect(reports[value]?.partition == record.partition)
            #expect(reports[value]?.offset == record.offset)
        }

        // The group's offsets were stored and committed: a new member gets only new records.
        for index in 0..<5 {
            try await producer.send(KafkaOutgoingMessage(topic: "rt", key: "late".bytes, value: "late-\(index)".bytes))
        }
        let again = ReceivedRecords()
        let second = try KafkaConsumer(
            configuration: consumerConfiguration(cluster, group: "rt-group", topics: ["rt"]),
            logger: testLogger
        )
        try await withTimeout(90, "5 late records") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await second.run() }
                group.addTask { await consumeLoop(second, into: again) }
                try await waitUntil("5 late records") { again.count >= 5 }
                consumer.close()
                second.close()
                try await group.waitForAll()
            }
        }
        let values = again.all.map { String(decoding: $0.value, as: UTF8.self) }
        #expect(values.sorted() == (0..<5).map { "late-\($0)" })
        await producer.shutdown(flushTimeout: .seconds(10))
    }

    @Test("a member that stops with work in flight drains it, commits it and leaves the group: the other takes over without waiting out the session timeout")
    func closeLeavesGroup() async throws {
        let (cluster, producer) = try clusterWithProducer(topic: "handover", partitions: 2)
        let configuration = consumerConfiguration(cluster, group: "handover-group", topics: ["handover"])
        let first = try KafkaConsumer(configuration: configuration, logger: testLogger)
        let second = try KafkaConsumer(configuration: configuration, logger: testLogger)
        let firstReceived = ReceivedRecords()
        let secondReceived = ReceivedRecords()
        try await withTimeout(90, "the handover") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await first.run() }
                group.addTask { try await second.run() }
                // The first member finishes each record half a second after taking it: the
                // close's revocation has work to wait for.
                group.addTask { await consumeLoop(first, into: firstReceived, finishDelay: .milliseconds(500)) }
                group.addTask { await consumeLoop(second, into: secondReceived) }
                try await waitUntil("one partition each") { first.assignment.count == 1 && second.assignment.count == 1 }
                let partition = try #require(first.assignment.first).partition
                for index in 0..<5 {
                    try await producer.send(KafkaOutgoingMessage(topic: "handover", partition: partition, value: "h\(index)".bytes))
                }
                try await waitUntil("the first member to take them") { firstReceived.count == 5 }
                let closedAt = ContinuousClock.now
                first.close()
                // With a LeaveGroup, the mock cluster rebalances in about session.timeout.ms - 1 s
                // (5 s); without one it first waits for the session to expire (6 s more).
                try await waitUntil("the second member to own both partitions", timeout: 30) { second.assignment.count == 2 }
                let handover = ContinuousClock.now - closedAt
                #expect(handover < .milliseconds(8500), "took \(handover): the first member did not leave the group")
                // Finished during the close's drain and committed: not taken again.
                try await Task.sleep(for: .seconds(1))
                #expect(secondReceived.count == 0)
                second.close()
                try await group.waitForAll()
            }
        }
        await producer.shutdown(flushTimeout: .seconds(5))
    }

    @Test("a failed offset commit is reported until one succeeds, and the close's own commit counts too")
    func commitFailuresAreReported() async throws {
        let (cluster, producer) = try clusterWithProducer(topic: "commits", partitions: 1)
        let configuration = consumerConfiguration(cluster, group: "commits-group", topics: ["commits"])
        let consumer = try KafkaConsumer(configuration: configuration, logger: testLogger)
        let received = ReceivedRecords()
        let offsetMetadataTooLarge = try #require(KafkaErrorCodes.code(named: "OFFSET_METADATA_TOO_LARGE"))
        try await withTimeout(60, "the commits") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await consumer.run() }
                group.addTask { await consumeLoop(consumer, into: received) }
                try await waitUntil("the partition to be assigned") { consumer.assignment.count == 1 }
                // Refused for good (librdkafka does not retry it); every commit fails until the
                // errors are cleared, so the failure stays reported however slowly this test runs.
                cluster.pushRequestErrors(api: .offsetCommit, errors: Array(repeating: offsetMetadataTooLarge, count: 1000))
                try await producer.send(KafkaOutgoingMessage(topic: "commits", value: "first".bytes))
                try await waitUntil("the failure to be reported") { consumer.lastCommitFailure != nil }
                #expect(consumer.lastCommitFailure == "OFFSET_METADATA_TOO_LARGE for 1 of 1 partitions")
                // A later automatic commit sends the same offset again, and succeeds.
                cluster.clearRequestErrors(api: .offsetCommit)
                try await waitUntil("a commit to succeed") { consumer.lastCommitFailure == nil }

                // From here every commit fails, the close's revocation's among them.
                cluster.pushRequestErrors(api: .offsetCommit, errors: Array(repeating: offsetMetadataTooLarge, count: 100))
                try await producer.send(KafkaOutgoingMessage(topic: "commits", value: "second".bytes))
                try await waitUntil("the second record to be finished") { received.count == 2 && consumer.inFlight == 0 }
                consumer.close()
                try await group.waitForAll()
            }
        }
        #expect(consumer.lastCommitFailure?.hasPrefix("OFFSET_METADATA_TOO_LARGE") == true, "the close's commit failed, and the stop must be able to say so")
        cluster.clearRequestErrors(api: .offsetCommit)
        await producer.shutdown(flushTimeout: .seconds(5))
    }

    @Test("records still unfinished when the closing drain runs out of time are counted, for the stop to report")
    func unfinishedAtClose() async throws {
        let (cluster, producer) = try clusterWithProducer(topic: "stuck", partitions: 1)
        for index in 0..<5 {
            try producer.send(KafkaOutgoingMessage(topic: "stuck", key: nil, value: "v\(index)".bytes)) { _ in }
        }
        try await producer.flush(timeout: .seconds(30))
        var configuration = consumerConfiguration(cluster, group: "stuck-group", topics: ["stuck"])
        configuration.drainTimeout = .milliseconds(300)
        let consumer = try KafkaConsumer(configuration: configuration, logger: testLogger)
        let received = ReceivedRecords()
        try await withTimeout(60, "the close") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await consumer.run() }
                // Takes records and never finishes them: a worker stuck on APNs at SIGTERM.
                group.addTask { for await batch in consumer.batches { received.append(batch) } }
                try await waitUntil("the records to be taken") { received.count == 5 }
                consumer.close()
                try await group.waitForAll()
            }
        }
        #expect(consumer.recordsLeftUnfinished == 5)
        await producer.shutdown(flushTimeout: .seconds(5))
    }

    @Test("a rebalance drain that ran out of time earlier is not reported again by a clean close")
    func earlierDrainTimeoutNotReportedAtClose() async throws {
        let (cluster, producer) = try clusterWithProducer(topic: "held", partitions: 2)
        for index in 0..<10 {
            try await producer.send(KafkaOutgoingMessage(topic: "held", key: "k\(index)".bytes, value: "v\(index)".bytes))
        }
        var configuration = consumerConfiguration(cluster, group: "held-group", topics: ["held"])
        configuration.drainTimeout = .milliseconds(300)
        let a = try KafkaConsumer(configuration: configuration, logger: testLogger)
        let b = try KafkaConsumer(configuration: consumerConfiguration(cluster, group: "held-group", topics: ["held"]), logger: testLogger)
        let received = ReceivedRecords()
        let held = Shared<[KafkaRecord]>([])
        try await withTimeout(120, "the rebalance and the close") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await a.run() }
                // A holds what it takes unfinished: the revocation when B joins runs out of time.
                group.addTask { for await batch in a.batches { held.update { $0 += batch } } }
                try await waitUntil("A to take every record") { held.value.count == 10 }
                group.addTask { try await b.run() }
                group.addTask { await consumeLoop(b, into: received) }
                try await waitUntil("the rebalance to give B a partition") { !b.assignment.isEmpty && a.assignment.count == 1 }
                try await waitUntil("A's drain to have run out of time") { a.recordsLeftUnfinished > 0 }
                // A then finishes everything it still holds, and closes cleanly.
                a.markFinished(held.value)
                try await Task.sleep(for: .milliseconds(300))
                a.close()
                b.close()
                try await group.waitForAll()
            }
        }
        #expect(a.recordsLeftUnfinished == 0, "the final drain finished; the earlier one was logged when it happened")
        await producer.shutdown(flushTimeout: .seconds(5))
    }

    @Test("records of a revoking partition its holder will not start are left to the next owner: the drain does not wait for them")
    func unstartedRecordsAreLeftToTheNextOwner() async throws {
        let (cluster, producer) = try clusterWithProducer(topic: "handed", partitions: 2)
        for partition in Int32(0)..<2 {
            for index in 0..<5 {
                try await producer.send(KafkaOutgoingMessage(topic: "handed", partition: partition, key: nil, value: "p\(partition)-\(index)".bytes))
            }
        }
        // Far longer than the test waits: a drain that waited for the records would time out.
        var configurationA = consumerConfiguration(cluster, group: "handed-group", topics: ["handed"])
        configurationA.drainTimeout = .seconds(40)
        let a = try KafkaConsumer(configuration: configurationA, logger: testLogger)
        let b = try KafkaConsumer(configuration: consumerConfiguration(cluster, group: "handed-group", topics: ["handed"]), logger: testLogger)
        let receivedB = ReceivedRecords()
        let held = Shared<[KafkaRecord]>([])
        let leftAt = Shared<ContinuousClock.Instant?>(nil)
        let left = Shared<[KafkaRecord]>([])
        try await withTimeout(120, "the rebalance and the close") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await a.run() }
                group.addTask { for await batch in a.batches { held.update { $0 += batch } } }
                try await waitUntil("A to take every record") { held.value.count == 10 }
                // The first record of each partition is done; the rest wait, as behind a full
                // in-flight bound.
                let firsts = held.value.filter { $0.offset == 0 }
                a.markFinished(firsts)
                // Time for the periodic commit (every 200 ms) before the group rebalances.
                try await Task.sleep(for: .seconds(1))
                let waiting = held.value.filter { $0.offset > 0 }
                let rebalancesBefore = a.rebalances
                group.addTask { try await b.run() }
                group.addTask { await consumeLoop(b, into: receivedB) }
                // A, seeing a rebalance start, asks before starting each waiting record.
                try await waitUntil("A to be refused the records of a revoking partition") {
                    guard a.rebalances != rebalancesBefore else { return false }
                    let refused = waiting.filter { record in !left.value.contains { $0.offset == record.offset && $0.partition == record.partition } && !a.claim(record) }
                    if !refused.isEmpty {
                        left.update { $0 += refused }
                        if leftAt.value == nil { leftAt.update { $0 = .now } }
                    }
                    return left.value.count == 4
                }
                try await waitUntil("the revocation to end") { a.assignment.count == 1 }
                let drained = try #require(leftAt.value).duration(to: .now)
                #expect(drained < .seconds(10), "the drain took \(drained); it waited for records never started")
                try await waitUntil("B to consume what A left") { receivedB.count >= 4 }
                // A finishes the records of the partition it kept, and closes cleanly.
                let kept = waiting.filter { record in !left.value.contains { $0.partition == record.partition } }
                #expect(kept.count == 4 && kept.allSatisfy { a.claim($0) }, "the kept partition's records may start")
                a.markFinished(kept)
                try await Task.sleep(for: .milliseconds(500))
                a.close()
                b.close()
                try await group.waitForAll()
            }
        }
        let revoked = try #require(left.value.first?.partition)
        #expect(Set(left.value.map(\.partition)) == [revoked], "only the revoked partition's records were refused")
        // B gets every record A left: the offset stored for the partition stayed below them. (It
        // may redo the finished first one too: the mock cluster refuses commits while the group
        // rebalances, so the commit of offset 1 can miss the hand-over.)
        let ofRevoked = receivedB.all.filter { $0.partition == revoked }.map(\.offset).sorted()
        #expect(ofRevoked == [1, 2, 3, 4] || ofRevoked == [0, 1, 2, 3, 4], "B received offsets \(ofRevoked)")
        #expect(a.recordsLeftUnfinished == 0)
        await producer.shutdown(flushTimeout: .seconds(5))
    }

    @Test func twoConsumersSplitPartitionsThroughARebalanceWithoutLoss() async throws {
        let cluster = try MockKafkaCluster(brokers: 3, logger: testLogger)
        try cluster.createTopic("split", partitions: 6)
        let producer = try KafkaProducer(configuration: producerConfiguration(cluster), logger: testLogger)
        let deliveries = Deliveries()
        let stopProducing = Shared(false)

        let receivedA = ReceivedRecords()
        let receivedB = ReceivedRecords()
        let revokedFromA = Shared<[TopicPartition]>([])
        let revokedBeforeClose = Shared<[TopicPartition]>([])
        let producedAll = Shared(false)
        // Each consumer reports to a registry of its own, as each worker process has its own /metrics.
        let (metricsA, metricsB) = (PrometheusCollectorRegistry(), PrometheusCollectorRegistry())
        var configurationA = consumerConfiguration(cluster, group: "split-group", topics: ["split"])
        configurationA.client.metricsFactory = PrometheusMetricsFactory(registry: metricsA)
        var configurationB = consumerConfiguration(cluster, group: "split-group", topics: ["split"])
        configurationB.client.metricsFactory = PrometheusMetricsFactory(registry: metricsB)
        let a = try KafkaConsumer(
            configuration: configurationA,
            logger: testLogger,
            onRevoke: { partitions in revokedFromA.update { $0.append(contentsOf: partitions) } }
        )
        let b = try KafkaConsumer(configuration: configurationB, logger: testLogger)

        try await withTimeout(150, "the split") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                // A steady stream, so that records are produced and in flight during the rebalance.
                group.addTask {
                    var index = 0
                    while !stopProducing.value {
                        for _ in 0..<20 {
                            let message = KafkaOutgoingMessage(topic: "split", key: "k\(index)".bytes, value: "v\(index)".bytes)
                            try producer.send(message) { deliveries.record($0) }
                            index += 1
                        }
                        try await Task.sleep(for: .milliseconds(10))
                    }
                    try await producer.flush(timeout: .seconds(60))
                    producedAll.update { $0 = true }
                }
                group.addTask { try await a.run() }
                // A finishes each batch 20 ms later, so a revocation finds work in flight.
                group.addTask { await consumeLoop(a, into: receivedA, finishDelay: .milliseconds(20)) }
                try await waitUntil("A to consume") { receivedA.count >= 300 }
                try await waitUntil("A to report the lag of all 6 partitions") { lagPartitions(metricsA).count == 6 }

                group.addTask { try await b.run() }
                group.addTask { await consumeLoop(b, into: receivedB) }
                try await waitUntil("B to get partitions and records") { receivedB.count >= 300 }
                try await waitUntil("a disjoint split of all 6 partitions") {
                    let (ofA, ofB) = (Set(a.assignment), Set(b.assignment))
                    return !ofA.isEmpty && !ofB.isEmpty && ofA.isDisjoint(with: ofB) && ofA.union(ofB).count == 6
                }
                // Each reports the lag of its own partitions only: A dropped the gauges of those it
                // gave up (a sum over the group would count them twice otherwise).
                try await waitUntil("each to report the lag of its partitions") {
                    lagPartitions(metricsB) == Set(b.assignment.map(\.partition))
                }
                #expect(lagPartitions(metricsA) == Set(a.assignment.map(\.partition)))
                stopProducing.update { $0 = true }
                revokedBeforeClose.update { $0 = revokedFromA.value }
                // Once the producer has flushed: records it was still sending would be delivered
                // after this check, and never consumed once the consumers close.
                try await waitUntil("every delivered record consumed") {
                    guard producedAll.value else { return false }
                    let delivered = deliveries.delivered
                    return delivered.count > 0 && delivered.isSubset(of: receivedA.positions.union(receivedB.positions))
                }
                a.close()
                b.close()
                try await group.waitForAll()
            }
        }
        #expect(deliveries.failures.isEmpty)
        #expect(a.recordsLeftUnfinished == 0 && b.recordsLeftUnfinished == 0, "every drain finished in time")
        let revoked = revokedBeforeClose.value
        #expect(!revoked.isEmpty, "A's revocation hook ran when B joined")
        // The partitions taken from A went to B, which consumed them.
        let partitionsOfB = Set(receivedB.all.map(\.partition))
        #expect(Set(revoked.map(\.partition)).isSubset(of: partitionsOfB))
        #expect(deliveries.delivered.isSubset(of: receivedA.positions.union(receivedB.positions)))
        await producer.shutdown(flushTimeout: .seconds(5))
    }

    @Test func pauseStopsFetchingAndResumeContinues() async throws {
        let (cluster, producer) = try clusterWithProducer(topic: "pause", partitions: 2)
        let received = ReceivedRecords()
        let consumer = try KafkaConsumer(
            configuration: consumerConfiguration(cluster, group: "pause-group", topics: ["pause"]),
            logger: testLogger
        )
        try await withTimeout(90, "pause and resume") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await consumer.run() }
                group.addTask { await consumeLoop(consumer, into: received) }
                for index in 0..<10 {
                    try await producer.send(KafkaOutgoingMessage(topic: "pause", value: "before-\(index)".bytes))
                }
                try await waitUntil("the first 10 records") { received.count >= 10 }

                consumer.pauseAll()
                try await waitUntil("both partitions paused") { consumer.pausedPartitions.count == 2 }
                for index in 0..<20 {
                    try await producer.send(KafkaOutgoingMessage(topic: "pause", value: "while-paused-\(index)".bytes))
                }
                // A negative check needs time: nothing may arrive while paused.
                try await Task.sleep(for: .seconds(1.5))
                #expect(received.count == 10)
                #expect(consumer.assignment.count == 2, "still in the group: polling went on")
                // Nothing is fetched, yet the lag grows with the backlog: the brokers are asked.
                try await waitUntil("the lag to count the records produced while paused") {
                    consumer.lag().values.reduce(0, +) == 20
                }

                consumer.resumeAll()
                try await waitUntil("the 20 records produced while paused") { received.count >= 30 }
                #expect(consumer.pausedPartitions.isEmpty)
                consumer.close()
                try await group.waitForAll()
            }
        }
        #expect(received.count == 30, "no duplicates after resuming")
        await producer.shutdown(flushTimeout: .seconds(5))
    }

    /// librdkafka 2.0.2 applies a resume without waking the broker thread, which sleeps up to a
    /// second once all its partitions are paused; a worker at its in-flight bound, pausing and
    /// resuming about once a second, sat without records for half of each cycle. The consumer
    /// wakes the thread after a resume. Heartbeats and commits would also wake it, so they are
    /// made rare here; the median of several resumes tells a prompt restart from a sleeping one.
    @Test("after a resume, records flow again at once, not after the broker thread's next wake-up")
    func resumeFetchesPromptly() async throws {
        let (cluster, producer) = try clusterWithProducer(topic: "wake", partitions: 2)
        var configuration = consumerConfiguration(cluster, group: "wake-group", topics: ["wake"])
        configuration.sessionTimeout = .milliseconds(10_000)
        configuration.client.properties["heartbeat.interval.ms"] = "3000"
        configuration.commitInterval = .seconds(30)
        let consumer = try KafkaConsumer(configuration: configuration, logger: testLogger)
        let received = ReceivedRecords()
        let delays = try await withTimeout(120, "pause and resume, several times") {
            try await withThrowingTaskGroup(of: Void.self, returning: [Duration].self) { group in
                var delays: [Duration] = []
                group.addTask { try await consumer.run() }
                group.addTask { await consumeLoop(consumer, into: received) }
                try await producer.send(KafkaOutgoingMessage(topic: "wake", value: "first".bytes))
                try await waitUntil("the first record") { received.count >= 1 }
                for round in 0..<6 {
                    consumer.pauseAll()
                    try await waitUntil("both partitions paused") { consumer.pausedPartitions.count == 2 }
                    for index in 0..<4 {
                        try await producer.send(KafkaOutgoingMessage(topic: "wake", value: "round-\(round)-\(index)".bytes))
                    }
                    // Long enough for the broker thread to go back to sleep with nothing to fetch.
                    try await Task.sleep(for: .milliseconds(1200))
                    let before = received.count
                    let resumed = ContinuousClock.now
                    consumer.resumeAll()
                    try await waitUntil("round \(round)'s records", timeout: 10) { received.count >= before + 4 }
                    delays.append(ContinuousClock.now - resumed)
                }
                consumer.close()
                try await group.waitForAll()
                return delays
            }
        }
        let median = delays.sorted()[delays.count / 2]
        #expect(median < .milliseconds(300), "resume → records: \(delays)")
        await producer.shutdown(flushTimeout: .seconds(5))
    }

    /// Found by the reliability suite: a worker paused for back-pressure lost its assignment when
    /// the group coordinator went away, resumed while it had no partitions, and got the same
    /// partitions back still paused inside librdkafka, so it never fetched from them again.
    @Test func partitionsPausedWhenTheAssignmentIsLostFetchAgainOnceReassigned() async throws {
        let (cluster, producer) = try clusterWithProducer(topic: "lost", partitions: 2)
        let received = ReceivedRecords()
        let consumer = try KafkaConsumer(
            configuration: consumerConfiguration(cluster, group: "lost-group", topics: ["lost"]),
            logger: testLogger
        )
        try await withTimeout(120, "a lost, paused assignment coming back") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await consumer.run() }
                group.addTask { await consumeLoop(consumer, into: received) }
                for index in 0..<10 {
                    try await producer.send(KafkaOutgoingMessage(topic: "lost", value: "before-\(index)".bytes))
                }
                try await waitUntil("the first 10 records") { received.count >= 10 }
                consumer.pauseAll()
                try await waitUntil("both partitions paused") { consumer.pausedPartitions.count == 2 }

                // The only broker (and so the coordinator) goes away until the session times out.
                try cluster.setBrokerDown(1)
                try await waitUntil("the assignment to be lost", timeout: 60) { consumer.assignment.isEmpty }
                consumer.resumeAll()
                try cluster.setBrokerUp(1)
                try await waitUntil("both partitions assigned again", timeout: 60) { consumer.assignment.count == 2 }

                for index in 0..<10 {
                    try await producer.send(KafkaOutgoingMessage(topic: "lost", value: "after-\(index)".bytes))
                }
                try await waitUntil("the records produced after the reassignment", timeout: 30) {
                    received.all.contains { String(decoding: $0.value, as: UTF8.self) == "after-9" }
                        && received.all.filter { String(decoding: $0.value, as: UTF8.self).hasPrefix("after-") }.count == 10
                }
                #expect(consumer.pausedPartitions.isEmpty)
                consumer.close()
                try await group.waitForAll()
            }
        }
        await producer.shutdown(flushTimeout: .seconds(5))
    }

    @Test func brokerDownAndUpLosesNothing() async throws {
        let cluster = try MockKafkaCluster(brokers: 3, logger: testLogger)
        try cluster.createTopic("bd", partitions: 6, replicationFactor: 3)
        let producer = try KafkaProducer(configuration: producerConfiguration(cluster), logger: testLogger)
        let deliveries = Deliveries()
        let received = ReceivedRecords()
        let consumer = try KafkaConsumer(
            configuration: consumerConfiguration(cluster, group: "bd-group", topics: ["bd"]),
            logger: testLogger
        )
        let total = 1000
        try await withTimeout(150, "recovery from a broker outage") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await consumer.run() }
                group.addTask { await consumeLoop(consumer, into: received) }
                for index in 0..<(total / 2) {
                    try producer.send(KafkaOutgoingMessage(topic: "bd", key: "k\(index)".bytes, value: "v\(index)".bytes)) {
                        deliveries.record($0)
                    }
                }
                try await waitUntil("the first half consumed") { received.count >= total / 2 }

                try cluster.setBrokerDown(2)
                for index in (total / 2)..<total {
                    try producer.send(KafkaOutgoingMessage(topic: "bd", key: "k\(index)".bytes, value: "v\(index)".bytes)) {
                        deliveries.record($0)
                    }
                }
                // The outage lasts a while (the scenario, not a wait for a condition).
                try await Task.sleep(for: .seconds(2))
                try cluster.setBrokerUp(2)

                try await producer.flush(timeout: .seconds(60))
                try await waitUntil("every record consumed") { received.positions.count >= total }
                consumer.close()
                try await group.waitForAll()
            }
        }
        #expect(deliveries.failures.isEmpty, "\(deliveries.failures)")
        #expect(deliveries.delivered.count == total)
        #expect(deliveries.delivered.isSubset(of: received.positions))
        await producer.shutdown(flushTimeout: .seconds(5))
    }

    @Test func producerSurfacesAPermanentBrokerError() async throws {
        let cluster = try MockKafkaCluster(brokers: 1, logger: testLogger)
        try cluster.createTopic("fail", partitions: 1)
        try cluster.createTopic("other", partitions: 1)
        let producer = try KafkaProducer(configuration: producerConfiguration(cluster), logger: testLogger)
        try await producer.send(KafkaOutgoingMessage(topic: "fail", value: "ok".bytes))

        cluster.pushRequestErrors(api: .produce, errors: [KafkaErrorCodes.code(named: "TOPIC_AUTHORIZATION_FAILED") ?? -1])
        let error = await #expect(throws: KafkaError.self) {
            try await producer.send(KafkaOutgoingMessage(topic: "fail", value: "refused".bytes))
        }
        #expect(error?.code == .delivery)
        #expect(error?.rdKafkaName == "TOPIC_AUTHORIZATION_FAILED")
        #expect(error?.description.contains("fail") == true)

        // The producer keeps working after a failed message. (librdkafka marks the refused topic
        // as failing until its next metadata refresh, so use another one.)
        let report = try await producer.send(KafkaOutgoingMessage(topic: "other", value: "after".bytes))
        #expect(report.offset == 0)

        await producer.shutdown(flushTimeout: .seconds(5))
        let closed = await #expect(throws: KafkaError.self) {
            try await producer.send(KafkaOutgoingMessage(topic: "fail", value: "too late".bytes))
        }
        #expect(closed?.code == .closed)
    }

    @Test("a delivery recipient hears once per message, is let go afterwards, and never hears of a refused message")
    func deliveryRecipientReportsAndRelease() async throws {
        let cluster = try MockKafkaCluster(brokers: 1, logger: testLogger)
        let topic = "recipient-results-topic"  // longer than a small string: its name is built per report
        try cluster.createTopic(topic, partitions: 1)
        let producer = try KafkaProducer(configuration: producerConfiguration(cluster), logger: testLogger)
        let watch = WeakReference()
        do {
            let recipient = RecordingRecipient()
            watch.object = recipient
            for index in 0..<3 {
                try producer.send(KafkaOutgoingMessage(topic: topic, value: "m\(index)".bytes), reportingTo: recipient)
            }
            try await waitUntil("three delivery reports") { recipient.reports.count == 3 }
            let reports = recipient.reports.compactMap { try? $0.get() }
            #expect(reports.map(\.offset) == [0, 1, 2])
            #expect(reports.allSatisfy { $0.topic == topic })
        }
        // librdkafka held one reference per message, and gave each back with its report.
        try await waitUntil("the recipient released") { watch.object == nil }

        await producer.shutdown(flushTimeout: .seconds(5))
        let late = RecordingRecipient()
        let refused = #expect(throws: KafkaError.self) {
            try producer.send(KafkaOutgoingMessage(topic: topic, value: "too late".bytes), reportingTo: late)
        }
        #expect(refused?.code == .closed)
        #expect(late.reports.isEmpty)
    }

    @Test func producerSurfacesATimeoutWhileTheBrokerIsDown() async throws {
        let cluster = try MockKafkaCluster(brokers: 1, logger: testLogger)
        try cluster.createTopic("timeout", partitions: 1)
        var configuration = producerConfiguration(cluster)
        configuration.messageTimeout = .milliseconds(1500)
        let producer = try KafkaProducer(configuration: configuration, logger: testLogger)
        try await producer.send(KafkaOutgoingMessage(topic: "timeout", value: "ok".bytes))

        try cluster.setBrokerDown(1)
        let started = ContinuousClock.now
        let error = await #expect(throws: KafkaError.self) {
            try await producer.send(KafkaOutgoingMessage(topic: "timeout", value: "lost".bytes))
        }
        #expect(error?.code == .delivery)
        #expect(error?.rdKafkaName == "_MSG_TIMED_OUT")
        #expect(error?.isRetryable == true)
        #expect(ContinuousClock.now - started < .seconds(30))
        try cluster.setBrokerUp(1)
        await producer.shutdown(flushTimeout: .seconds(5))
    }

    @Test func configurationErrorsNameThePropertyButNeverASecret() throws {
        let cluster = try MockKafkaCluster(brokers: 1, logger: testLogger)
        var configuration = producerConfiguration(cluster)
        configuration.client.properties["no.such.property"] = "x"
        let unknown = #expect(throws: KafkaError.self) {
            _ = try KafkaProducer(configuration: configuration, logger: testLogger)
        }
        #expect(unknown?.code == .configuration)
        #expect(unknown?.description.contains("no.such.property") == true)

        configuration = producerConfiguration(cluster)
        configuration.client.security = .init(
            sasl: .init(mechanism: .scramSHA512, username: "svc", password: Secret("hunter2-secret"))
        )
        configuration.client.properties["ssl.key.password"] = "p@ss-secret"
        configuration.client.properties["sasl.kerberos.min.time.before.relogin"] = "not-a-number"
        let invalid = #expect(throws: KafkaError.self) {
            _ = try KafkaProducer(configuration: configuration, logger: testLogger)
        }
        #expect(invalid?.code == .configuration)
        #expect(invalid?.description.contains("hunter2") == false)
        #expect(invalid?.description.contains("p@ss") == false)
        #expect("\(Secret("hunter2"))" == "<redacted>")
    }

    @Test func consoleCommandsDriveTheCluster() throws {
        let cluster = try MockKafkaCluster(brokers: 2, logger: testLogger)
        try cluster.createTopic("console", partitions: 2)
        let console = MockClusterConsole(cluster: cluster)
        #expect(console.execute("broker-down 1") == "ok broker 1 down")
        #expect(console.execute("broker-up 1") == "ok broker 1 up")
        #expect(console.execute("rtt 2 200") == "ok broker 2 rtt 200 ms")
        #expect(console.execute("request-errors Produce 3 NOT_LEADER_FOR_PARTITION")
            == "ok next 3 Produce request(s) fail with NOT_LEADER_FOR_PARTITION")
        #expect(console.execute("clear-request-errors produce") == "ok cleared Produce errors")
        #expect(console.execute("leader console 1 2") == "ok console[1] leader is broker 2")
        #expect(console.execute("create-topic extra 4") == "ok created extra with 4 partition(s)")
        #expect(console.execute("bootstrap") == "ok \(cluster.bootstrapServers)")
        #expect(console.execute("help").hasSuffix("ok help"))
        #expect(console.execute("broker-down 3") == "error: no broker 3: brokers are 1...2")
        #expect(console.execute("request-errors Produce 1 NO_SUCH_ERROR").hasPrefix("error: unknown error"))
        #expect(console.execute("request-errors Bogus 1 NOT_LEADER_FOR_PARTITION").hasPrefix("error: unknown API"))
        #expect(console.execute("rtt 1") == "error: usage: rtt BROKER MILLISECONDS")
        #expect(console.execute("launch-missiles").hasPrefix("error: unknown command"))
        // librdkafka checks neither: a typo would create a topic, a negative partition corrupt memory.
        #expect(console.execute("leader consloe 0 2") == "error: no topic \"consloe\" was created here (created: console, extra)")
        #expect(console.execute("leader console -1 2") == "error: no partition -1 in console: its partitions are 0...1")
        #expect(console.execute("leader console 2 2") == "error: no partition 2 in console: its partitions are 0...1")
        #expect(console.execute("create-topic apns.jobs,apns.results 4")
            == "error: topic \"apns.jobs,apns.results\": a Kafka topic name may only use letters, digits, '.', '_' and '-', not ','")
        #expect(console.execute("create-topic .. 4") == "error: topic \"..\": a Kafka topic name has 1 to 249 characters, and is not '.' or '..'")
    }
}

/// The partitions a consumer reports `kafka_consumer_lag` for, in its registry.
private func lagPartitions(_ registry: PrometheusCollectorRegistry) -> Set<Int32> {
    let text = String(decoding: registry.emitToBuffer(), as: UTF8.self)
    let lags = prometheusSamples(text).filter { sample in sample.name == "kafka_consumer_lag" }
    return Set(lags.compactMap { sample in sample.labels["partition"].flatMap { Int32($0) } })
}

extension KafkaMockClusterTests {
    @Test("a record held unfinished is reported as a stall; one parked on purpose (a retry waiting for its time), with a later one finished behind it, is not")
    func parkedRecordIsNoStall() async throws {
        let (cluster, producer) = try clusterWithProducer(topic: "parked", partitions: 1)
        try await producer.send(KafkaOutgoingMessage(topic: "parked", key: nil, value: "later".bytes))
        try await producer.send(KafkaOutgoingMessage(topic: "parked", key: nil, value: "due".bytes))
        let registry = PrometheusCollectorRegistry()
        var configuration = consumerConfiguration(cluster, group: "parked-group", topics: ["parked"])
        configuration.client.metricsFactory = PrometheusMetricsFactory(registry: registry)
        // 3 s, not less: the activity phase below must not read as a stall when a loaded
        // machine (the full suite on 2 cores) oversleeps a 200 ms nap by a second.
        configuration.stallWarning = .seconds(3)
        let consumer = try KafkaConsumer(configuration: configuration, logger: testLogger)
        @Sendable func stalls() -> Double {
            let text = String(decoding: registry.emitToBuffer(), as: UTF8.self)
            return prometheusSamples(text).filter { $0.name == "kafka_consumer_stalls_total" || $0.name == "kafka_consumer_stalls" }.reduce(0) { $0 + $1.value }
        }
        let held = Shared<[KafkaRecord]>([])
        try await withTimeout(60, "the parked record") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await consumer.run() }
                group.addTask { for await batch in consumer.batches { held.update { $0 += batch } } }
                try await waitUntil("the records to be taken") { held.value.count == 2 }
                consumer.park()
                // The second is done; it waits only for the parked one before it.
                consumer.markFinished(held.value[1])
                // Two or three stall checks (once a second) past the 3 s warning.
                try await Task.sleep(for: .seconds(5.5))
                #expect(stalls() == 0, "a parked record is not a stall")
                #expect(consumer.stall() == nil)
                consumer.unpark()
                // Work the caller reports on it (attempts that time out, say) is progress too.
                for _ in 0..<25 {
                    consumer.noteActivity()
                    try await Task.sleep(for: .milliseconds(200))
                }
                #expect(stalls() == 0, "reported activity is no stall")
                try await waitUntil("the held record to be reported as a stall", timeout: 15) { stalls() == 1 }
                // Probes see it too (the admin server's /readyz and /healthz).
                try await waitUntil("the probes to see it") { consumer.stall() != nil }
                let stall = try #require(consumer.stall())
                #expect(stall.cause == .noProgress && stall.duration >= .seconds(3))
                consumer.markFinished(held.value[0])
                try await waitUntil("the stall to end once the record is finished", timeout: 10) { consumer.stall() == nil }
                consumer.close()
                try await group.waitForAll()
            }
        }
        await producer.shutdown(flushTimeout: .seconds(5))
    }
}

extension KafkaMockClusterTests {
    @Test("the buffer is bounded in bytes too: large records not taken pause fetching long before the record bound")
    func bufferBoundedInBytes() async throws {
        let (cluster, producer) = try clusterWithProducer(topic: "large", partitions: 2)
        for index in 0..<40 {
            _ = try await producer.send(KafkaOutgoingMessage(topic: "large", partition: Int32(index % 2), value: [UInt8](repeating: UInt8(ascii: "x"), count: 10_000)))
        }
        var configuration = consumerConfiguration(cluster, group: "large-group", topics: ["large"])
        configuration.bufferCapacity = 10_000
        configuration.bufferCapacityBytes = 100_000
        let consumer = try KafkaConsumer(configuration: configuration, logger: testLogger)
        try await withTimeout(60, "the byte bound") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await consumer.run() }
                // Nobody takes the batches: 400 KB wait, four times the byte bound, 40 records.
                try await waitUntil("fetching paused by the byte bound") { consumer.pausedPartitions.count == 2 }
                // Taken, the buffer drains and fetching goes on: every record comes through.
                var taken = 0
                for await batch in consumer.batches {
                    #expect(batch.reduce(0) { $0 + $1.value.count } <= 100_000 / 4 + 10_000, "a batch stops at a quarter of the bound")
                    taken += batch.count
                    consumer.markFinished(batch)
                    if taken == 40 { break }
                }
                #expect(taken == 40)
                consumer.close()
                try await group.waitForAll()
            }
        }
        await producer.shutdown(flushTimeout: .seconds(5))
    }
}

extension KafkaMockClusterTests {
    @Test("librdkafka's errors are counted by client and role: a worker's producer and consumer share a client id")
    func errorsCountedByRole() async throws {
        let registry = PrometheusCollectorRegistry()
        // Nothing listens on port 1: both clients report the broker down at once.
        var client = KafkaClientConfiguration(bootstrapServers: ["127.0.0.1:1"])
        client.clientID = "shared-id"
        client.metricsFactory = PrometheusMetricsFactory(registry: registry)
        client.statisticsInterval = nil
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(client: client), logger: testLogger)
        var consumerConfiguration = KafkaConsumerConfiguration(client: client, groupID: "role-group", topics: ["t"])
        consumerConfiguration.pollTimeout = .milliseconds(50)
        let consumer = try KafkaConsumer(configuration: consumerConfiguration, logger: testLogger)
        @Sendable func roles() -> Set<String> {
            let text = String(decoding: registry.emitToBuffer(), as: UTF8.self)
            return Set(prometheusSamples(text).filter { $0.name == "kafka_errors" && $0.labels["client"] == "shared-id" }.compactMap { $0.labels["role"] })
        }
        try await withTimeout(60, "errors from both clients") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await producer.run() }
                group.addTask { try await consumer.run() }
                try await waitUntil("both roles to report an error", timeout: 30) { roles() == ["producer", "consumer"] }
                consumer.close()
                await producer.shutdown(flushTimeout: .seconds(1))
                group.cancelAll()
            }
        }
    }
}

extension KafkaMockClusterTests {
    /// A partition nothing was taken from yet has no librdkafka position. Without a figure for
    /// it, an idle fleet (a quiet hour after a rolling restart) exported no lag at all, and the
    /// "no worker reports lag" alert paged; a partition paused from its assignment on hid its
    /// backlog when the lag mattered most.
    @Test("every assigned partition has a lag before any record is taken: an idle one 0, one paused from the start its backlog past the group's commit")
    func lagBeforeAnyRecord() async throws {
        let (cluster, producer) = try clusterWithProducer(topic: "quiet", partitions: 2)
        for index in 0..<5 {
            try await producer.send(KafkaOutgoingMessage(topic: "quiet", partition: 0, value: "first-\(index)".bytes))
        }
        // A first member takes the five and commits them as it leaves.
        let first = try KafkaConsumer(configuration: consumerConfiguration(cluster, group: "quiet-group", topics: ["quiet"]), logger: testLogger)
        let received = ReceivedRecords()
        try await withTimeout(60, "the first member's five records") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await first.run() }
                group.addTask { await consumeLoop(first, into: received) }
                try await waitUntil("the five records") { received.count == 5 }
                first.close()
                try await group.waitForAll()
            }
        }
        for index in 0..<3 {
            try await producer.send(KafkaOutgoingMessage(topic: "quiet", partition: 0, value: "later-\(index)".bytes))
        }

        let second = try KafkaConsumer(configuration: consumerConfiguration(cluster, group: "quiet-group", topics: ["quiet"]), logger: testLogger)
        second.pauseAll()
        let partition0 = TopicPartition(topic: "quiet", partition: 0)
        let partition1 = TopicPartition(topic: "quiet", partition: 1)
        try await withTimeout(60, "the lag of partitions nothing was taken from") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await second.run() }
                group.addTask { for await _ in second.batches {} }
                let found = await (try? waitUntil("a lag for both partitions", timeout: 30) { second.lag() == [partition0: 3, partition1: 0] }) != nil
                #expect(found, "lag: \(second.lag()), assigned: \(second.assignment)")
                second.close()
                try await group.waitForAll()
            }
        }
        await producer.shutdown(flushTimeout: .seconds(5))
    }
}
