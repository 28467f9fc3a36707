// tools/options.hpp: the one way the project's programs read numbers from their command lines
// (tapegrad-check, train_charlm, train_retrieval, curvature, the benchmarks). A whole number is
// read as signed text and checked against the option's range, so "-T -5" is refused by name
// instead of wrapping to 18446744073709551611; a real must be finite and in its range. Each refusal
// is a usage_error naming the option, the value and what is allowed; the programs print it and
// exit 2 before they write anything. And the memory a run will need, from its sizes, is compared
// with what the machine has available before the first large allocation (require_memory), so an
// oversized run is refused with both numbers instead of ending in std::bad_alloc or swapping.
// Programs' code, not the library's: nothing under autodiff/ ... models/ includes it.
#pragma once

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace tapegrad::cli {

namespace po = boost::program_options;

// A bad command line (a value out of range, not a number, a run too large for this machine): the
// programs print it and exit 2. A po::error, so one handler serves Boost.Program_options' own.
class usage_error : public po::error {
public:
    using po::error::error;
};

constexpr int exit_usage = 2;

// The most threads a --threads option takes: a typo's guard (set_threads itself takes any count).
constexpr unsigned max_threads = 4096;

namespace detail {

// "an integer from 1 to 64" or "an integer of at least 1".
template <std::integral Int>
std::string allowed_integers(Int least, Int most) {
    if (most == std::numeric_limits<Int>::max()) return fmt::format("an integer of at least {}", least);
    return fmt::format("an integer from {} to {}", least, most);
}

// The whole text as an integer in [least, most], or nothing. Negative text is parsed as signed
// and the rest as unsigned (so every uint64_t seed is readable): never wrapped, never truncated.
template <std::integral Int>
std::optional<Int> parse_integer(std::string_view text, Int least, Int most) {
    if (text.starts_with('+')) text.remove_prefix(1);
    const char* const first = text.data();
    const char* const last = first + text.size();
    const auto in_range = [&](auto value) -> std::optional<Int> {
        if (std::cmp_less(value, least) || std::cmp_greater(value, most)) return std::nullopt;
        return static_cast<Int>(value);
    };
    if (text.starts_with('-')) {
        long long value = 0;
        const auto [end, error] = std::from_chars(first, last, value);
        return error == std::errc{} && end == last ? in_range(value) : std::nullopt;
    }
    unsigned long long value = 0;
    const auto [end, error] = std::from_chars(first, last, value);
    return error == std::errc{} && end == last && !text.empty() ? in_range(value) : std::nullopt;
}

// The reals a real option takes: [least, most], or (least, most] when least_excluded; a most of
// the largest double means no upper bound.
struct RealRange {
    double least, most;
    bool least_excluded;

    bool holds(double value) const {
        return std::isfinite(value) && (least_excluded ? value > least : value >= least) && value <= most;
    }
    std::string text() const {
        const std::string lower = least_excluded ? fmt::format("above {}", least) : fmt::format("of at least {}", least);
        if (most == std::numeric_limits<double>::max()) return fmt::format("a finite number {}", lower);
        return fmt::format("a number {} and at most {}", lower, most);
    }
};

// The whole text as a real in `range`, or nothing.
inline std::optional<double> parse_real(std::string_view text, const RealRange& range) {
    if (text.starts_with('+')) text.remove_prefix(1);
    double value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc{} || end != text.data() + text.size() || text.empty() || !range.holds(value)) return std::nullopt;
    return value;
}

// Boost.Program_options' error for a refused value, with our message: the library fills in the
// option's name (%canonical_option%) when it catches it in po::store.
class refused_value : public po::validation_error {
public:
    explicit refused_value(std::string message) : po::validation_error(po::validation_error::invalid_option_value) {
        m_error_template = std::move(message);
    }
};

template <std::integral Int>
class IntegerValue final : public po::typed_value<Int> {
public:
    IntegerValue(Int* target, Int least, Int most) : po::typed_value<Int>(target), least_(least), most_(most) {}

    void xparse(boost::any& store, const std::vector<std::string>& tokens) const override {
        const std::string& text = po::validators::get_single_string(tokens);
        const std::optional<Int> value = parse_integer(text, least_, most_);
        if (!value) {
            throw refused_value(fmt::format("%canonical_option% must be {}, got '{}'",
                                            allowed_integers(least_, most_), text));
        }
        store = *value;
    }

private:
    Int least_, most_;
};

class RealValue final : public po::typed_value<double> {
public:
    RealValue(double* target, RealRange range) : po::typed_value<double>(target), range_(range) {}

    void xparse(boost::any& store, const std::vector<std::string>& tokens) const override {
        const std::string& text = po::validators::get_single_string(tokens);
        const std::optional<double> value = parse_real(text, range_);
        if (!value) throw refused_value(fmt::format("%canonical_option% must be {}, got '{}'", range_.text(), text));
        store = *value;
    }

private:
    RealRange range_;
};

}  // namespace detail

// An integer option read into *target, refused outside [least, most]. Boost.Program_options takes
// ownership of the value object (as of po::value's), hence the plain pointer.
template <std::integral Int>
po::typed_value<Int>* integer(Int* target, Int least, Int most = std::numeric_limits<Int>::max()) {
    return new detail::IntegerValue<Int>(target, least, most);
}

// A real option read into *target, refused unless finite and in [least, most].
inline po::typed_value<double>* real(double* target, double least, double most = std::numeric_limits<double>::max()) {
    return new detail::RealValue(target, detail::RealRange{least, most, false});
}

// A real option that must be finite and above zero (at most `most`).
inline po::typed_value<double>* positive_real(double* target, double most = std::numeric_limits<double>::max()) {
    return new detail::RealValue(target, detail::RealRange{0.0, most, true});
}

// A positional argument (`curvature 300`), read like an option; `name` says which in a refusal.
template <std::integral Int>
Int integer_argument(std::string_view name, std::string_view text, Int least,
                     Int most = std::numeric_limits<Int>::max()) {
    if (const std::optional<Int> value = detail::parse_integer(text, least, most)) return *value;
    throw usage_error(fmt::format("{} must be {}, got '{}'", name, detail::allowed_integers(least, most), text));
}

// The command line parsed for a program that takes options only: a word that is no option
// (`train_charlm stray --steps 1`, `bench_llama 8`) is a positional token, which po::store drops
// without a word, so a mistyped line would run as if it were not there: refused here, by name.
inline po::parsed_options options_only(int argc, const char* const* argv, const po::options_description& options,
                                       std::string_view program) {
    po::parsed_options parsed = po::parse_command_line(argc, argv, options);
    for (const po::option& option : parsed.options) {
        if (option.position_key >= 0) {
            throw usage_error(fmt::format("unexpected argument '{}': {} takes options only", option.original_tokens.front(),
                                          program));
        }
    }
    return parsed;
}

// Bytes the machine can give a new allocation now without swapping: /proc/meminfo's MemAvailable,
// or the free physical pages (sysconf) where that file is missing.
inline std::uint64_t available_memory() {
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    std::uint64_t kib = 0;
    std::string unit;
    while (meminfo >> key >> kib >> unit) {
        if (key == "MemAvailable:") return kib * 1024;
    }
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page)
                                 : std::numeric_limits<std::uint64_t>::max();
}

// "3.2 GiB", "512 MiB".
inline std::string bytes_text(double bytes) {
    constexpr double mib = 1024.0 * 1024.0, gib = 1024.0 * mib;
    return bytes >= gib ? fmt::format("{:.1f} GiB", bytes / gib) : fmt::format("{:.0f} MiB", bytes / mib);
}

// Refuses (usage_error) a run whose memory estimate exceeds what is available. `needed` is a lower
// bound in bytes, `what` what it counts, `options` the options that set it ("--tokens 100000").
inline void require_memory(double needed, std::string_view what, std::string_view options) {
    const double available = static_cast<double>(available_memory());
    if (needed > available) {
        throw usage_error(fmt::format("{} needs at least {} ({}), and this machine has {} available; make it smaller",
                                      options, bytes_text(needed), what, bytes_text(available)));
    }
}

}  // namespace tapegrad::cli
