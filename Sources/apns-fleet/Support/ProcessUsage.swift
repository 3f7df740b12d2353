import Foundation

#if canImport(Glibc)
// On Linux the compiler attributes timespec's members to this module (swift-corelibs-foundation's
// own); a future toolchain could hide it, and ThreadCPUTime would then need another home.
import CoreFoundation
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

/// Another process's CPU time and memory, from the kernel's own accounting of it
/// (`/proc/<pid>/stat` and `/proc/<pid>/status`, the figures getrusage reports to the process
/// itself). Linux only; nil elsewhere or once the process is gone.
struct ChildUsage {
    let cpuSeconds: Double
    let residentKilobytes: Int
    let peakResidentKilobytes: Int

    static func of(pid: Int32) -> ChildUsage? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return nil }
        // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { return nil }
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        func kilobytes(_ key: String) -> Int {
            guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix(key) }) else { return 0 }
            return Int(line.split(separator: " ").dropFirst().first { Int($0) != nil } ?? "") ?? 0
        }
        return ChildUsage(cpuSeconds: (user + system) / ticks, residentKilobytes: kilobytes("VmRSS:"), peakResidentKilobytes: kilobytes("VmHWM:"))
    }
}

/// The whole machine's CPU time, from the first line of `/proc/stat`. On a virtual machine the
/// hypervisor may run other guests on "our" cores; the share it took (steal) while a benchmark
/// ran says how far that run's figures can be compared with others. Linux only; nil elsewhere.
struct HostCPUTimes {
    let totalTicks: UInt64
    let stealTicks: UInt64

    static func now() -> HostCPUTimes? {
        guard let stat = try? String(contentsOfFile: "/proc/stat", encoding: .utf8),
            let line = stat.split(separator: "\n").first, line.hasPrefix("cpu ")
        else { return nil }
        // user nice system idle iowait irq softirq steal [guest guest_nice, already in user/nice]
        let ticks = line.split(separator: " ").dropFirst().prefix(8).compactMap { UInt64($0) }
        guard ticks.count == 8 else { return nil }
        return HostCPUTimes(totalTicks: ticks.reduce(0, +), stealTicks: ticks[7])
    }

    /// The percentage of all CPU time from `start` until now that the hypervisor took; nil when
    /// either reading is unavailable.
    static func stealPercent(since start: HostCPUTimes?) -> Double? {
        guard let start, let now = now() else { return nil }
        return now.stealPercent(since: start)
    }

    /// The percentage of all CPU time since `earlier` that the hypervisor took.
    func stealPercent(since earlier: HostCPUTimes) -> Double? {
        guard totalTicks > earlier.totalTicks, stealTicks >= earlier.stealTicks else { return nil }
        return Double(stealTicks - earlier.stealTicks) / Double(totalTicks - earlier.totalTicks) * 100
    }
}

/// The calling thread's own CPU time: unlike the wall clock, it leaves out time the host gave
/// to other threads or other guests (steal).
enum ThreadCPUTime {
    static func nanoseconds() -> Int64 {
        // Unlike getrusage(RUSAGE_THREAD), which Linux updates at scheduler ticks, this includes
        // the running time slice, to the nanosecond.
        var time = timespec(tv_sec: 0, tv_nsec: 0)
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
        return Int64(time.tv_sec) * 1_000_000_000 + Int64(time.tv_nsec)
    }
}
