import FleetLoad

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
