import CJemalloc

/// The process's malloc: jemalloc, linked into the executable (see Package.swift for why), with
/// the options in Sources/MallocSettings.
enum MemoryAllocator {
    /// "jemalloc 5.3.0-… (background_thread, dirty_decay_ms 1000)", or "unknown" if the linked
    /// malloc does not answer `mallctl`. Logged at start-up, so that a deployment that lost the
    /// allocator or its options shows it.
    static var description: String {
        guard let version: UnsafePointer<CChar> = read("version") else { return "unknown" }
        var text = "jemalloc " + String(cString: version)
        if let background: Bool = read("opt.background_thread"), let decay: Int = read("opt.dirty_decay_ms") {
            text += " (\(background ? "background_thread, " : "")dirty_decay_ms \(decay))"
        }
        return text
    }

    private static func read<Value>(_ name: String) -> Value? {
        let slot = UnsafeMutablePointer<Value>.allocate(capacity: 1)
        defer { slot.deallocate() }
        var size = MemoryLayout<Value>.size
        guard mallctl(name, slot, &size, nil, 0) == 0, size == MemoryLayout<Value>.size else { return nil }
        return slot.move()
    }
}
