import Foundation

#if FUZZING
import CLibFuzzer

/// Built by `make fuzz` with `-sanitize=fuzzer,address -D FUZZING`: hands the command line to
/// libFuzzer's driver, which calls `fuzzOneInput` for every input. CORE_FUZZ_TARGET picks the target.
@main
struct Fuzz {
    static func main() {
        let name = ProcessInfo.processInfo.environment["CORE_FUZZ_TARGET"] ?? ""
        guard FuzzTarget(rawValue: name) != nil else {
            print("set CORE_FUZZ_TARGET to one of \(FuzzTarget.allCases.map(\.rawValue).joined(separator: ", "))")
            exit(2)
        }
        var argc = CommandLine.argc
        var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
        exit(LLVMFuzzerRunDriver(&argc, &argv, { data, size in fuzzOneInput(data, size) }))
    }
}

/// Read once, from the C callback (which cannot capture context).
let selectedTarget = FuzzTarget(rawValue: ProcessInfo.processInfo.environment["CORE_FUZZ_TARGET"] ?? "") ?? .envelope

/// libFuzzer's entry point; also what the driver above calls.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    selectedTarget.run(bytes)
    return 0
}

#else

/// Without libFuzzer: replays files through a target, as `CoreFuzz TARGET PATH...` (a path may
/// be a directory, whose files are all run). Reproduces a crash libFuzzer saved, and lets the
/// sanitizer builds run the committed seed corpus.
@main
struct Replay {
    static func main() throws {
        let arguments = CommandLine.arguments.dropFirst()
        guard let name = arguments.first, let target = FuzzTarget(rawValue: name) else {
            print("usage: CoreFuzz {\(FuzzTarget.allCases.map(\.rawValue).joined(separator: "|"))} FILE-OR-DIRECTORY...")
            exit(2)
        }
        var count = 0
        for path in arguments.dropFirst() {
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
                print("no such file: \(path)")
                exit(2)
            }
            let files = isDirectory.boolValue
                ? try FileManager.default.contentsOfDirectory(atPath: path).sorted().map { (path as NSString).appendingPathComponent($0) }
                : [path]
            for file in files {
                guard let data = FileManager.default.contents(atPath: file) else { continue }
                target.run(Array(data))
                count += 1
            }
        }
        print("\(target.rawValue): \(count) inputs replayed, every property held")
    }
}

#endif
