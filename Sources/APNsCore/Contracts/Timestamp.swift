/// A point in time as milliseconds since the Unix epoch, the unit every contract uses.
///
/// Formatting to RFC 3339 is done by hand: results are written per notification and
/// Foundation's date formatters are far too slow for that.
public struct UnixMillis: Sendable, Hashable, Comparable, CustomStringConvertible {
    public var value: Int64

    public init(_ value: Int64) {
        self.value = value
    }

    /// Saturates instead of wrapping: a huge number of seconds is the far future, not the past.
    public init(seconds: Int64) {
        let (product, overflow) = seconds.multipliedReportingOverflow(by: 1000)
        self.value = overflow ? (seconds < 0 ? .min : .max) : product
    }

    public var seconds: Int64 { value / 1000 }

    public static func < (lhs: UnixMillis, rhs: UnixMillis) -> Bool { lhs.value < rhs.value }

    /// `2026-11-22T10:00:00.123Z`.
    public var rfc3339: String {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(24)
        appendRFC3339(to: &bytes)
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Appends ``rfc3339`` to `bytes` without making a String (results carry one each).
    public func appendRFC3339(to bytes: inout [UInt8]) {
        // Floor division without a subtraction that could overflow at Int64.min.
        var (totalSeconds, remainder) = value.quotientAndRemainder(dividingBy: 1000)
        if remainder < 0 {
            remainder += 1000
            totalSeconds -= 1
        }
        let millis = Int(remainder)
        var days = totalSeconds / 86_400
        var secondsOfDay = totalSeconds % 86_400
        if secondsOfDay < 0 {
            secondsOfDay += 86_400
            days -= 1
        }
        let (year, month, day) = Self.civil(fromDays: days)
        let seconds = Int(secondsOfDay)
        // Only the year can fall outside its digits: one before 0 or past 9999 (no real job has
        // one) is written as its number, padded, before the rest.
        let fourDigitYear = (0...9999).contains(year)
        if !fourDigitYear { bytes.append(contentsOf: String(year).leftPadded(to: 4).utf8) }
        // One append for the rest, and digits by constant divisors: appended byte by byte, each
        // with its own uniqueness check and division by a variable, this showed in profiles
        // (every result carries a timestamp).
        bytes.append(addingCapacity: 24) { out in
            func digits2(_ value: Int) {
                out.append(UInt8(truncatingIfNeeded: 48 + value / 10))
                out.append(UInt8(truncatingIfNeeded: 48 + value % 10))
            }
            if fourDigitYear {
                digits2(year / 100)
                digits2(year % 100)
            }
            out.append(UInt8(ascii: "-"))
            digits2(month)
            out.append(UInt8(ascii: "-"))
            digits2(day)
            out.append(UInt8(ascii: "T"))
            digits2(seconds / 3600)
            out.append(UInt8(ascii: ":"))
            digits2(seconds % 3600 / 60)
            out.append(UInt8(ascii: ":"))
            digits2(seconds % 60)
            out.append(UInt8(ascii: "."))
            out.append(UInt8(truncatingIfNeeded: 48 + millis / 100))
            digits2(millis % 100)
            out.append(UInt8(ascii: "Z"))
        }
    }

    /// Parses what `rfc3339` writes (UTC with `Z`, optional fraction of up to 9 digits).
    public init?(rfc3339 text: String) {
        let b = Array(text.utf8)
        func number(_ range: Range<Int>) -> Int? {
            guard range.upperBound <= b.count else { return nil }
            var value = 0
            for i in range {
                guard b[i] >= 48 && b[i] <= 57 else { return nil }
                value = value * 10 + Int(b[i] - 48)
            }
            return value
        }
        guard b.count >= 20, b[4] == UInt8(ascii: "-"), b[7] == UInt8(ascii: "-"), b[10] == UInt8(ascii: "T"),
            b[13] == UInt8(ascii: ":"), b[16] == UInt8(ascii: ":"), b.last == UInt8(ascii: "Z"),
            let year = number(0..<4), let month = number(5..<7), let day = number(8..<10),
            let hour = number(11..<13), let minute = number(14..<16), let second = number(17..<19),
            (1...12).contains(month), (1...31).contains(day), hour < 24, minute < 60, second < 61
        else { return nil }
        var millis = 0
        if b[19] == UInt8(ascii: ".") {
            let digits = b.count - 21
            guard digits >= 1, digits <= 9, let fraction = number(20..<(b.count - 1)) else { return nil }
            var scaled = fraction
            for _ in stride(from: digits, to: 3, by: 1) { scaled *= 10 }
            for _ in stride(from: 3, to: digits, by: 1) { scaled /= 10 }
            millis = scaled
        } else if b.count != 20 {
            return nil
        }
        let days = Self.days(fromCivil: year, month, day)
        let seconds = days * 86_400 + Int64(hour * 3600 + minute * 60 + second)
        self.value = seconds * 1000 + Int64(millis)
    }

    public var description: String { rfc3339 }

    // Howard Hinnant's days-from-civil algorithms (proleptic Gregorian calendar).
    static func civil(fromDays z0: Int64) -> (Int, Int, Int) {
        let z = z0 + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365
        let y = yoe + era * 400
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        return (Int(m <= 2 ? y + 1 : y), Int(m), Int(d))
    }

    static func days(fromCivil year: Int, _ month: Int, _ day: Int) -> Int64 {
        let y = Int64(month <= 2 ? year - 1 : year)
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let m = Int64(month)
        let doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + Int64(day) - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }
}
