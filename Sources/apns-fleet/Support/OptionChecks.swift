import APNsCore
import ArgumentParser

/// Refuses a key or team id flag (given as flag → value; nil values are skipped) that is not
/// 10 letters or digits, as the worker's configuration does.
func checkAppleIdentifiers(_ flags: KeyValuePairs<String, String?>) throws {
    for case let (flag, value?) in flags where !ProviderTokenSigner.isWellFormedIdentifier(value) {
        throw ValidationError("\(flag) must be 10 letters or digits, got \(value.count) characters")
    }
}

/// Checks a flag's value with one of the job contract's rules; the error names the flag.
func check(_ flag: String, _ rule: () throws(JobRejection) -> Void) throws {
    do { try rule() } catch { throw ValidationError("\(flag): \(error.message)") }
}

/// Refuses a `--rate` (jobs per second) that is not a finite number of at least 0.01: NaN ran
/// flat out, and a tiny rate made the pacing overflow.
func checkRate(_ rate: Double?) throws {
    if let rate, !(rate.isFinite && rate >= 0.01) { throw ValidationError("--rate must be a number of jobs per second, at least 0.01") }
}
