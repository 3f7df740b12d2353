import APNsCore
import ArgumentParser

/// Refuses a key or team id flag (given as flag → value; nil values are skipped) that is not
/// 10 letters or digits, as the worker's configuration does.
func checkAppleIdentifiers(_ flags: KeyValuePairs<String, String?>) throws {
    for case let (flag, value?) in flags where !ProviderTokenSigner.isWellFormedIdentifier(value) {
        throw ValidationError("\(flag) must be 10 letters or digits, got \(value.count) characters")
    }
}
