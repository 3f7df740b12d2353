#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// This process's CPU time (user + system, all threads) and peak resident memory, from
/// getrusage: the benchmarks report what the process itself spent.
struct ProcessUsage {
    let cpuSeconds: Double
    let peakRSSKilobytes: Int

    static func now() -> ProcessUsage {
        var usage = rusage()
        #if canImport(Glibc)
        getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage)
        let peakKilobytes = Int(usage.ru_maxrss)  // Linux reports kilobytes
        #else
        getrusage(RUSAGE_SELF, &usage)
        let peakKilobytes = Int(usage.ru_maxrss) / 1024  // macOS reports bytes
        #endif
        let cpu = Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6
            + Double(usage.ru_stime.tv_sec) + Double(usage.ru_stime.tv_usec) / 1e6
        return ProcessUsage(cpuSeconds: cpu, peakRSSKilobytes: peakKilobytes)
    }
}
