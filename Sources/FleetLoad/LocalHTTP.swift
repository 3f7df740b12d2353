import Foundation

/// A blocking TCP socket connected to 127.0.0.1:`port`, whose reads give up after the timeout.
/// The caller closes it.
public func connectLocalTCP(port: Int, receiveTimeoutSeconds: Int) throws(LocalHTTPError) -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw LocalHTTPError("socket failed") }
    var timeout = timeval(tv_sec: receiveTimeoutSeconds, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    var address = localAddress(port: port)
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard connected == 0 else {
        close(fd)
        throw LocalHTTPError("cannot connect to 127.0.0.1:\(port)")
    }
    return fd
}

/// A TCP socket bound to a free port on 127.0.0.1 and not listening, so that connections to the
/// port are refused while it stays open. The caller closes it.
public func bindLocalTCP() throws(LocalHTTPError) -> (descriptor: Int32, port: Int) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw LocalHTTPError("socket failed") }
    var address = localAddress(port: 0)
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
    }
    guard bound else {
        close(fd)
        throw LocalHTTPError("cannot bind a port on 127.0.0.1")
    }
    return (fd, Int(UInt16(bigEndian: address.sin_port)))
}

private func localAddress(port: Int) -> sockaddr_in {
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    return address
}

/// One HTTP/1.1 request without a body to 127.0.0.1, with plain sockets (short and local, so
/// blocking is fine): the admin endpoints of workers and the simulator, read by the benchmarks
/// and the tests.
public func localHTTPRequest(method: String, port: Int, path: String) throws(LocalHTTPError) -> (status: Int, body: String) {
    let fd = try connectLocalTCP(port: port, receiveTimeoutSeconds: 5)
    defer { close(fd) }
    let request = Array("\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".utf8)
    guard request.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, 0) }) == request.count else {
        throw LocalHTTPError("cannot send the request")
    }
    var received: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65_536)
    while true {
        let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if count <= 0 { break }
        received.append(contentsOf: chunk[0..<count])
        // Stop at the end of the body rather than wait for the server to close.
        if let length = completeLength(received), received.count >= length { break }
    }
    let text = String(decoding: received, as: UTF8.self)
    guard let statusLine = text.split(separator: "\r\n").first, let status = Int(statusLine.split(separator: " ").dropFirst().first ?? "") else {
        throw LocalHTTPError("no HTTP response from 127.0.0.1:\(port)\(path)")
    }
    let body = text.range(of: "\r\n\r\n").map { String(text[$0.upperBound...]) } ?? ""
    return (status, body)
}

/// The full length of a response whose head has arrived: head plus `content-length`.
private func completeLength(_ bytes: [UInt8]) -> Int? {
    let separator = Array("\r\n\r\n".utf8)
    guard bytes.count >= separator.count,
        let end = (0...(bytes.count - separator.count)).first(where: { bytes[$0..<($0 + separator.count)].elementsEqual(separator) })
    else { return nil }
    let head = String(decoding: bytes[..<end], as: UTF8.self).lowercased()
    guard let line = head.split(separator: "\r\n").first(where: { $0.hasPrefix("content-length:") }),
        let length = Int(line.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces))
    else { return nil }
    return end + separator.count + length
}

/// Why a local HTTP request failed.
public struct LocalHTTPError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
