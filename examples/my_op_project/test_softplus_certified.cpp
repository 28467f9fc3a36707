// The op certified (check/certify.hpp; built where tapegrad::certify is, MPFI installed): intervals
// that provably hold each exact derivative and each VJP's exact value, for the graph given as a
// generic lambda and for a tape recorded by ordinary code; and a fault control off by a relative
// 1e-30 in one element, which the 50-digit check passes and certification proves wrong; and its
// Hessian-vector product certified (certify_hvp).
#define BOOST_TEST_MODULE softplus_certified
#include <tapegrad_testing.hpp>

#include <check/certify.hpp>

#include "my_ops/softplus.hpp"

#include <random>

using namespace tapegrad;

namespace {

// The op's registrations: its siblings and saved form (register_op), and its interval siblings,
// which certifying a recorded tape re-runs it through (register_certify_siblings).
const bool softplus_registered = register_op<my_ops::Softplus>() && register_certify_siblings<my_ops::Softplus>();

// A broken variant, kept in this test only: the VJP of the first element off by a relative 1e-30,
// 1e5 below what a 50-digit finite difference resolves.
struct SoftplusOffIn30thDigit : my_ops::Softplus {
    static constexpr std::string_view name = "softplus off by 1e-30 in its first element";
    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& dA) {
        my_ops::Softplus::vjp(s, at, which, dA);
        dA[0] = dA[0] * T(1 + T(1e-30));
    }
};
const bool broken_registered = register_siblings<SoftplusOffIn30thDigit>();

const auto layer = [](auto in) { return sum(my_ops::softplus(matmul(in[0], in[1]))); };
const auto broken_layer = [](auto in) {
    const auto Y = matmul(in[0], in[1]);
    return sum(Y.tape().template record<SoftplusOffIn30thDigit>({Y}));
};

// A certified element's bound, relative to max(1, |derivative|): 50 digits lose a few per op in
// intervals (the wrapping effect), so 1e-40 leaves ten orders to spare and stays ten below 1e-30.
bool proven_within_1e_40(const CertificationReport& report) {
    for (const CertifiedDerivative& d : report.derivatives)
        if (d.verdict != Certified::certified || d.bound > 1e-40 * std::max(1.0, std::abs(to_double(d.derivative))))
            return false;
    return true;
}

}  // namespace

BOOST_AUTO_TEST_CASE(softplus_is_certified_as_a_graph_and_on_a_recorded_tape) {
    BOOST_TEST(softplus_registered);
    std::mt19937_64 rng(5);
    const Tensor<double> X = testing::random_tensor(Shape{4, 3}, rng), W = testing::random_tensor(Shape{3, 2}, rng);
    const CertificationReport generic = certify_gradients(layer, {{"X", X}, {"W", W}});
    BOOST_TEST(generic.certified == X.size() + W.size(), generic.summary());
    BOOST_TEST(proven_within_1e_40(generic), generic.summary());

    Tape<double> tape;
    const Var<double> J = layer(std::array{tape.leaf(X, "X"), tape.leaf(W, "W")});
    const CertificationReport recorded = certify_gradients(tape, J);
    BOOST_TEST(recorded.certified == X.size() + W.size(), recorded.summary());
    BOOST_TEST(proven_within_1e_40(recorded), recorded.summary());
}

// The fault control: the 50-digit check passes it; certification proves that element wrong, and
// only that one.
BOOST_AUTO_TEST_CASE(a_vjp_off_by_1e_30_passes_the_check_and_is_proven_wrong) {
    BOOST_TEST(broken_registered);
    std::mt19937_64 rng(6);
    const Tensor<double> X = testing::random_tensor(Shape{4, 3}, rng), W = testing::random_tensor(Shape{3, 2}, rng);
    BOOST_TEST(check_gradients(broken_layer, {{"X", X}, {"W", W}}).passed);
    const CertificationReport report = certify_gradients(broken_layer, {{"X", X}, {"W", W}});
    BOOST_TEST(report.wrong > 0u, report.summary());
    BOOST_TEST(!report.passed());
    BOOST_TEST(report.certified + report.wrong == X.size() + W.size(), report.summary());
}

// Second order: the op's VJP, run on duals, differentiated along a direction v (H·v, forward over
// reverse) and proven against the second derivatives of its forward code (forward over forward).
BOOST_AUTO_TEST_CASE(softplus_s_hessian_vector_product_is_certified) {
    std::mt19937_64 rng(7);
    const Tensor<double> X = testing::random_tensor(Shape{4, 3}, rng), W = testing::random_tensor(Shape{3, 2}, rng);
    const Tensor<double> v_X = testing::random_tensor(Shape{4, 3}, rng), v_W = testing::random_tensor(Shape{3, 2}, rng);
    const CertificationReport report = certify_hvp(layer, {{"X", X}, {"W", W}}, {v_X, v_W});
    BOOST_TEST(report.certified == X.size() + W.size(), report.summary());
    BOOST_TEST(proven_within_1e_40(report), report.summary());
}
