import APNsCore
import Testing

private let token = (0..<32).map { UInt8($0 * 7 & 0xFF) }

private func notifications() -> [LegacyNotification] {
    [
        LegacyNotification(format: .simple, token: token, payload: Array(#"{"aps":{"alert":"one"}}"#.utf8)),
        LegacyNotification(format: .enhanced, identifier: 2, expiry: 1_767_225_600, token: token, payload: Array(#"{"aps":{"alert":"two"}}"#.utf8)),
        LegacyNotification(format: .frame, identifier: 3, expiry: 0, token: token, payload: Array(#"{"aps":{"alert":"three"}}"#.utf8), priority: 10),
        LegacyNotification(format: .enhanced, identifier: 0xFFFF_FFFF, expiry: 0, token: token, payload: Array("{}".utf8)),
    ]
}

/// Feeds `stream` to a decoder in the given chunks and collects everything it yields.
private func decode(_ stream: [UInt8], chunks: [Range<Int>]) -> (notifications: [LegacyNotification], error: LegacyErrorResponse?) {
    var decoder = LegacyGatewayDecoder()
    var out: [LegacyNotification] = []
    for chunk in chunks {
        decoder.append(stream[chunk])
        loop: while true {
            switch decoder.next() {
            case .notification(let notification, _): out.append(notification)
            case .needMoreBytes: break loop
            case .malformed(let response, _): return (out, response)
            }
        }
    }
    return (out, nil)
}

@Suite("Legacy binary interface PDUs")
struct LegacyPDUTests {
    @Test("a multi-PDU stream split at every byte position decodes to the same notifications")
    func everySplitPoint() {
        let expected = notifications()
        let stream = expected.flatMap { $0.encoded() }
        for split in 0...stream.count {
            let result = decode(stream, chunks: [0..<split, split..<stream.count])
            #expect(result.notifications == expected, "split at \(split)")
            #expect(result.error == nil)
        }
    }

    @Test("a stream delivered one byte at a time, and all at once, decodes the same")
    func byteByByteAndCoalesced() {
        let expected = notifications()
        let stream = expected.flatMap { $0.encoded() }
        #expect(decode(stream, chunks: (0..<stream.count).map { $0..<($0 + 1) }).notifications == expected)
        #expect(decode(stream, chunks: [0..<stream.count]).notifications == expected)
    }

    @Test("the enhanced format matches the reference test server's dump byte for byte")
    func referenceBytes() {
        let referenceToken: [UInt8] = [
            0x6b, 0x46, 0x28, 0xde, 0x93, 0x17, 0xc8, 0x0e, 0xdd, 0x1c, 0x79, 0x16, 0x40, 0xb5, 0x8f, 0xdf,
            0xc4, 0x6d, 0x21, 0xd0, 0xd2, 0xd1, 0x35, 0x16, 0x87, 0x23, 0x9c, 0x44, 0xd8, 0xe3, 0x0a, 0xb1,
        ]
        let notification = LegacyNotification(
            format: .enhanced, identifier: 1, expiry: 0x5172_611d, token: referenceToken,
            payload: Array(#"{"aps":{"alert":"Hello Push"}}"#.utf8)
        )
        let dump = HexDump.lines(notification.encoded())
        #expect(dump.first?.hasPrefix("00000000: 0100 0000 0151 7261 1d00 206b 4628 de93") == true)
        #expect(dump.last?.hasPrefix("00000040: 6c6c 6f20 5075 7368 227d 7d") == true)
        #expect(dump.count == 5)
    }

    @Test(
        "malformed PDUs get the Table 5-1 status and the right identifier",
        arguments: [
            // enhanced, id 7, token length 0
            ([1, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0], 2, 7),
            // enhanced, id 9, token length 31
            ([1, 0, 0, 0, 9, 0, 0, 0, 0, 0, 31], 5, 9),
            // simple, token length 33
            ([0, 0, 33], 5, 0),
            // unknown command: the identifier is read where an enhanced one would be
            (Array("GET / HTTP/1.1\r\n".utf8), 1, 0x4554_202F),
        ] as [([UInt8], UInt8, UInt32)]
    )
    func malformed(bytes: [UInt8], status: UInt8, identifier: UInt32) {
        let result = decode(bytes, chunks: [0..<bytes.count])
        #expect(result.error == LegacyErrorResponse(status: LegacyErrorStatus(code: status), identifier: identifier))
    }

    @Test("payload limits: 256 bytes in the enhanced format, missing payloads refused")
    func payloadRules() {
        let ok = LegacyNotification(identifier: 4, token: token, payload: Array(repeating: 0x61, count: 256)).encoded()
        #expect(decode(ok, chunks: [0..<ok.count]).notifications.count == 1)
        let big = LegacyNotification(identifier: 5, token: token, payload: Array(repeating: 0x61, count: 257)).encoded()
        #expect(decode(big, chunks: [0..<big.count]).error == LegacyErrorResponse(status: .invalidPayloadSize, identifier: 5))
        let empty = LegacyNotification(identifier: 6, token: token, payload: []).encoded()
        #expect(decode(empty, chunks: [0..<empty.count]).error == LegacyErrorResponse(status: .missingPayload, identifier: 6))
    }

    @Test("an error in the middle of a stream stops it after the good PDUs before it")
    func errorMidStream() {
        let good = notifications()
        let bad = LegacyNotification(identifier: 42, token: Array(token.prefix(20)), payload: Array("{}".utf8))
        let stream = good[0].encoded() + good[1].encoded() + bad.encoded() + good[2].encoded()
        let result = decode(stream, chunks: [0..<stream.count])
        #expect(result.notifications == Array(good[0...1]))
        #expect(result.error == LegacyErrorResponse(status: .invalidTokenSize, identifier: 42))
    }

    @Test("error-response packets round-trip")
    func errorResponse() {
        let response = LegacyErrorResponse(status: .invalidToken, identifier: 0x0102_0304)
        #expect(response.encoded() == [8, 8, 1, 2, 3, 4])
        #expect(LegacyErrorResponse(bytes: response.encoded()) == response)
        #expect(LegacyErrorResponse(bytes: [8, 8, 1]) == nil)
        #expect(LegacyErrorResponse(bytes: [7, 8, 1, 2, 3, 4]) == nil)
    }

    @Test("feedback tuples split at every byte decode the same, and the reference bytes parse")
    func feedbackTuples() {
        let tuples = [
            FeedbackTuple(timestamp: 0x2696_A210, token: token),
            FeedbackTuple(timestamp: 0x2696_A211, token: Array(token.reversed())),
        ]
        let stream = tuples.flatMap { $0.encoded() }
        for split in 0...stream.count {
            var decoder = FeedbackTupleDecoder()
            var out: [FeedbackTuple] = []
            decoder.append(stream[0..<split])
            while let tuple = decoder.next() { out.append(tuple) }
            decoder.append(stream[split...])
            while let tuple = decoder.next() { out.append(tuple) }
            #expect(out == tuples, "split at \(split)")
            #expect(decoder.leftoverByteCount == 0)
        }
        // "SEND: 2696A21000207518B1C2…" from the reference test server.
        var decoder = FeedbackTupleDecoder()
        decoder.append([0x26, 0x96, 0xA2, 0x10, 0x00, 0x20] + token)
        #expect(decoder.next() == FeedbackTuple(timestamp: 0x2696_A210, token: token))
    }

    @Test("a tuple stating an impossible token length stops decoding there; what came before is kept")
    func feedbackTokenLength() {
        let good = FeedbackTuple(timestamp: 0x2696_A210, token: token)
        // A 65,535-byte "token": a stream that is not feedback tuples, or lost its alignment.
        let bad: [UInt8] = [0x26, 0x96, 0xA2, 0x11, 0xFF, 0xFF] + Array(repeating: 0x41, count: 100)
        var decoder = FeedbackTupleDecoder()
        decoder.append(good.encoded() + bad)
        #expect(decoder.next() == good)
        #expect(decoder.next() == nil)
        #expect(decoder.malformation?.contains("65535-byte token") == true, "\(decoder.malformation ?? "")")
        // The rest is counted, not kept, and nothing more is decoded from it.
        decoder.append(good.encoded())
        #expect(decoder.next() == nil)
        #expect(decoder.leftoverByteCount == bad.count + good.encoded().count)
        for length in [0, 31, 101] {
            var short = FeedbackTupleDecoder()
            short.append([0, 0, 0, 1, 0, UInt8(length)] + Array(repeating: 1, count: length))
            #expect(short.next() == nil && short.malformation != nil, "\(length)-byte token")
        }
    }
}
