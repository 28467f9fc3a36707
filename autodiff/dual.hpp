/// \file
/// Dual<T>: a number with a tangent, x = v + t·ε with ε² = 0, the scalar of forward-mode
/// differentiation. A graph recorded on a Tape<Dual<T>> carries, next to every value, its
/// derivative along the direction the leaves' tangents give (a JVP); a reverse sweep on such a tape
/// differentiates the gradient along that direction too (a Hessian-vector product, forward over
/// reverse). autodiff/forward_mode.hpp is the API; autodiff/dual_kernels.hpp makes products of dual
/// matrices real products.
///
/// Why our own type and not Boost.Math's autodiff_fvar<T, 1>: the tensor kernels split a dual
/// matrix into a value plane and a tangent plane so products run as real GEMMs (value·value,
/// tangent·value + value·tangent); the Scalar concept, numeric_limits and the helpers of
/// autodiff/scalar.hpp need a type that is exactly (value, tangent) and trivially copyable for
/// double; fvar carries general-order Taylor machinery (array of coefficients, order promotion) that
/// a first-order tangent never uses, and it turns a hidden score (−inf with zero tangent) times a
/// number into a NaN tangent. Here a zero tangent is a strong zero: it contributes exactly nothing,
/// also next to ±inf, so masks and online softmax give what the real code gives.
///
/// Comparisons compare values (a branch taken by the value is the branch the derivative follows).
/// Math functions are hidden friends, found by ADL from the ops' `using std::exp; exp(x)`.
#pragma once

#include <cmath>
#include <limits>
#include <numbers>
#include <type_traits>
#include <utility>

namespace tapegrad {

/// Whether x is exactly zero: Dual's strong zero below. An interval gives its own (exactly the
/// point 0, never an ambiguous comparison: autodiff/interval.hpp), found by argument-dependent lookup.
template <class T>
bool exactly_zero(const T& x) {
    return x == T(0);
}

/// Whether `candidate` replaces `current` as the maximum a row subtracts before exp (softmax,
/// log_softmax, logsumexp, fused attention): a shift that changes the rounding, never the function,
/// so which of two equal values wins is no branch of it. An interval picks by midpoints without
/// logging the tie as one (autodiff/interval.hpp); a dual by its values.
template <class T>
bool shift_prefers(const T& candidate, const T& current) {
    return candidate > current;
}

/// max(a, b) for such a shift.
template <class T>
T shift_max(const T& a, const T& b) {
    return shift_prefers(b, a) ? b : a;
}

template <class T>
class Dual {
public:
    using value_type = T;

    constexpr Dual() = default;
    /// From the underlying scalar or any built-in number: a constant (tangent zero).
    constexpr Dual(T value) : v_(std::move(value)), t_(0) {}  // NOLINT: implicit, as a constant
    template <class U>
        requires(std::is_arithmetic_v<U> && !std::is_same_v<U, T>)
    constexpr Dual(U value) : v_(value), t_(0) {}  // NOLINT: implicit, so `1 - y` and `T(0)` read as for double
    /// (By value, moved in: the parts an operation below computes are taken over, not copied, which
    /// for a scalar that allocates, as the 50-digit intervals of check/certify.hpp, is most of its cost.)
    constexpr Dual(T value, T tangent) : v_(std::move(value)), t_(std::move(tangent)) {}

    const T& value() const { return v_; }
    const T& tangent() const { return t_; }
    T& value() { return v_; }
    T& tangent() { return t_; }

    /// a + b: tangents add. a·b: t = t_a·v_b + v_a·t_b, each term only when its tangent is nonzero
    /// (strong zero: −inf·0 would give NaN where the real code's answer is a plain −inf).
    friend Dual operator+(const Dual& a, const Dual& b) { return {a.v_ + b.v_, a.t_ + b.t_}; }
    friend Dual operator-(const Dual& a, const Dual& b) { return {a.v_ - b.v_, a.t_ - b.t_}; }
    friend Dual operator-(const Dual& a) { return {-a.v_, -a.t_}; }
    friend Dual operator+(const Dual& a) { return a; }
    friend Dual operator*(const Dual& a, const Dual& b) {
        return {a.v_ * b.v_, scaled_sum(a.t_, b.v_, b.t_, a.v_)};
    }
    /// a / b = a · (1/b): t = (t_a − (a/b)·t_b) / b.
    friend Dual operator/(const Dual& a, const Dual& b) {
        const T q = a.v_ / b.v_;
        return {q, T(a.t_ - scaled(b.t_, q)) / b.v_};
    }
    Dual& operator+=(const Dual& b) {
        v_ += b.v_;
        t_ += b.t_;
        return *this;
    }
    Dual& operator-=(const Dual& b) {
        v_ -= b.v_;
        t_ -= b.t_;
        return *this;
    }
    Dual& operator*=(const Dual& b) { return *this = *this * b; }
    Dual& operator/=(const Dual& b) { return *this = *this / b; }

    friend bool operator==(const Dual& a, const Dual& b) { return a.v_ == b.v_; }
    /// A dual is exactly zero when both its parts are: the strong zero of a Dual over a Dual
    /// (second order) must not drop a tangent whose value is 0 and whose own tangent is not.
    friend bool exactly_zero(const Dual& a) { return exactly_zero(a.v_) && exactly_zero(a.t_); }
    friend bool shift_prefers(const Dual& candidate, const Dual& current) {
        return shift_prefers(candidate.v_, current.v_);
    }
    friend bool operator!=(const Dual& a, const Dual& b) { return a.v_ != b.v_; }
    friend bool operator<(const Dual& a, const Dual& b) { return a.v_ < b.v_; }
    friend bool operator>(const Dual& a, const Dual& b) { return a.v_ > b.v_; }
    friend bool operator<=(const Dual& a, const Dual& b) { return a.v_ <= b.v_; }
    friend bool operator>=(const Dual& a, const Dual& b) { return a.v_ >= b.v_; }

    /// f(v + tε) = f(v) + f'(v)·t·ε. Each derivative is written from the value already computed
    /// where that is exact (exp, tanh, sqrt), as the ops' VJPs do.
    friend Dual exp(const Dual& x) {
        using std::exp;
        const T y = exp(x.v_);
        return {y, scaled(x.t_, y)};
    }
    friend Dual expm1(const Dual& x) {
        using std::exp;
        using std::expm1;
        return {T(expm1(x.v_)), scaled(x.t_, T(exp(x.v_)))};
    }
    friend Dual log(const Dual& x) {
        using std::log;
        return {T(log(x.v_)), T(x.t_ / x.v_)};
    }
    friend Dual log1p(const Dual& x) {
        using std::log1p;
        return {T(log1p(x.v_)), T(x.t_ / T(1 + x.v_))};
    }
    friend Dual sqrt(const Dual& x) {
        using std::sqrt;
        const T y = sqrt(x.v_);
        return {y, T(x.t_ / T(2 * y))};
    }
    friend Dual tanh(const Dual& x) {
        using std::tanh;
        const T y = tanh(x.v_);
        return {y, scaled(x.t_, T(1 - y * y))};
    }
    friend Dual sin(const Dual& x) {
        using std::cos;
        using std::sin;
        return {T(sin(x.v_)), scaled(x.t_, T(cos(x.v_)))};
    }
    friend Dual cos(const Dual& x) {
        using std::cos;
        using std::sin;
        return {T(cos(x.v_)), scaled(x.t_, T(-sin(x.v_)))};
    }
    friend Dual cosh(const Dual& x) {
        using std::cosh;
        using std::sinh;
        return {T(cosh(x.v_)), scaled(x.t_, T(sinh(x.v_)))};
    }
    friend Dual sinh(const Dual& x) {
        using std::cosh;
        using std::sinh;
        return {T(sinh(x.v_)), scaled(x.t_, T(cosh(x.v_)))};
    }
    /// atan'(v) = 1/(1 + v²) (gelu's π is 4·atan(1) in the scalar's own precision).
    friend Dual atan(const Dual& x) {
        using std::atan;
        return {T(atan(x.v_)), T(x.t_ / T(1 + x.v_ * x.v_))};
    }
    /// erf'(v) = 2/√π · exp(−v²).
    friend Dual erf(const Dual& x) {
        using std::erf;
        using std::exp;
        const T slope = T(2) / sqrt_pi() * T(exp(T(-x.v_ * x.v_)));
        return {T(erf(x.v_)), scaled(x.t_, slope)};
    }
    friend Dual erfc(const Dual& x) { return Dual(T(1)) - erf(x); }
    /// |x| with the ops' convention at 0 (ops/abs.hpp): sign(0) = 0, so the tangent is 0 there.
    friend Dual abs(const Dual& x) {
        if (x.v_ > T(0)) return x;
        if (x.v_ < T(0)) return -x;
        return {T(0), T(0)};
    }
    friend Dual fabs(const Dual& x) { return abs(x); }
    /// Piecewise constant: derivative 0.
    friend Dual floor(const Dual& x) {
        using std::floor;
        return Dual(T(floor(x.v_)));
    }
    friend Dual ceil(const Dual& x) {
        using std::ceil;
        return Dual(T(ceil(x.v_)));
    }
    /// a^b = exp(b·log a): t = b·a^(b−1)·t_a + a^b·log(a)·t_b; the second term only when b moves
    /// (a constant exponent on a non-positive base stays defined, as in the real code).
    friend Dual pow(const Dual& a, const Dual& b) {
        using std::log;
        using std::pow;
        const T y = pow(a.v_, b.v_);
        T t = scaled(a.t_, T(b.v_ * T(pow(a.v_, T(b.v_ - 1)))));
        if (!exactly_zero(b.t_)) t += b.t_ * y * T(log(a.v_));
        return {y, t};
    }
    friend Dual max(const Dual& a, const Dual& b) { return a < b ? b : a; }
    friend Dual min(const Dual& a, const Dual& b) { return b < a ? b : a; }

    /// NaN anywhere is NaN: the tape's NaN guard then names the op whose tangent went wrong.
    friend bool isnan(const Dual& x) {
        using std::isnan;
        return isnan(x.v_) || isnan(x.t_);
    }
    friend bool isfinite(const Dual& x) {
        using std::isfinite;
        return isfinite(x.v_) && isfinite(x.t_);
    }
    friend bool isinf(const Dual& x) {
        using std::isinf;
        return isinf(x.v_);
    }

private:
    /// tangent·factor, exactly zero when the tangent is zero (whatever the factor: ±inf included).
    static T scaled(const T& tangent, const T& factor) { return exactly_zero(tangent) ? T(0) : T(tangent * factor); }
    /// t1·f1 + t2·f2, each term as scaled. For a scalar that is not built in (50 digits, intervals),
    /// a zero term is not added: x + 0 is x exactly there, and the addition is an allocation saved.
    static T scaled_sum(const T& t1, const T& f1, const T& t2, const T& f2) {
        if constexpr (!std::is_arithmetic_v<T>) {
            if (exactly_zero(t1)) return scaled(t2, f2);
            if (exactly_zero(t2)) return T(t1 * f1);
        }
        return scaled(t1, f1) + scaled(t2, f2);
    }
    /// √π in T's precision (π as 4·atan(1): correctly rounded for double, 50 digits for mp50).
    static T sqrt_pi() {
        using std::atan;
        using std::sqrt;
        static const T root = T(sqrt(T(T(4) * T(atan(T(1))))));
        return root;
    }

    T v_{};
    T t_{};
};

template <class T>
struct is_dual : std::false_type {};
template <class T>
struct is_dual<Dual<T>> : std::true_type {};
template <class T>
inline constexpr bool is_dual_v = is_dual<T>::value;

}  // namespace tapegrad

/// \cond EXTERNAL_SPECIALIZATIONS (Doxygen cannot place a specialization of a std class)
// Limits are the value type's, as constants (tangent zero): −infinity() is a hidden score.
template <class T>
class std::numeric_limits<tapegrad::Dual<T>> {
    using D = tapegrad::Dual<T>;
    using L = std::numeric_limits<T>;

public:
    static constexpr bool is_specialized = true;
    static constexpr bool is_signed = L::is_signed;
    static constexpr bool is_integer = false;
    static constexpr bool is_exact = false;
    static constexpr bool has_infinity = L::has_infinity;
    static constexpr bool has_quiet_NaN = L::has_quiet_NaN;
    static constexpr bool has_signaling_NaN = L::has_signaling_NaN;
    static constexpr int digits = L::digits;
    static constexpr int digits10 = L::digits10;
    static constexpr int max_digits10 = L::max_digits10;
    static constexpr int radix = L::radix;
    static constexpr int min_exponent = L::min_exponent;
    static constexpr int max_exponent = L::max_exponent;
    static D min() { return D(L::min()); }
    static D max() { return D(L::max()); }
    static D lowest() { return D(L::lowest()); }
    static D epsilon() { return D(L::epsilon()); }
    static D round_error() { return D(L::round_error()); }
    static D infinity() { return D(L::infinity()); }
    static D quiet_NaN() { return D(L::quiet_NaN()); }
    static D signaling_NaN() { return D(L::signaling_NaN()); }
    static D denorm_min() { return D(L::denorm_min()); }
};
/// \endcond
