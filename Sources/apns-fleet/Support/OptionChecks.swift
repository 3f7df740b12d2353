import APNsCore
import ArgumentParser
import FleetLoad

// Checks of option values shared by several commands, each error naming its flag (a
// ValidationError: exit status 2, with the usage line).

/// Refuses a key or team id flag (given as flag → value; nil values are skipped) that is not
/// 10 letters or digits, as the worker's configuration does.
func checkAppleIdentifiers(_ flags: KeyValuePairs<String, String?>) throws {
    for case let (flag, value?) in flags where !ProviderTokenSigner.isWellFormedIdentifier(value) {
        let lettersAndDigits = value.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber) }
        let problem = lettersAndDigits ? "got \(value.count) characters" : "\(JobRules.quoted(JobRules.clip(value))) has other characters"
        throw ValidationError("\(flag) must be 10 letters or digits (A-Z, a-z, 0-9), \(problem)")
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

/// Refuses a simulated APNs latency (milliseconds, handed to the simulator's `--latency-ms`)
/// outside what the simulator takes, 0 to a day, before anything is started.
func checkSimulatedLatency(_ flag: String, _ milliseconds: Int?) throws {
    if let milliseconds, !(0...86_400_000).contains(milliseconds) {
        throw ValidationError("\(flag) must be 0 to 86400000 (a day), got \(milliseconds)")
    }
}

/// The `--mix` of generated jobs, kind=weight,…; a bad one is a usage error naming the flag.
func parseMix(_ text: String) throws -> JobMix {
    do { return try JobMix(parsing: text) } catch { throw ValidationError("--mix: \(error)") }
}
