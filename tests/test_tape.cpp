// The tape's semantics: one reverse sweep, gradients that add over branches, explicit seeds,
// skipped VJPs for constants, zero gradients for unused leaves, clear-and-reuse, and the errors
// that keep stale or foreign values from being read.
#define BOOST_TEST_MODULE tape
#include "support.hpp"

using namespace tapegrad;

BOOST_AUTO_TEST_CASE(a_value_used_twice_receives_the_sum_of_both_branches) {
    // J = Σ (X ∘ X) uses X in both slots of one mul: dJ/dX = 2X.
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>::matrix({{1, -2}, {3, 0.5}}), "X");
    tape.backward(sum(mul(X, X)));
    BOOST_TEST(X.grad() == Tensor<double>::matrix({{2, -4}, {6, 1}}));
}

// has_gradients follows backward, zero_grad and clear.
BOOST_AUTO_TEST_CASE(has_gradients_says_whether_backward_ran) {
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>::matrix({{1, 2}}), "X");
    const Var<double> J = sum(mul(X, X));
    BOOST_TEST(!tape.has_gradients());
    tape.backward(J);
    BOOST_TEST(tape.has_gradients());
    tape.zero_grad();
    BOOST_TEST(!tape.has_gradients());
    tape.backward(J);
    tape.clear();
    BOOST_TEST(!tape.has_gradients());
}

BOOST_AUTO_TEST_CASE(tied_query_and_key_weights_sum_both_paths) {
    // One parameter W used as W_Q and W_K: its gradient is the sum of the Q and K paths,
    // and the checker confirms it against differences of the tied function.
    std::mt19937_64 rng(8);
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [X, W, W_V] = in;
            return testing::probe(attention(X, W, W, W_V).O);
        },
        {{"X", testing::random_tensor({3, 4}, rng)}, {"W", testing::random_tensor({4, 2}, rng)},
         {"W_V", testing::random_tensor({4, 3}, rng)}});
    BOOST_TEST(report.passed, report.summary());
    // W has two consumers (the Q and K projections), each checked as its own branch.
    std::size_t w_branches = 0;
    for (const BranchReport& b : report.branches) w_branches += b.leaf == "W";
    BOOST_TEST(w_branches == 2u);
}

BOOST_AUTO_TEST_CASE(explicit_upstream_gradient_seeds_a_tensor_output) {
    // backward(O, G) gives the same gradients as backward(Σ O ∘ G).
    std::mt19937_64 rng(9);
    const Tensor<double> x = testing::random_tensor({3, 4}, rng), w = testing::random_tensor({4, 2}, rng);
    const Tensor<double> G = testing::random_tensor({3, 2}, rng);
    Tape<double> seeded, probed;
    const Var<double> X1 = seeded.leaf(x), W1 = seeded.leaf(w);
    seeded.backward(matmul(X1, W1), G);
    const Var<double> X2 = probed.leaf(x), W2 = probed.leaf(w);
    probed.backward(sum(mul(matmul(X2, W2), probed.constant(G))));
    BOOST_TEST(X1.grad() == X2.grad());
    BOOST_TEST(W1.grad() == W2.grad());
}

BOOST_AUTO_TEST_CASE(constants_get_no_gradient_and_unused_leaves_get_zero) {
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>::matrix({{1, 2}}), "X");
    const Var<double> unused = tape.leaf(Tensor<double>::matrix({{5}}), "unused");
    const Var<double> C = tape.constant(Tensor<double>::matrix({{3, 4}}), "C");
    tape.backward(sum(mul(X, C)));
    BOOST_TEST(X.grad() == Tensor<double>::matrix({{3, 4}}));
    BOOST_TEST(unused.grad() == Tensor<double>::matrix({{0}}));
    BOOST_CHECK_THROW(C.grad(), usage_error);
}

namespace {

// Scale with a VJP that counts its calls.
struct CountingScale : Scale {
    static inline int vjp_calls = 0;
    template <Scalar T>
    static void vjp(const Settings<T>& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& grad) {
        ++vjp_calls;
        Scale::vjp(s, at, which, grad);
    }
};

}  // namespace

BOOST_AUTO_TEST_CASE(vjps_nobody_needs_are_skipped) {
    // An op whose VJP counts its calls: with only constant inputs it is never asked.
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>::matrix({{1, 2}}));
    const Var<double> C = tape.constant(Tensor<double>::matrix({{3, 4}}));
    const Var<double> constant_branch = tape.record<CountingScale>({C}, {2.0});
    tape.backward(sum(mul(X, constant_branch)));
    BOOST_TEST(CountingScale::vjp_calls == 0);
    tape.zero_grad();
    const Var<double> live_branch = tape.record<CountingScale>({X}, {2.0});
    tape.backward(sum(live_branch));
    BOOST_TEST(CountingScale::vjp_calls == 1);
}

BOOST_AUTO_TEST_CASE(clear_reuses_the_tape_and_invalidates_old_values) {
    Tape<double> tape;
    for (int round = 0; round < 3; ++round) {
        const Var<double> X = tape.leaf(Tensor<double>::matrix({{1.0 * round, 2}}));
        tape.backward(sum(scale(X, 3.0)));
        BOOST_TEST(X.grad() == Tensor<double>::matrix({{3, 3}}));
        BOOST_TEST(tape.size() == 3u);
        tape.clear();
        BOOST_CHECK_THROW(X.value(), usage_error);
    }
}

BOOST_AUTO_TEST_CASE(backward_twice_needs_zero_grad_and_then_repeats_exactly) {
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>::matrix({{0.3, -1.2}, {2.0, 0.1}}));
    const Var<double> J = sum(mul(softmax(X), X));
    tape.backward(J);
    const Tensor<double> first = X.grad();
    BOOST_CHECK_THROW(tape.backward(J), usage_error);
    tape.zero_grad();
    tape.backward(J);
    BOOST_TEST(X.grad() == first);
}

BOOST_AUTO_TEST_CASE(values_from_another_tape_are_refused) {
    Tape<double> one, other;
    const Var<double> X = one.leaf(Tensor<double>::matrix({{1}}));
    const Var<double> Y = other.leaf(Tensor<double>::matrix({{1}}));
    BOOST_CHECK_THROW(add(X, Y), usage_error);
    BOOST_CHECK_THROW(other.backward(sum(X)), usage_error);
}

BOOST_AUTO_TEST_CASE(nan_never_leaks_unannounced) {
    Tape<double> tape;
    Tensor<double> bad = Tensor<double>::matrix({{1, 2}});
    bad[1] = std::numeric_limits<double>::quiet_NaN();
    BOOST_CHECK_THROW(tape.leaf(bad, "X"), value_error);
    const Var<double> S = tape.leaf(Tensor<double>::matrix({{std::numeric_limits<double>::infinity(), 0}}), "S");
    BOOST_CHECK_EXCEPTION(softmax(S), value_error, [](const value_error& e) {
        return std::string(e.what()).find("softmax") != std::string::npos;
    });
}

namespace {

// An op with both hooks, and one derived from it that overrides only vjp (as a test's faulty
// variant does).
struct WithHooks {
    static constexpr std::string_view name = "with hooks";
    using Settings = NoSettings;
    using hooks_of = WithHooks;
    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        out = *in[0];
    }
    template <Scalar T>
    static void vjp_all(const Settings&, const VjpArgs<T>& at, std::span<Tensor<T>* const> grads) {
        if (grads[0] != nullptr) *grads[0] = at.G;
    }
    template <Scalar T>
    static bool update(const Settings&, Inputs<T>, Inputs<T>, const Tensor<T>&, Tensor<T>&) {
        return false;
    }
};

struct DerivedOverridingVjp : WithHooks {
    static constexpr std::string_view name = "derived";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& din) {
        din = at.G;
        for (T& x : din.data()) x *= 2;
    }
};

}  // namespace

// Optional hooks count only where the op declares them itself: the derived op gets neither its
// base's all-inputs backward nor its replay update, so its own vjp is the one the tape calls.
BOOST_AUTO_TEST_CASE(hooks_are_declared_by_the_op_itself_not_inherited) {
    static_assert(HasAllInputsVjp<WithHooks, double> && HasUpdate<WithHooks, double>);
    static_assert(!HasAllInputsVjp<DerivedOverridingVjp, double> && !HasUpdate<DerivedOverridingVjp, double>);
    static_assert(HasPerInputVjp<DerivedOverridingVjp, double> && TapeOp<DerivedOverridingVjp, double>);
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>::matrix({{1, 2}}));
    tape.backward(sum(tape.record<DerivedOverridingVjp>({X})));
    BOOST_TEST(X.grad() == Tensor<double>::matrix({{2, 2}}));
    BOOST_TEST((op_kind_of<DerivedOverridingVjp, double>.update == nullptr));
    BOOST_TEST((op_kind_of<WithHooks, double>.update != nullptr));
}
