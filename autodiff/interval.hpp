/// \file
/// Interval: a closed interval of reals at 50 digits (MPFI over MPFR, at the precision of
/// Boost.Multiprecision's mpfi_float_50), the scalar of certified gradients (check/certify.hpp).
/// Every operation returns an interval that contains the exact real result of the same operation
/// applied to any points of its operands (outward rounding), so a whole computation run in Interval
/// from point inputs ends in an interval that provably holds what the same code computes in exact
/// real arithmetic: no step, no tolerance.
///
///     Interval x = 0.1;                 // the double 0.1, exactly: a point interval
///     Interval y = exp(x) / 3;          // contains e^0.1000000000000000055... / 3
///     lower(y), upper(y), width(y)      // 50-digit bounds (mp50 is not needed to read them)
///
/// Comparisons. Two intervals compare decidedly when they are disjoint (or the same point); when
/// they overlap, the exact values they stand for may compare either way, and the comparison is
/// *ambiguous*: a branch taken on it (relu at 0, a max with a tie, a clamp at its bound) is a point
/// where the computed function may have no derivative. Boost's own operators throw interval_error
/// there from a noexcept function (Boost 1.74: std::terminate, no catch sees it), so Interval
/// decides its comparisons itself: an ambiguous one is counted and described, with the node the
/// tape was computing, in the ambiguity log (`interval_ambiguities()`, which the certifier clears
/// and reads around each run) and answered by comparing the midpoints, so the computation goes on
/// along one branch and the certifier reports what it touched as undecided instead of certified or
/// wrong. `exactly_zero(x)` (the strong zero of Dual's products, autodiff/dual.hpp) asks whether x
/// is exactly the point 0, which is never ambiguous: a tangent that merely contains 0 is multiplied
/// out, which encloses the same exact product.
/// Speed. Each interval holds its endpoints' digits inside itself (MPFR's custom interface), so making
/// and copying one allocates nothing; and the transcendental functions remember their last results
/// on each thread, since a certification computes the same forward values once per element.
/// Only the headers that certify include this one (it brings MPFI, MPFR and GMP: link
/// tapegrad::certify); a program that never certifies compiles and links none of it.
#pragma once

#include "autodiff/dual.hpp"
#include "autodiff/tape.hpp"

#include <boost/multiprecision/mpfi.hpp>
#include <fmt/core.h>

#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <gmp.h>
#include <mpfi.h>
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

    /// The point 0.
    Interval() : Interval(Storage{}) { mpfi_set_si(x_, 0); }
    /// A point: a built-in number converts exactly (every double and integer is a 50-digit point).
    template <class U>
        requires std::is_arithmetic_v<U>
    Interval(U x) : Interval(Storage{}) {  // NOLINT: implicit, so `a * 2` and `T(0.5)` read as for double
        if constexpr (std::is_floating_point_v<U> && sizeof(U) > sizeof(double)) {
            mpfr_set_ld(&x_->left, x, MPFR_RNDD);
            mpfr_set_ld(&x_->right, x, MPFR_RNDU);
        } else if constexpr (std::is_floating_point_v<U>) {
            mpfi_set_d(x_, static_cast<double>(x));
        } else if constexpr (std::is_signed_v<U>) {
            mpfi_set_si(x_, static_cast<long>(x));
        } else {
            mpfi_set_ui(x_, static_cast<unsigned long>(x));
        }
    }
    /// [lo, hi] (lo ≤ hi).
    Interval(const mpfr50& lo, const mpfr50& hi) : Interval(Storage{}) {
        mpfi_interv_fr(x_, lo.backend().data(), hi.backend().data());
    }
    // A copy copies the endpoints' limbs and points them at its own (MPFR's custom interface).
    Interval(const Interval& other) : x_{*other.x_}, limbs_(other.limbs_) { own_limbs(); }
    Interval& operator=(const Interval& other) {
        *x_ = *other.x_;
        limbs_ = other.limbs_;
        own_limbs();
        return *this;
    }
    ~Interval() = default;  // the limbs are members: nothing to free

    friend mpfr50 lower(const Interval& a) { return endpoint(a.lo()); }
    friend mpfr50 upper(const Interval& a) { return endpoint(a.hi()); }
    friend mpfr50 midpoint(const Interval& a) {
        mpfr50 m;
        mpfi_mid(m.backend().data(), a.x_);
        return m;
    }
    friend mpfr50 width(const Interval& a) {
        mpfr50 w;
        mpfi_diam_abs(w.backend().data(), a.x_);
        return w;
    }
    /// The two share a point (false when either holds a NaN).
    friend bool overlap(const Interval& a, const Interval& b) {
        return (mpfr_lessequal_p(a.lo(), b.lo()) && mpfr_lessequal_p(b.lo(), a.hi())) ||
               (mpfr_lessequal_p(b.lo(), a.lo()) && mpfr_lessequal_p(a.lo(), b.hi()));
    }
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

    friend Interval operator+(const Interval& a, const Interval& b) { return apply(mpfi_add, a, b); }
    friend Interval operator-(const Interval& a, const Interval& b) { return apply(mpfi_sub, a, b); }
    friend Interval operator*(const Interval& a, const Interval& b) { return apply(mpfi_mul, a, b); }
    friend Interval operator/(const Interval& a, const Interval& b) { return apply(mpfi_div, a, b); }
    friend Interval operator-(const Interval& a) { return apply(mpfi_neg, a); }
    friend Interval operator+(const Interval& a) { return a; }
    /// c += a·b (kernels::multiply_add, the plain products' loops): the product in a scratch
    /// interval on the stack, then added in place.
    friend void multiply_add_in_place(Interval& c, const Interval& a, const Interval& b) {
        Interval product(Storage{});
        mpfi_mul(product.x_, a.x_, b.x_);
        mpfi_add(c.x_, c.x_, product.x_);
    }

    // In place (MPFI's operations allow the result to be an operand).
    Interval& operator+=(const Interval& b) {
        mpfi_add(x_, x_, b.x_);
        return *this;
    }
    Interval& operator-=(const Interval& b) {
        mpfi_sub(x_, x_, b.x_);
        return *this;
    }
    Interval& operator*=(const Interval& b) {
        mpfi_mul(x_, x_, b.x_);
        return *this;
    }
    Interval& operator/=(const Interval& b) {
        mpfi_div(x_, x_, b.x_);
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
    friend Interval abs(const Interval& a) { return apply(mpfi_abs, a); }
    friend Interval fabs(const Interval& a) { return abs(a); }
    friend Interval sqrt(const Interval& a) { return apply(mpfi_sqrt, a); }
    friend Interval exp(const Interval& a) { return remembered(Function::exp, a); }
    friend Interval expm1(const Interval& a) { return remembered(Function::expm1, a); }
    friend Interval log(const Interval& a) { return remembered(Function::log, a); }
    friend Interval log1p(const Interval& a) { return remembered(Function::log1p, a); }
    friend Interval tanh(const Interval& a) { return remembered(Function::tanh, a); }
    friend Interval sinh(const Interval& a) { return remembered(Function::sinh, a); }
    friend Interval cosh(const Interval& a) { return remembered(Function::cosh, a); }
    friend Interval sin(const Interval& a) { return remembered(Function::sin, a); }
    friend Interval cos(const Interval& a) { return remembered(Function::cos, a); }
    friend Interval atan(const Interval& a) { return remembered(Function::atan, a); }
    /// Boost's pow for MPFI (its cases: a zero base, a negative base with an integer exponent).
    friend Interval pow(const Interval& a, const Interval& b) {
        const mpfi50 power = boost::multiprecision::pow(a.mpfi(), b.mpfi());
        Interval result(Storage{});
        mpfi_set(result.x_, power.backend().data());
        return result;
    }
    /// erf is increasing: [erf(lo) rounded down, erf(hi) rounded up] (MPFR's correctly rounded erf;
    /// MPFI has none). erfc = 1 − erf is decreasing.
    friend Interval erf(const Interval& a) { return remembered(Function::erf, a); }
    friend Interval erfc(const Interval& a) { return remembered(Function::erfc, a); }
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
    /// Boost's precision for 50 digits (mpfi50's and mpfr50's: 168 bits), and the limbs it takes.
    static constexpr mpfr_prec_t bits = 50 * 1000 / 301 + (50 * 1000 % 301 != 0 ? 2 : 1);
    static constexpr std::size_t limbs_per_endpoint = (bits + GMP_NUMB_BITS - 1) / GMP_NUMB_BITS;

    /// The endpoints' significands live in the object (MPFR's custom interface), not on the heap:
    /// an interval is made and copied with no allocation, which was a quarter of a certification's
    /// time (perf, 2026-12-07) when each was an MPFI value of its own (two mallocs, two frees). Zeroed, so that a copy
    /// never reads indeterminate limbs (a zero, infinite or NaN endpoint leaves its limbs unset).
    struct Storage {};
    explicit Interval(Storage) {
        mpfr_custom_init_set(&x_->left, MPFR_ZERO_KIND, 0, bits, limbs_[0].data());
        mpfr_custom_init_set(&x_->right, MPFR_ZERO_KIND, 0, bits, limbs_[1].data());
    }
    void own_limbs() {
        mpfr_custom_move(&x_->left, limbs_[0].data());
        mpfr_custom_move(&x_->right, limbs_[1].data());
    }
    static Interval apply(int (*f)(mpfi_ptr, mpfi_srcptr, mpfi_srcptr), const Interval& a, const Interval& b) {
        Interval result(Storage{});
        f(result.x_, a.x_, b.x_);
        return result;
    }
    static Interval apply(int (*f)(mpfi_ptr, mpfi_srcptr), const Interval& a) {
        Interval result(Storage{});
        f(result.x_, a.x_);
        return result;
    }
    /// The transcendental functions, each computed from scratch by `compute` and remembered by
    /// `remembered`.
    enum class Function : unsigned char { none, exp, expm1, log, log1p, tanh, sinh, cosh, sin, cos, atan, erf, erfc };
    static Interval compute(Function f, const Interval& a) {
        switch (f) {
            case Function::exp:
                return apply(mpfi_exp, a);
            case Function::expm1:
                return apply(mpfi_expm1, a);
            case Function::log:
                return apply(mpfi_log, a);
            case Function::log1p:
                return apply(mpfi_log1p, a);
            case Function::tanh:
                return apply(mpfi_tanh, a);
            case Function::sinh:
                return apply(mpfi_sinh, a);
            case Function::cosh:
                return apply(mpfi_cosh, a);
            case Function::sin:
                return apply(mpfi_sin, a);
            case Function::cos:
                return apply(mpfi_cos, a);
            case Function::atan:
                return apply(mpfi_atan, a);
            case Function::erf:
                return monotone(a, mpfr_erf, true);
            case Function::erfc:
                return monotone(a, mpfr_erfc, false);
            case Function::none:
                break;
        }
        return quiet_nan();
    }
    /// f(a), from this thread's memory of the last results when a was seen before. A certification
    /// runs the same forward values once per leaf element (check/certify.hpp): only the tangents
    /// change, so a softmax's exponentials repeat exactly, and a 50-digit exp costs as much as
    /// dozens of products. A slot is reused only for an argument identical in every bit (sign of
    /// zero included; never a NaN), so the result is the one computing it again would give.
    static Interval remembered(Function f, const Interval& a) {
        struct Slot {
            Function f = Function::none;
            Interval argument, result;
        };
        constexpr std::size_t slots = 256;
        thread_local std::array<Slot, slots> memory;
        Slot& slot = memory[(a.fingerprint() * 31 + static_cast<std::size_t>(f)) % slots];
        if (slot.f == f && identical(slot.argument.lo(), a.lo()) && identical(slot.argument.hi(), a.hi()))
            return slot.result;
        Interval result = compute(f, a);
        slot.f = f;
        slot.argument = a;
        slot.result = result;
        return result;
    }
    static bool identical(mpfr_srcptr a, mpfr_srcptr b) {
        return !mpfr_nan_p(a) && !mpfr_nan_p(b) && mpfr_signbit(a) == mpfr_signbit(b) && mpfr_equal_p(a, b);
    }
    /// A hash of the endpoints (their top limbs and exponents; 0 for a zero, infinite or NaN one).
    std::size_t fingerprint() const {
        std::size_t h = 0;
        for (const mpfr_srcptr e : {lo(), hi()}) {
            if (!mpfr_regular_p(e)) continue;
            const auto* limbs = static_cast<const mp_limb_t*>(mpfr_custom_get_significand(e));
            h = h * 1000003 + static_cast<std::size_t>(limbs[limbs_per_endpoint - 1] >> 11) +
                static_cast<std::size_t>(limbs[0] >> 3) + static_cast<std::size_t>(mpfr_get_exp(e)) * 7919;
        }
        return h;
    }
    static Interval quiet_nan() {
        Interval result(Storage{});
        mpfr_set_nan(&result.x_->left);
        mpfr_set_nan(&result.x_->right);
        return result;
    }
    /// As Boost's number, for the one function taken from Boost (pow).
    mpfi50 mpfi() const {
        mpfi50 x;
        mpfi_set(x.backend().data(), x_);
        return x;
    }
    static mpfr50 endpoint(mpfr_srcptr e) {
        mpfr50 x;
        mpfr_set(x.backend().data(), e, MPFR_RNDN);  // exact: the same precision
        return x;
    }
    /// The endpoints in place, for tests that need no copy of them (lower and upper return values).
    mpfr_srcptr lo() const { return &x_->left; }
    mpfr_srcptr hi() const { return &x_->right; }
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
        Interval result(Storage{});
        f(&result.x_->left, increasing ? a.lo() : a.hi(), MPFR_RNDD);
        f(&result.x_->right, increasing ? a.hi() : a.lo(), MPFR_RNDU);
        return result;
    }

    mpfi_t x_;
    std::array<std::array<mp_limb_t, limbs_per_endpoint>, 2> limbs_{};
};

/// The tape names the node computing (autodiff/tape.hpp), for tapes of Interval and its duals.
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
template <>
struct NodeContext<Dual<Dual<Interval>>> : NodeContext<Interval> {};

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
