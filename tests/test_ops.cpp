// Every op through the one generic checker, on random shapes (non-square, T = 1, batched), and by
// an explicit seed on its own output (tests/support.hpp). Adding an op = adding one line to `op_table`.
#define BOOST_TEST_MODULE ops
#include "support.hpp"

#include <functional>

using namespace tapegrad;
using tapegrad::testing::check_op;
using tapegrad::testing::OpCase;
using tapegrad::testing::OpDims;
using tapegrad::testing::scalar_of;

namespace {

// A mask with a hidden position in every row that has more than one column, first column visible.
Tensor<double> visible_pattern(std::size_t m, std::size_t n) {
    Tensor<double> M(Shape{m, n}, 1.0);
    for (std::size_t i = 0; i < m; ++i)
        if (n > 1) M(i, (i + 1) % n == 0 ? 1 : (i + 1) % n) = 0.0;
    return M;
}

const std::vector<OpCase> op_table = {
    {"matmul", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return matmul(in[0], in[1]); }, rng, Shape{d.m, d.k}, Shape{d.k, d.n}); }},
    {"matmul batched", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return matmul(in[0], in[1]); }, rng, Shape{d.batch, d.m, d.k}, Shape{d.batch, d.k, d.n}); }},
    {"matmul shared B", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return matmul(in[0], in[1]); }, rng, Shape{d.batch, d.m, d.k}, Shape{d.k, d.n}); }},
    {"transpose", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return transpose(in[0]); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"scale", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return scale(in[0], scalar_of<decltype(in[0])>(-0.37)); }, rng, Shape{d.m, d.n}); }},
    {"softmax", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return softmax(in[0]); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"add", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return add(in[0], in[1]); }, rng, Shape{d.m, d.n}, Shape{d.m, d.n}); }},
    {"mul", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return mul(in[0], in[1]); }, rng, Shape{d.m, d.n}, Shape{d.m, d.n}); }},
    {"mask then softmax", [](const OpDims& d, auto& rng) { return check_op([&d](auto in) { return softmax(mask(in[0], in[0].tape().constant(tensor_cast<scalar_of<decltype(in[0])>>(visible_pattern(d.m, d.n))))); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"sum", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return sum(in[0]); }, rng, Shape{d.m, d.n}); }},
    {"mask", [](const OpDims& d, auto& rng) { return testing::check_op_seeded_only([&d](auto in) { return mask(in[0], in[0].tape().constant(tensor_cast<scalar_of<decltype(in[0])>>(visible_pattern(d.m, d.n)))); }, rng, Shape{d.batch, d.m, d.n}); }},
};

// Mask whose VJP lets the gradient through at hidden positions too (dS = G): wrong only where the
// output is the constant −inf, so softmax after it hides the leak (its dS there is A·(…) = 0).
struct LeakyMask : Mask {
    static constexpr std::string_view name = "mask leaking gradient to hidden positions";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dS) {
        std::copy(at.G.data().begin(), at.G.data().end(), dS.data().begin());
    }
};
// Driven through its recorded tape, as every op of the tables: its siblings registered.
const bool leaky_mask_registered = register_siblings<LeakyMask>();

template <class V>
V leaky_mask(const V& S) {
    using T = scalar_of<V>;
    const Tensor<double> pattern = visible_pattern(S.shape().rows(), S.shape().cols());
    return S.tape().template record<LeakyMask>({S, S.tape().constant(tensor_cast<T>(pattern))});
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_op_passes_the_50_digit_checker) {
    testing::check_op_table(op_table, 42, 6);
}

// The seeded check is what catches a VJP that leaks where the output is constant: the probe
// through softmax cannot see the leaky mask, the seed on the mask's own output can.
BOOST_AUTO_TEST_CASE(an_explicit_seed_catches_a_vjp_leaking_where_the_output_is_constant) {
    std::mt19937_64 rng(7);
    const Shape shape{2, 3, 4};
    const CheckReport through_softmax = testing::check_op_seeded_only([](auto in) { return softmax(leaky_mask(in[0])); }, rng, shape);
    BOOST_TEST(through_softmax.passed);  // hidden downstream: why the op tables seed each op's own output
    const CheckReport seeded = testing::check_op_seeded_only([](auto in) { return leaky_mask(in[0]); }, rng, shape);
    BOOST_TEST(!seeded.passed);
    BOOST_TEST(seeded.failures == 6u);  // one hidden position per row of each of the 2 matrices × 3 rows
}
