import FleetLoad
import Foundation
import Synchronization

/// A blocking TCP socket connected to 127.0.0.1:`port`, whose reads give up after the timeout.
/// The caller closes it.
public func connectTCP(port: Int, receiveTimeoutSeconds: Int) throws -> Int32 {
    do {
        return try connectLocalTCP(port: port, receiveTimeoutSeconds: receiveTimeoutSeconds)
    } catch {
        throw TestSetupError(error.description)
    }
}

/// One HTTP/1.1 request without a body to 127.0.0.1 (see `localHTTPRequest`).
public func httpRequest(method: String, port: Int, path: String) throws -> (status: Int, body: String) {
    do {
        return try localHTTPRequest(method: method, port: port, path: path)
    } catch {
        throw TestSetupError(error.description)
    }
}

/// `httpRequest(method: "GET", …)`.
public func httpGet(port: Int, path: String) throws -> (status: Int, body: String) {
    try httpRequest(method: "GET", port: port, path: path)
}

/// A 127.0.0.1 port that refuses connections until released (or this is gone): bound, never
/// listening. A stopped server's port is no such thing: in a test run, another suite's server
/// can be given it.
public final class RefusingPort: Sendable {
    public let port: Int
    private let descriptor: Mutex<Int32?>

    public init() throws {
        do {
            let (fd, port) = try bindLocalTCP()
            descriptor = Mutex(fd)
            self.port = port
        } catch {
            throw TestSetupError(error.description)
        }
    }

    /// Frees the port, for a server the test starts on it next.
    public func release() {
        if let fd = descriptor.withLock({ $0.take() }) { close(fd) }
    }

    deinit { release() }
}
