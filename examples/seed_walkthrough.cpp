// The specification's reference program, in tapegrad: Example 1 forward and backward, the
// finite-difference checks (now 50-digit central differences, through the generic checker), the
// shared-X check of the three summed branches, and Example 2 (identical keys). It prints the
// same quantities, in the same order and with the same labels, as the spec's Python program, and
// exits non-zero if any of the spec's assertions fails. Built with certified gradients (MPFI found:
// TAPEGRAD_WALKTHROUGH_CERTIFIES, examples/CMakeLists.txt), it also certifies the shared-X
// gradient, X's three branches each on its own (check/certify.hpp), and prints one line of its own,
// the proven bound and both times
// (each the best of three calls on one thread, after a first untimed one).
#include "tapegrad.hpp"
#ifdef TAPEGRAD_WALKTHROUGH_CERTIFIES
#include "check/certify.hpp"
#endif

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>

using namespace tapegrad;

namespace {

int failures = 0;

void require(bool condition, const char* what) {
    if (!condition) {
        fmt::print(stderr, "check failed: {}\n", what);
        ++failures;
    }
}

// The best of three timed calls of `work` (seconds): a single call's time is mostly the first
// call's costs (caches, page faults), the same for every kind of check.
template <class Work>
double best_of_three_seconds(const Work& work) {
    double best = std::numeric_limits<double>::infinity();
    for (int round = 0; round < 3; ++round) {
        const auto start = std::chrono::steady_clock::now();
        work();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
}

double max_abs_difference(const Tensor<double>& a, const Tensor<double>& b) {
    double worst = 0;
    for (std::size_t k = 0; k < a.size(); ++k) worst = std::max(worst, std::abs(a[k] - b[k]));
    return worst;
}

}  // namespace

int main() {
    try {
        // The asymmetric transpose check: Q·Kᵀ = [[1, 4], [0, 1]] and Q·K differs from it.
        {
            Tape<double> tape;
            const Var<double> Q_test = tape.constant(Tensor<double>::matrix({{1, 2}, {0, 1}}));
            const Var<double> K_test = tape.constant(Tensor<double>::matrix({{1, 0}, {2, 1}}));
            require(matmul(Q_test, transpose(K_test)).value() == Tensor<double>::matrix({{1, 4}, {0, 1}}), "QK^T");
            require(!(matmul(Q_test, K_test).value() == matmul(Q_test, transpose(K_test)).value()), "QK != QK^T");
        }

        const double a = std::sqrt(2.0) * std::log(3.0);
        const Tensor<double> Q0 = Tensor<double>::matrix({{a, 0}, {0, a}});
        const Tensor<double> K0 = Tensor<double>::matrix({{1, 0}, {0, 1}});
        const Tensor<double> V0 = Tensor<double>::matrix({{2, 0}, {0, 4}});
        const Tensor<double> G = Tensor<double>::matrix({{1, 0}, {0, 2}});
        // J = Σ O ∘ G, the spec's probe, on a tape of any scalar type.
        const auto objective = [&G](const auto& O) {
            using T = typename std::decay_t<decltype(O)>::scalar_type;
            return sum(O * O.tape().constant(tensor_cast<T>(G), "G"));
        };

        // Forward and backward with Q, K, V as the leaves.
        Tape<double> tape;
        const Var<double> Q = tape.leaf(Q0, "Q"), K = tape.leaf(K0, "K"), V = tape.leaf(V0, "V");
        const AttentionResult<double> r = attention_from_qkv(Q, K, V);
        const Var<double> J = objective(r.O);
        tape.backward(J);
        require(max_abs_difference(r.A.value(), Tensor<double>::matrix({{.75, .25}, {.25, .75}})) < 1e-12, "A");
        require(std::abs(J.value().item() - 7.5) < 1e-12, "J = 7.5");
        for (std::size_t i = 0; i < 2; ++i) require(std::abs(r.S.grad()(i, 0) + r.S.grad()(i, 1)) < 1e-12, "dS rows");

        // Finite differences on Q, K, V as independent matrices, then on the shared X.
        const CheckReport qkv = check_gradients([&](auto in) { return objective(attention_from_qkv(in[0], in[1], in[2]).O); },
                                                {{"Q", Q0}, {"K", K0}, {"V", V0}});
        const auto shared_x_graph = [&](auto in) { return objective(attention(in[0], in[1], in[2], in[3]).O); };
        const NamedTensor shared_x_leaves[] = {
            {"X", Tensor<double>::matrix({{1, 0}, {0, 1}})}, {"W_Q", Q0}, {"W_K", K0}, {"W_V", V0}};
        const CheckReport shared_x = check_gradients(shared_x_graph, shared_x_leaves);
        require(qkv.passed && shared_x.passed, "finite differences");

        // Example 2: both key rows [1, 1].
        Tape<double> same_tape;
        const Var<double> Q_same = same_tape.leaf(Q0);
        const Var<double> K_same = same_tape.leaf(Tensor<double>::matrix({{1, 1}, {1, 1}}));
        const AttentionResult<double> same = attention_from_qkv(Q_same, K_same, same_tape.leaf(V0));
        same_tape.backward(objective(same.O));
        for (const double x : Q_same.grad().data()) require(std::abs(x) < 1e-12, "same-key dQ is zero");
        require(same.O.value() == Tensor<double>::matrix({{1, 2}, {1, 2}}), "same-key output");

        fmt::print("attention_weights {}\n", r.A.value());
        fmt::print("output {} probe_loss {}\n", r.O.value(), J.value().item());
        fmt::print("dQ {} dK {} dV {}\n", Q.grad(), K.grad(), V.grad());
        fmt::print("QKV_finite_difference_max_error {:.3g}\n", qkv.max_error_mp);
        fmt::print("shared_X_finite_difference_max_error {:.3g}\n", shared_x.max_error_mp);
#ifdef TAPEGRAD_WALKTHROUGH_CERTIFIES
        // Every element of the shared-X gradient proven (check/certify.hpp): the bound is relative
        // to max(1, |derivative|), as tests/test_certify.cpp holds it. Both timed on one thread, as
        // benchmarks/bench_certify times them (the check would otherwise spread over the cores,
        // and a certification runs on one).
        set_threads(1);
        const double check_seconds =
            best_of_three_seconds([&] { (void)check_gradients(shared_x_graph, shared_x_leaves); });
        const CertificationReport certified = certify_gradients(shared_x_graph, shared_x_leaves);
        const double certify_seconds =
            best_of_three_seconds([&] { (void)certify_gradients(shared_x_graph, shared_x_leaves); });
        set_threads(0);
        double relative_bound = 0;
        for (const auto* elements : {&certified.derivatives, &certified.branches})
            for (const CertifiedDerivative& d : *elements)
                relative_bound = std::max(relative_bound, d.bound / std::max(1.0, std::abs(to_double(d.derivative))));
        require(certified.certified == certified.derivatives.size(), "every shared-X derivative certified");
        require(certified.branches_certified == certified.branches.size(), "every branch of X certified");
        fmt::print(
            "shared_X_certified {} of {}, branches_certified {} of {}, relative_bound {:.2g}, certify_ms {:.3g}, "
            "finite_differences_ms {:.3g}\n",
            certified.certified, certified.derivatives.size(), certified.branches_certified, certified.branches.size(),
            relative_bound, 1e3 * certify_seconds, 1e3 * check_seconds);
#endif
        fmt::print("same_key_output {} same_key_dQ {}\n", same.O.value(), Q_same.grad());
        if (failures > 0) return EXIT_FAILURE;
        fmt::print("all_attention_checks_passed\n");
        return EXIT_SUCCESS;
    } catch (const tapegrad::error& e) {
        fmt::print(stderr, "seed_walkthrough: {}\n", e.what());
        return EXIT_FAILURE;
    }
}
