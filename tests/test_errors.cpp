// Bad input and misuse raise a tapegrad::error subclass whose message names the op (or function)
// and the shapes or values at fault; never a crash, an out-of-bounds read or a silent NaN.
// One table row per misuse: what is done, the exception type, and words the message must hold.
#define BOOST_TEST_MODULE errors
#include "support.hpp"

#include <functional>
#include <limits>
#include <typeinfo>

using namespace tapegrad;

namespace {

using testing::ErrorKind;
using Misuse = testing::Misuse<std::function<void()>>;

const double nan = std::numeric_limits<double>::quiet_NaN();
const double inf = std::numeric_limits<double>::infinity();

Tensor<double> filled(const Shape& shape, double value = 0.5) { return Tensor<double>(shape, value); }

// Runs `act` on a fresh tape with leaves a [2x3], b [3x4], c [2x3].
std::function<void()> on_tape(std::function<void(Tape<double>&, Var<double>, Var<double>, Var<double>)> act) {
    return [act] {
        Tape<double> tape;
        act(tape, tape.leaf(filled({2, 3}), "a"), tape.leaf(filled({3, 4}), "b"), tape.leaf(filled({2, 3}), "c"));
    };
}

const std::vector<Misuse> misuses = {
    // Shapes and ranks, every op.
    {"matmul inner", ErrorKind::shape, on_tape([](auto&, auto a, auto, auto c) { matmul(a, c); }), {"matmul", "inner dimensions", "[2x3]"}},
    {"matmul batch", ErrorKind::shape, on_tape([](auto& t, auto, auto, auto) { matmul(t.leaf(filled({2, 2, 3})), t.leaf(filled({3, 3, 2}))); }), {"matmul", "batch dimensions", "[2x2x3]", "[3x3x2]"}},
    {"matmul rank 1", ErrorKind::shape, on_tape([](auto& t, auto a, auto, auto) { matmul(a, t.leaf(filled({3}))); }), {"matmul", "B must be a matrix", "[3]"}},
    {"matmul empty", ErrorKind::shape, on_tape([](auto& t, auto a, auto, auto) { matmul(a, t.leaf(filled({3, 0}))); }), {"matmul", "empty", "[3x0]"}},
    {"add shapes", ErrorKind::shape, on_tape([](auto&, auto a, auto b, auto) { add(a, b); }), {"add", "shapes differ", "[2x3]", "[3x4]"}},
    {"mul shapes", ErrorKind::shape, on_tape([](auto&, auto a, auto b, auto) { mul(a, b); }), {"mul", "shapes differ", "[2x3]", "[3x4]"}},
    {"add empty", ErrorKind::shape, on_tape([](auto& t, auto, auto, auto) { add(t.leaf(filled({0, 2})), t.leaf(filled({0, 2}))); }), {"add", "empty", "[0x2]"}},
    {"transpose rank 1", ErrorKind::shape, on_tape([](auto& t, auto, auto, auto) { transpose(t.leaf(filled({4}))); }), {"transpose", "matrix", "[4]"}},
    {"softmax scalar", ErrorKind::shape, on_tape([](auto& t, auto, auto, auto) { softmax(t.leaf(Tensor<double>::scalar(1.0))); }), {"softmax", "scalar"}},
    {"softmax empty", ErrorKind::shape, on_tape([](auto& t, auto, auto, auto) { softmax(t.leaf(filled({2, 0}))); }), {"softmax", "empty", "[2x0]"}},
    {"sum empty", ErrorKind::shape, on_tape([](auto& t, auto, auto, auto) { sum(t.leaf(filled({0}))); }), {"sum", "empty", "[0]"}},
    {"scale empty", ErrorKind::shape, on_tape([](auto& t, auto, auto, auto) { scale(t.leaf(filled({0, 1})), 2.0); }), {"scale", "empty"}},
    {"mask shape", ErrorKind::shape, on_tape([](auto& t, auto a, auto, auto) { mask(a, t.constant(filled({3, 2}, 1.0))); }), {"mask", "[3x2]", "[2x3]"}},
    {"attention widths", ErrorKind::shape, on_tape([](auto& t, auto a, auto, auto) { attention(a, t.leaf(filled({3, 2})), t.leaf(filled({3, 4})), t.leaf(filled({3, 2}))); }), {"attention", "W_Q", "W_K", "[3x4]"}},
    {"attention rows", ErrorKind::shape, on_tape([](auto& t, auto a, auto, auto) { attention(a, t.leaf(filled({4, 2})), t.leaf(filled({3, 2})), t.leaf(filled({3, 2}))); }), {"attention", "W_Q", "[4x2]", "[2x3]"}},
    // Values.
    {"NaN leaf", ErrorKind::value, on_tape([](auto& t, auto, auto, auto) { t.leaf(Tensor<double>::matrix({{1, nan}})); }), {"leaf", "NaN", "an unnamed leaf", "(0, 1)", "[1x2]"}},
    {"+inf score", ErrorKind::value, on_tape([](auto& t, auto, auto, auto) { softmax(t.leaf(Tensor<double>::matrix({{1, inf}}))); }), {"softmax", "inf", "(0, 1)"}},
    {"+inf score, long row", ErrorKind::value, on_tape([](auto& t, auto, auto, auto) { Tensor<double> S(Shape{1, 40}, 0.5); S[30] = inf; softmax(t.leaf(S)); }), {"softmax", "inf", "(0, 30)"}},
    {"scale by inf", ErrorKind::value, on_tape([](auto&, auto a, auto, auto) { scale(a, inf); }), {"scale", "inf", "not finite"}},
    {"mask value", ErrorKind::value, on_tape([](auto& t, auto a, auto, auto) { mask(a, t.constant(filled({2, 3}, 0.5))); }), {"mask", "0.5", "(0, 0)"}},
    {"inf - inf is NaN", ErrorKind::value, on_tape([](auto& t, auto, auto, auto) { add(t.leaf(Tensor<double>::matrix({{inf}})), t.leaf(Tensor<double>::matrix({{-inf}}))); }), {"add", "NaN", "output"}},
    {"NaN upstream gradient", ErrorKind::value, on_tape([](auto& t, auto a, auto, auto) { t.backward(a, Tensor<double>(Shape{2, 3}, nan)); }), {"backward", "NaN", "upstream"}},
    // The tape: foreign or stale values, backward misuse, gradients that do not exist.
    {"value from another tape", ErrorKind::usage, on_tape([](auto&, auto a, auto, auto) { Tape<double> other; add(a, other.leaf(filled({2, 3}))); }), {"add", "another tape"}},
    {"value from a cleared tape", ErrorKind::usage, on_tape([](auto& t, auto a, auto, auto c) { t.clear(); add(a, c); }), {"cleared"}},
    {"stale value read", ErrorKind::usage, on_tape([](auto& t, auto a, auto, auto) { t.clear(); (void)a.value(); }), {"value", "cleared"}},
    {"default Var", ErrorKind::usage, [] { (void)Var<double>{}.value(); }, {"Var::value", "does not belong"}},
    {"attention kernel word", ErrorKind::usage, [] { (void)attention_kernel_from("flash"); }, {"attention kernel", "'composed' or 'fused'", "'flash'"}},
    {"backward non-scalar", ErrorKind::usage, on_tape([](auto& t, auto a, auto, auto) { t.backward(a); }), {"backward", "[2x3]", "not a scalar", "upstream gradient"}},
    {"backward wrong G", ErrorKind::shape, on_tape([](auto& t, auto a, auto, auto) { t.backward(a, filled({3, 2})); }), {"backward", "[3x2]", "[2x3]"}},
    {"backward twice", ErrorKind::usage, on_tape([](auto& t, auto a, auto, auto) { const auto J = sum(a); t.backward(J); t.backward(J); }), {"backward", "zero_grad"}},
    {"grad before backward", ErrorKind::usage, on_tape([](auto&, auto a, auto, auto) { (void)a.grad(); }), {"grad", "backward"}},
    {"grad of a constant", ErrorKind::usage, on_tape([](auto& t, auto, auto, auto) { (void)t.constant(filled({1, 1}), "M").grad(); }), {"grad", "'M'", "does not require"}},
    {"info out of range", ErrorKind::usage, on_tape([](auto& t, auto, auto, auto) { (void)t.info(99); }), {"Tape::info", "99"}},
    // Tensors.
    {"rank 5", ErrorKind::shape, [] { (void)Shape{1, 1, 1, 1, 1}; }, {"Shape", "rank 5"}},
    {"absurd shape", ErrorKind::shape, [] { (void)Shape{std::size_t{1} << 30, std::size_t{1} << 30}; }, {"Shape", "exceed"}},
    {"data size", ErrorKind::shape, [] { (void)Tensor<double>(Shape{2, 2}, std::vector<double>(3)); }, {"Tensor", "[2x2]", "3"}},
    {"ragged matrix", ErrorKind::shape, [] { (void)Tensor<double>::matrix({{1, 2}, {3}}); }, {"Tensor::matrix", "length 1"}},
    {"at out of range", ErrorKind::shape, [] { (void)filled({2, 3}).at({1, 3}); }, {"Tensor::at", "3", "[2x3]"}},
    {"at wrong rank", ErrorKind::shape, [] { (void)filled({2, 3}).at({1}); }, {"Tensor::at", "rank 1"}},
    {"item of a matrix", ErrorKind::shape, [] { (void)filled({2, 3}).item(); }, {"Tensor::item", "[2x3]"}},
    {"reshape size", ErrorKind::shape, [] { (void)filled({2, 3}).reshaped(Shape{4}); }, {"Tensor::reshaped", "[2x3]", "[4]"}},
    // The checker: inputs it cannot check.
    {"checker non-finite leaf", ErrorKind::value, [] { (void)check_gradients([](auto in) { return sum(in[0]); }, {{"X", Tensor<double>::matrix({{1, -inf}})}}); }, {"gradcheck", "X", "-inf", "(0, 1)"}},
    {"checker empty leaf", ErrorKind::shape, [] { (void)check_gradients([](auto in) { return sum(in[0]); }, {{"X", filled({0, 2})}}); }, {"gradcheck", "X", "empty"}},
    {"checker non-scalar J", ErrorKind::usage, [] { (void)check_gradients([](auto in) { return softmax(in[0]); }, {{"X", filled({2, 2})}}); }, {"gradcheck", "scalar", "[2x2]"}},
};

}  // namespace

BOOST_AUTO_TEST_CASE(every_misuse_raises_a_named_error) {
    for (const Misuse& m : misuses) testing::expect_named_error(m, m.act);
}

BOOST_AUTO_TEST_CASE(the_tape_recovers_after_errors) {
    // A refused op records nothing, and the tape stays usable; zero_grad allows backward again.
    Tape<double> tape;
    const Var<double> a = tape.leaf(filled({2, 3}), "a");
    const std::size_t before = tape.size();
    BOOST_CHECK_THROW(matmul(a, a), shape_error);
    BOOST_TEST(tape.size() == before);
    const Var<double> J = sum(mul(a, a));
    tape.backward(J);
    BOOST_CHECK_THROW(tape.backward(J), usage_error);
    tape.zero_grad();
    tape.backward(J);
    BOOST_TEST(a.grad()(1, 2) == 1.0);  // d(Σ a²)/da = 2a = 1
}
