/// \file
/// Interval: a closed interval of reals at 50 digits (Boost.Multiprecision's MPFI backend, MPFI over
/// MPFR), the scalar of certified gradients (check/certify.hpp). Every operation returns an interval
/// that contains the exact real result of the same operation applied to any points of its operands
/// (outward rounding), so a whole computation run in Interval from point inputs ends in an interval
/// that provably holds what the same code computes in exact real arithmetic: no step, no tolerance.
///
///     Interval x = 0.1;                 // the double 0.1, exactly: a point interval
///     Interval y = exp(x) / 3;          // contains e^0.1000000000000000055... / 3
///     lower(y), upper(y), width(y)      // 50-digit bounds (mp50 is not needed to read them)
///
/// Comparisons. Two intervals compare decidedly when they are disjoint (or the same point); when they
/// overlap, the exact values they stand for may compare either way, and the comparison is
/// *ambiguous*: a branch taken on it (relu at 0, a max with a tie, a clamp at its bound) is a point
/// where the computed function may have no derivative. Boost's own operators throw interval_error
/// there from a noexcept function (Boost 1.74: std::terminate, no catch sees it), so Interval
/// decides its comparisons itself: an ambiguous one is counted and described, with the node the tape
/// was computing, in the ambiguity log (`interval_ambiguities()`, which the certifier clears and
/// reads around each run)
/// and answered by comparing the midpoints, so the computation goes on along one branch and the
/// certifier reports what it touched as undecided instead of certified or wrong.
/// `exactly_zero(x)` (the strong zero of Dual's products, autodiff/dual.hpp) asks whether x is exactly the
/// point 0, which is never ambiguous: a tangent that merely contains 0 is multiplied out, which
/// encloses the same exact product.
/// Only the headers that certify include this one (it brings MPFI, MPFR and GMP: link
/// tapegrad::certify); a program that never certifies compiles and links none of it.
#pragma once

#include "autodiff/dual.hpp"
#include "autodiff/tape.hpp"

#include <boost/multiprecision/mpfi.hpp>
#include <fmt/core.h>

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mpfr.h>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

namespace tapegrad {

/// MPFI at 50 decimal digits, without expression templates (each operation a value).
using mpfi50 = boost::multiprecision::number<boost::multiprecision::mpfi_float_backend<50>,
                                             boost::multiprecision::et_off>;
/// Its endpoints' type: MPFR at the same precision.
using mpfr50 = boost::multiprecision::number<boost::multiprecision::mpfr_float_backend<50>,
                                             boost::multiprecision::et_off>;

/// One ambiguous comparison made inside an op: the operator, the two intervals (20-digit text), and
/// the node whose forward or VJP made it, as the tape said (NodeContext below).
struct IntervalAmbiguity {
    std::string comparison;  ///< "<", "<=", ">", ">=", "==", "!="
    std::string left, right;
    std::uint32_t node = 0;
    bool in_vjp = false;
};

/// The ambiguous comparisons since the last clear made inside a tape's op (its forward or VJP, as the
/// tape said: the branches of the computed function), how many and the first few; and how many
/// were made outside every op (the public functions' argument checks, as a dropout mask's 0 or 1,
/// and code outside any tape), which choose no branch of a recorded function.
struct IntervalAmbiguityLog {
    std::size_t count = 0;
    std::vector<IntervalAmbiguity> first;  ///< at most `kept` of them
    std::size_t outside_ops = 0;
    static constexpr std::size_t kept = 8;
};

namespace detail {
/// One log for the process, not per thread: an op may split its work over threads
/// (autodiff/parallel.hpp), and a comparison made on a worker must not be missed, since a branch
/// taken on it unseen would make an enclosure hold for the other branch's function only. The
/// certifier holds `run` for the whole of a certification, so certifications take turns.
struct IntervalState {
    std::mutex run;
    std::mutex log_mutex;
    IntervalAmbiguityLog log;
    std::atomic<std::uint32_t> node{0};
    std::atomic<bool> node_known{false};
    std::atomic<bool> in_vjp{false};
};
inline IntervalState& interval_state() {
    static IntervalState state;
    return state;
}
}  // namespace detail

/// A copy of the log.
inline IntervalAmbiguityLog interval_ambiguities() {
    detail::IntervalState& state = detail::interval_state();
    const std::lock_guard lock(state.log_mutex);
    return state.log;
}

/// Empties the log and forgets the node (before a run whose comparisons are to be read).
inline void clear_interval_ambiguities() {
    detail::IntervalState& state = detail::interval_state();
    const std::lock_guard lock(state.log_mutex);
    state.log = {};
    state.node_known = false;
}

class Interval {
public:
    /// Read by the scalar concepts (autodiff/scalar.hpp) as a Boost.Multiprecision number's.
    using backend_type = mpfi50::backend_type;

    Interval() = default;
    /// A point: a built-in number converts exactly (every double and integer is a 50-digit point).
    template <class U>
        requires std::is_arithmetic_v<U>
    Interval(U x) : x_(x) {}  // NOLINT: implicit, so `a * 2` and `T(0.5)` read as for double
    /// An MPFI interval as it is (a function, not a constructor: a converting constructor from
    /// mpfi50 would make Boost's own conversion traits look at Interval, and fail, on every copy).
    static Interval of(const mpfi50& x) { return Interval(Wrap{}, mpfi50(x)); }
    /// The same from a temporary, taken over without a copy: each arithmetic result below is one
    /// MPFI allocation, not three (a temporary, a default value, the copy), and allocation is most
    /// of a certification's time.
    static Interval of(mpfi50&& x) { return Interval(Wrap{}, std::move(x)); }
    /// [lo, hi] (lo ≤ hi).
    Interval(const mpfr50& lo, const mpfr50& hi) : x_(lo, hi) {}

    const mpfi50& mpfi() const { return x_; }

    friend mpfr50 lower(const Interval& a) { return boost::multiprecision::lower(a.x_); }
    friend mpfr50 upper(const Interval& a) { return boost::multiprecision::upper(a.x_); }
    friend mpfr50 midpoint(const Interval& a) { return boost::multiprecision::median(a.x_); }
    friend mpfr50 width(const Interval& a) { return boost::multiprecision::width(a.x_); }
    friend bool overlap(const Interval& a, const Interval& b) { return boost::multiprecision::overlap(a.x_, b.x_); }
    friend bool is_point(const Interval& a) { return mpfr_equal_p(a.lo(), a.hi()) != 0; }
    /// Exactly the point 0 (never ambiguous): Dual's strong zero.
    friend bool exactly_zero(const Interval& a) { return mpfr_zero_p(a.lo()) && mpfr_zero_p(a.hi()); }
    /// The midpoint, rounded (what to_double reports).
    template <class U>
    U convert_to() const {
        return midpoint(*this).template convert_to<U>();
    }
    /// "[lo, hi]" with `digits` significant digits each.
    std::string text(int digits = 20) const {
        return fmt::format("[{}, {}]", lower(*this).str(digits), upper(*this).str(digits));
    }

    friend std::ostream& operator<<(std::ostream& out, const Interval& a) { return out << a.text(); }

    friend Interval operator+(const Interval& a, const Interval& b) { return of(mpfi50(a.x_ + b.x_)); }
    friend Interval operator-(const Interval& a, const Interval& b) { return of(mpfi50(a.x_ - b.x_)); }
    friend Interval operator*(const Interval& a, const Interval& b) { return of(mpfi50(a.x_ * b.x_)); }
    friend Interval operator/(const Interval& a, const Interval& b) { return of(mpfi50(a.x_ / b.x_)); }
    friend Interval operator-(const Interval& a) { return of(mpfi50(-a.x_)); }
    friend Interval operator+(const Interval& a) { return a; }
    /// c += a·b (kernels::multiply_add, the plain products' loops): the product in a scratch interval
    /// of the thread's, then added in place, with no allocation.
    friend void multiply_add_in_place(Interval& c, const Interval& a, const Interval& b) {
        thread_local mpfi50 product;
        product = a.x_;
        product *= b.x_;
        c.x_ += product;
    }

    // In place (MPFI's operations allow the result to be an operand): no temporary to allocate.
    Interval& operator+=(const Interval& b) {
        x_ += b.x_;
        return *this;
    }
    Interval& operator-=(const Interval& b) {
        x_ -= b.x_;
        return *this;
    }
    Interval& operator*=(const Interval& b) {
        x_ *= b.x_;
        return *this;
    }
    Interval& operator/=(const Interval& b) {
        x_ /= b.x_;
        return *this;
    }

    // An ordering is decided only when the intervals lie strictly apart: where they overlap or touch
    // (a tie: relu's a > 0 at a = 0, two equal maxima, a clamp at its bound) a small change of the
    // inputs can flip the branch, so the function may have no derivative there, and the comparison
    // is logged as ambiguous (answered by the midpoints). Two equal infinite points are decided (no
    // change of the inputs moves a masked −inf). Equality is decided for identical intervals (true:
    // one point, or a copy of one value, as max's VJP finds its argmax in the input it copied) and
    // for disjoint ones (false).
    friend bool operator<(const Interval& a, const Interval& b) {
        return decide(a, b, "<", apart(a, b), apart(b, a) || same_infinity(a, b));
    }
    friend bool operator>(const Interval& a, const Interval& b) { return b < a; }
    friend bool operator<=(const Interval& a, const Interval& b) {
        return decide(a, b, "<=", apart(a, b) || same_infinity(a, b), apart(b, a));
    }
    friend bool operator>=(const Interval& a, const Interval& b) { return b <= a; }
    friend bool operator==(const Interval& a, const Interval& b) {
        const bool identical = mpfr_equal_p(a.lo(), b.lo()) && mpfr_equal_p(a.hi(), b.hi());  // one point, or a copy
        return decide(a, b, "==", identical, !overlap(a, b));
    }
    friend bool operator!=(const Interval& a, const Interval& b) { return !(a == b); }

    // The functions the ops use, each enclosing the exact function's range over the interval.
    friend Interval abs(const Interval& a) { return of(mpfi50(boost::multiprecision::abs(a.x_))); }
    friend Interval fabs(const Interval& a) { return abs(a); }
    friend Interval sqrt(const Interval& a) { return of(mpfi50(boost::multiprecision::sqrt(a.x_))); }
    friend Interval exp(const Interval& a) { return of(mpfi50(boost::multiprecision::exp(a.x_))); }
    friend Interval expm1(const Interval& a) { return of(mpfi50(boost::multiprecision::expm1(a.x_))); }
    friend Interval log(const Interval& a) { return of(mpfi50(boost::multiprecision::log(a.x_))); }
    friend Interval log1p(const Interval& a) { return of(mpfi50(boost::multiprecision::log1p(a.x_))); }
    friend Interval tanh(const Interval& a) { return of(mpfi50(boost::multiprecision::tanh(a.x_))); }
    friend Interval sinh(const Interval& a) { return of(mpfi50(boost::multiprecision::sinh(a.x_))); }
    friend Interval cosh(const Interval& a) { return of(mpfi50(boost::multiprecision::cosh(a.x_))); }
    friend Interval sin(const Interval& a) { return of(mpfi50(boost::multiprecision::sin(a.x_))); }
    friend Interval cos(const Interval& a) { return of(mpfi50(boost::multiprecision::cos(a.x_))); }
    friend Interval atan(const Interval& a) { return of(mpfi50(boost::multiprecision::atan(a.x_))); }
    friend Interval pow(const Interval& a, const Interval& b) { return of(mpfi50(boost::multiprecision::pow(a.x_, b.x_))); }
    /// erf is increasing: [erf(lo) rounded down, erf(hi) rounded up] (MPFR's correctly rounded erf;
    /// MPFI has none). erfc = 1 − erf is decreasing.
    friend Interval erf(const Interval& a) { return monotone(a, mpfr_erf, true); }
    friend Interval erfc(const Interval& a) { return monotone(a, mpfr_erfc, false); }
    friend Interval floor(const Interval& a) { return Interval(mpfr50(boost::multiprecision::floor(lower(a))), mpfr50(boost::multiprecision::floor(upper(a)))); }
    friend Interval ceil(const Interval& a) { return Interval(mpfr50(boost::multiprecision::ceil(lower(a))), mpfr50(boost::multiprecision::ceil(upper(a)))); }
    friend Interval max(const Interval& a, const Interval& b) { return a < b ? b : a; }
    /// A max shift's choice (autodiff/dual.hpp): by midpoints, never logged, since which of two
    /// tied values a softmax subtracts changes no function.
    friend bool shift_prefers(const Interval& candidate, const Interval& current) {
        return midpoint(candidate) > midpoint(current);
    }
    friend Interval min(const Interval& a, const Interval& b) { return b < a ? b : a; }
    friend bool isnan(const Interval& a) { return mpfr_nan_p(a.lo()) || mpfr_nan_p(a.hi()); }
    friend bool isinf(const Interval& a) { return mpfr_inf_p(a.lo()) && mpfr_equal_p(a.lo(), a.hi()); }
    friend bool isfinite(const Interval& a) { return mpfr_number_p(a.lo()) && mpfr_number_p(a.hi()); }

private:
    struct Wrap {};
    Interval(Wrap, mpfi50&& x) : x_(std::move(x)) {}
    /// The endpoints in place, for tests that need no copy of them (lower and upper return values).
    mpfr_srcptr lo() const { return &x_.backend().data()[0].left; }
    mpfr_srcptr hi() const { return &x_.backend().data()[0].right; }

    /// Every point of a below every point of b (false when either holds a NaN).
    static bool apart(const Interval& a, const Interval& b) { return mpfr_less_p(a.hi(), b.lo()) != 0; }
    static bool same_infinity(const Interval& a, const Interval& b) {
        return is_point(a) && is_point(b) && mpfr_inf_p(a.lo()) && mpfr_equal_p(a.lo(), b.lo());
    }
    /// `yes` when the comparison is certainly true, `no` when certainly false; otherwise ambiguous.
    static bool decide(const Interval& a, const Interval& b, const char* comparison, bool yes, bool no) {
        if (yes) return true;
        if (no) return false;
        detail::IntervalState& state = detail::interval_state();
        {
            const std::lock_guard lock(state.log_mutex);
            if (!state.node_known) {
                ++state.log.outside_ops;
            } else {
                if (state.log.first.size() < IntervalAmbiguityLog::kept)
                    state.log.first.push_back({comparison, a.text(), b.text(), state.node.load(), state.in_vjp.load()});
                ++state.log.count;
            }
        }
        const mpfr50 ma = midpoint(a), mb = midpoint(b);
        const std::string_view c = comparison;
        if (c == "<") return ma < mb;
        if (c == "<=") return ma <= mb;
        return ma == mb;
    }
    using MpfrFunction = int (*)(mpfr_ptr, mpfr_srcptr, mpfr_rnd_t);
    static Interval monotone(const Interval& a, MpfrFunction f, bool increasing) {
        mpfr50 lo = lower(a), hi = upper(a), f_lo, f_hi;
        f(f_lo.backend().data(), (increasing ? lo : hi).backend().data(), MPFR_RNDD);
        f(f_hi.backend().data(), (increasing ? hi : lo).backend().data(), MPFR_RNDU);
        return Interval(f_lo, f_hi);
    }

    mpfi50 x_{0};
};

/// The tape names the node computing (autodiff/tape.hpp), for Interval and Dual<Interval> tapes.
template <>
struct NodeContext<Interval> {
    static void enter(std::uint32_t node, bool in_vjp) {
        detail::IntervalState& state = detail::interval_state();
        state.node = node;
        state.in_vjp = in_vjp;
        state.node_known = true;
    }
    static void leave() { detail::interval_state().node_known = false; }
};
template <>
struct NodeContext<Dual<Interval>> : NodeContext<Interval> {};

}  // namespace tapegrad

/// \cond
// The limits of an interval's endpoints (Boost's MPFR at 50 digits), as points.
namespace std {
template <>
class numeric_limits<tapegrad::Interval> {
    using limits = std::numeric_limits<tapegrad::mpfr50>;

public:
    static constexpr bool is_specialized = true;
    static constexpr bool is_signed = true;
    static constexpr bool is_integer = false;
    static constexpr bool is_exact = false;
    static constexpr bool has_infinity = true;
    static constexpr bool has_quiet_NaN = true;
    static constexpr int digits = limits::digits;
    static constexpr int digits10 = limits::digits10;
    static constexpr int max_digits10 = limits::max_digits10;
    static constexpr int radix = 2;
    static constexpr int max_exponent = limits::max_exponent;
    static constexpr int min_exponent = limits::min_exponent;
    static constexpr int max_exponent10 = limits::max_exponent10;
    static constexpr int min_exponent10 = limits::min_exponent10;
    static constexpr bool has_signaling_NaN = false;
    static constexpr bool is_bounded = true;
    static constexpr bool is_modulo = false;
    static constexpr bool is_iec559 = false;
    static constexpr bool traps = false;
    static constexpr bool tinyness_before = false;
    static constexpr std::float_round_style round_style = std::round_indeterminate;
    static tapegrad::Interval epsilon() { return point(limits::epsilon()); }
    static tapegrad::Interval infinity() { return point(limits::infinity()); }
    static tapegrad::Interval quiet_NaN() { return point(limits::quiet_NaN()); }
    static tapegrad::Interval max() { return point((limits::max)()); }
    static tapegrad::Interval min() { return point((limits::min)()); }
    static tapegrad::Interval lowest() { return point(limits::lowest()); }

private:
    static tapegrad::Interval point(const tapegrad::mpfr50& x) { return tapegrad::Interval(x, x); }
};
}  // namespace std
/// \endcond
