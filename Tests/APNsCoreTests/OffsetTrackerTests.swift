import APNsCore
import Testing

@Suite("OffsetTracker")
struct OffsetTrackerTests {
    let p0 = TopicPartition(topic: "apns.jobs", partition: 0)
    let p1 = TopicPartition(topic: "apns.jobs", partition: 1)

    @Test func inOrderCompletionAdvancesOneByOne() {
        var tracker = OffsetTracker()
        let epoch = tracker.assign(p0)
        for offset in 0..<3 {
            let accepted = tracker.dispatched(p0, offset: Int64(offset))
            #expect(accepted)
        }
        #expect(tracker.storableOffset(p0) == nil)
        let r1 = tracker.finished(p0, offset: 0, epoch: epoch)
        #expect(r1 == .advanced(to: 1))
        let r2 = tracker.finished(p0, offset: 1, epoch: epoch)
        #expect(r2 == .advanced(to: 2))
        let r3 = tracker.finished(p0, offset: 2, epoch: epoch)
        #expect(r3 == .advanced(to: 3))
        #expect(tracker.inFlight(p0) == 0)
        #expect(tracker.storableOffset(p0) == 3)
    }

    @Test("the oldest unfinished offset is where lag counts from before anything finished (a stuck first record)")
    func oldestUnfinished() {
        var tracker = OffsetTracker()
        let epoch = tracker.assign(p0)
        #expect(tracker.oldestUnfinished(p0) == nil)
        for offset in 10..<13 { tracker.dispatched(p0, offset: Int64(offset)) }
        _ = tracker.finished(p0, offset: 11, epoch: epoch)
        #expect(tracker.oldestUnfinished(p0) == 10, "10 is stuck; 11 finishing early changes nothing")
        _ = tracker.finished(p0, offset: 10, epoch: epoch)
        #expect(tracker.oldestUnfinished(p0) == 12)
        _ = tracker.finished(p0, offset: 12, epoch: epoch)
        #expect(tracker.oldestUnfinished(p0) == nil)
    }

    @Test func outOfOrderCompletionWaitsForEarlierRecords() {
        var tracker = OffsetTracker()
        let epoch = tracker.assign(p0)
        for offset in 10..<15 { tracker.dispatched(p0, offset: Int64(offset)) }
        let r4 = tracker.finished(p0, offset: 12, epoch: epoch)
        #expect(r4 == .waiting)
        let r5 = tracker.finished(p0, offset: 11, epoch: epoch)
        #expect(r5 == .waiting)
        let r6 = tracker.finished(p0, offset: 14, epoch: epoch)
        #expect(r6 == .waiting)
        #expect(tracker.storableOffset(p0) == nil)
        #expect(tracker.inFlight(p0) == 5)
        // The head finishing releases the finished run behind it, and stops at the first gap.
        let r7 = tracker.finished(p0, offset: 10, epoch: epoch)
        #expect(r7 == .advanced(to: 13))
        #expect(tracker.inFlight(p0) == 2)
        let r8 = tracker.finished(p0, offset: 13, epoch: epoch)
        #expect(r8 == .advanced(to: 15))
        #expect(tracker.inFlight(p0) == 0)
    }

    @Test func offsetGapsFromCompactionCountAsContiguous() {
        var tracker = OffsetTracker()
        let epoch = tracker.assign(p0)
        for offset: Int64 in [3, 7, 8, 20] { tracker.dispatched(p0, offset: offset) }
        let r9 = tracker.finished(p0, offset: 7, epoch: epoch)
        #expect(r9 == .waiting)
        let r10 = tracker.finished(p0, offset: 3, epoch: epoch)
        #expect(r10 == .advanced(to: 8))
        let r11 = tracker.finished(p0, offset: 20, epoch: epoch)
        #expect(r11 == .waiting)
        let r12 = tracker.finished(p0, offset: 8, epoch: epoch)
        #expect(r12 == .advanced(to: 21))
    }

    @Test func unknownDuplicateAndStaleCompletionsAreIgnored() {
        var tracker = OffsetTracker()
        let epoch = tracker.assign(p0)
        tracker.dispatched(p0, offset: 0)
        tracker.dispatched(p0, offset: 2)
        tracker.dispatched(p0, offset: 4)
        let r13 = tracker.finished(p0, offset: 3, epoch: epoch)
        #expect(r13 == .ignored, "never dispatched")
        let r14 = tracker.finished(p0, offset: 9, epoch: epoch)
        #expect(r14 == .ignored, "beyond dispatched")
        let r15 = tracker.finished(p0, offset: 2, epoch: epoch)
        #expect(r15 == .waiting)
        let r16 = tracker.finished(p0, offset: 2, epoch: epoch)
        #expect(r16 == .ignored, "finished twice")
        let r17 = tracker.finished(p0, offset: 0, epoch: epoch + 1)
        #expect(r17 == .ignored, "wrong epoch")
        let r18 = tracker.finished(p1, offset: 0, epoch: epoch)
        #expect(r18 == .ignored, "not assigned")
        let r19 = tracker.finished(p0, offset: 0, epoch: epoch)
        #expect(r19 == .advanced(to: 3))
        let r20 = tracker.finished(p0, offset: 0, epoch: epoch)
        #expect(r20 == .ignored, "already released")
        // A redelivery at or below the last dispatched offset is refused.
        let r21 = tracker.dispatched(p0, offset: 4)
        #expect(!r21)
        let r22 = tracker.dispatched(p1, offset: 0)
        #expect(!r22, "not assigned")
    }

    @Test func revocationReturnsTheFinishedPrefixAndForgetsInFlightWork() {
        var tracker = OffsetTracker()
        let epoch = tracker.assign(p0)
        for offset in 0..<4 { tracker.dispatched(p0, offset: Int64(offset)) }
        _ = tracker.finished(p0, offset: 0, epoch: epoch)
        _ = tracker.finished(p0, offset: 2, epoch: epoch)
        let r23 = tracker.revoke(p0)
        #expect(r23 == 1, "offset 1 is unfinished, so 2 must be redelivered too")
        #expect(tracker.epoch(of: p0) == nil)
        let r24 = tracker.finished(p0, offset: 1, epoch: epoch)
        #expect(r24 == .ignored)

        // Assigned again: the old epoch's completions cannot move the new watermark.
        let next = tracker.assign(p0)
        #expect(next != epoch)
        tracker.dispatched(p0, offset: 1)
        let r25 = tracker.finished(p0, offset: 1, epoch: epoch)
        #expect(r25 == .ignored)
        let r26 = tracker.finished(p0, offset: 1, epoch: next)
        #expect(r26 == .advanced(to: 2))
    }

    @Test("records left unstarted are not waited for, and hold the stored offset below them")
    func leftUnstartedRecords() {
        var tracker = OffsetTracker()
        let epoch = tracker.assign(p0)
        for offset in 0..<5 { tracker.dispatched(p0, offset: Int64(offset)) }
        _ = tracker.finished(p0, offset: 0, epoch: epoch)
        _ = tracker.finished(p0, offset: 3, epoch: epoch)
        #expect(tracker.inProgress(p0) == 3, "3 finished early: it waits only for 1 and 2")
        // 1 is still being worked on; 2 and 4 will not start.
        let left = [2, 4, 4].map { tracker.leftUnstarted(p0, offset: $0, epoch: epoch) }
        #expect(left == [true, true, true])
        #expect(tracker.inProgress(p0) == 1 && tracker.inFlight(p0) == 4, "asking twice counts once")
        // Finished already, released already, never dispatched, another assignment's.
        let refused = [(3, epoch), (0, epoch), (9, epoch), (1, epoch + 1)].map { tracker.leftUnstarted(p0, offset: Int64($0.0), epoch: $0.1) }
        #expect(refused == [false, false, false, false])
        _ = tracker.finished(p0, offset: 1, epoch: epoch)
        #expect(tracker.inProgress(p0) == 0, "3, finished, waits behind 2, which will not start: nothing to wait for")
        #expect(tracker.revoke(p0) == 2, "the next owner starts at the first record left unstarted")
    }

    @Test("a record left unstarted that finishes after all counts as finished")
    func leftUnstartedThenFinished() {
        var tracker = OffsetTracker()
        let epoch = tracker.assign(p0)
        for offset in 0..<2 { tracker.dispatched(p0, offset: Int64(offset)) }
        let left = tracker.leftUnstarted(p0, offset: 0, epoch: epoch)
        #expect(left && tracker.inProgress(p0) == 1)
        let first = tracker.finished(p0, offset: 0, epoch: epoch)
        #expect(first == .advanced(to: 1))
        #expect(tracker.inProgress(p0) == 1, "only 1 is left, and it is in progress")
        let second = tracker.finished(p0, offset: 1, epoch: epoch)
        #expect(second == .advanced(to: 2))
        #expect(tracker.inProgress(p0) == 0)
    }

    @Test func revocationBeforeAnythingFinishedStoresNothing() {
        var tracker = OffsetTracker()
        tracker.assign(p0)
        tracker.dispatched(p0, offset: 5)
        let r27 = tracker.revoke(p0)
        #expect(r27 == nil)
        let r28 = tracker.revoke(p1)
        #expect(r28 == nil)
    }

    @Test func lostAssignmentStoresNothing() {
        var tracker = OffsetTracker()
        let epoch = tracker.assign(p0)
        tracker.dispatched(p0, offset: 0)
        _ = tracker.finished(p0, offset: 0, epoch: epoch)
        tracker.lose(p0)
        #expect(tracker.storableOffset(p0) == nil)
        #expect(tracker.takeStorable().isEmpty)
        #expect(tracker.totalInFlight == 0)
    }

    @Test func takeStorableReportsOnlyPartitionsThatMoved() {
        var tracker = OffsetTracker()
        let e0 = tracker.assign(p0)
        let e1 = tracker.assign(p1)
        tracker.dispatched(p0, offset: 0)
        tracker.dispatched(p1, offset: 0)
        tracker.dispatched(p1, offset: 1)
        _ = tracker.finished(p0, offset: 0, epoch: e0)
        #expect(tracker.totalInFlight == 2)
        let first = tracker.takeStorable()
        #expect(first.count == 1)
        #expect(first.first?.0 == p0 && first.first?.1 == 1)
        #expect(tracker.takeStorable().isEmpty)
        _ = tracker.finished(p1, offset: 1, epoch: e1)
        #expect(tracker.takeStorable().isEmpty, "p1 waits for offset 0")
        _ = tracker.finished(p1, offset: 0, epoch: e1)
        let second = tracker.takeStorable()
        #expect(second.count == 1)
        #expect(second.first?.0 == p1 && second.first?.1 == 2)
    }

    @Test func manyRecordsFinishedInReverseBlocksRelease() {
        var tracker = OffsetTracker()
        let epoch = tracker.assign(p0)
        let count: Int64 = 10_000
        for offset in 0..<count { tracker.dispatched(p0, offset: offset) }
        // Finish in blocks of 100, each block back to front.
        for block in stride(from: 0, to: count, by: 100) {
            for offset in (block..<(block + 100)).reversed() {
                let result = tracker.finished(p0, offset: offset, epoch: epoch)
                if offset == block {
                    #expect(result == .advanced(to: block + 100))
                } else {
                    #expect(result == .waiting)
                }
            }
        }
        #expect(tracker.inFlight(p0) == 0)
        #expect(tracker.storableOffset(p0) == count)
        #expect(tracker.nextDispatchOffset(p0) == count)
    }
}
