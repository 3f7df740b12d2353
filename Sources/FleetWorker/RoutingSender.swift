import APNsClient
import APNsCore

/// Sends each notification through its app's transport: the legacy binary sender for apps
/// configured with `transport: binary`, the other sender (HTTP/2) for the rest.
public struct RoutingSender: NotificationSender {
    /// Names of the apps that use the binary interface.
    public let binaryApps: Set<String>
    /// Most fleets have no binary app: then no name is hashed per notification.
    private let anyBinaryApp: Bool
    public let binary: any NotificationSender
    public let other: any NotificationSender

    public init(apps: [AppConfiguration], binary: any NotificationSender, other: any NotificationSender) {
        self.binaryApps = Set(apps.filter { $0.transport == .binary }.map(\.name))
        self.anyBinaryApp = !binaryApps.isEmpty
        self.binary = binary
        self.other = other
    }

    public func send(_ notification: OutgoingNotification) async -> SendResult {
        if isBinary(notification.app) {
            return await binary.send(notification)
        }
        return await other.send(notification)
    }

    public func canSubmit(app: String) -> Bool {
        isBinary(app) ? binary.canSubmit(app: app) : other.canSubmit(app: app)
    }

    public func submit(_ notification: OutgoingNotification, to receiver: any APNsOutcomeReceiver) {
        if isBinary(notification.app) {
            binary.submit(notification, to: receiver)
        } else {
            other.submit(notification, to: receiver)
        }
    }

    private func isBinary(_ app: String) -> Bool { anyBinaryApp && binaryApps.contains(app) }
}
