import CJemalloc

/// The process's malloc: jemalloc, linked into the executable (see Package.swift for why).
enum MemoryAllocator {
    /// "jemalloc 5.3.0-…", or "unknown" if the linked malloc does not answer `mallctl`.
    /// Logged at start-up, so that a deployment that lost the allocator shows it.
    static var description: String {
        var version: UnsafePointer<CChar>?
        var size = MemoryLayout<UnsafePointer<CChar>?>.size
        guard mallctl("version", &version, &size, nil, 0) == 0, let version else { return "unknown" }
        return "jemalloc " + String(cString: version)
    }
}
