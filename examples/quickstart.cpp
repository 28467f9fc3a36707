// The README's short program: build single-head attention on a tape, run backward from the
// probe J = Σ O ∘ G, read the gradients, and check the tape it ran against 50-digit differences.
#include "tapegrad_record.hpp"

#include <fmt/core.h>

int main() {
    using namespace tapegrad;
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>::matrix({{1, 0}, {0, 1}, {1, 1}}), "X");  // T=3, D=2
    const Var<double> W_Q = tape.leaf(Tensor<double>::matrix({{0.5, -1}, {1, 0.25}}), "W_Q");
    const Var<double> W_K = tape.leaf(Tensor<double>::matrix({{1, 0}, {0.5, 1}}), "W_K");
    const Var<double> W_V = tape.leaf(Tensor<double>::matrix({{2, 0, 1}, {0, 4, -1}}), "W_V");  // r=3

    const AttentionResult<double> attn = attention(X, W_Q, W_K, W_V);  // Q, K, V, S, A, O
    const Var<double> G = tape.constant(Tensor<double>(attn.O.shape(), 1.0), "G");
    const Var<double> J = sum(attn.O * G);  // records mul and sum, as sum(mul(attn.O, G)) would
    tape.backward(J);

    fmt::print("A  = {:.4}\nO  = {:.4}\nJ  = {}\n", attn.A.value(), attn.O.value(), J.value().item());
    fmt::print("dX = {:.4}\ndW_Q = {:.4}\ndS = {:.4}\n", X.grad(), W_Q.grad(), attn.S.grad());

    // The tape just run, checked as it stands: re-run at double and at 50 digits, its gradients
    // compared with 50-digit finite differences (check/recorded.hpp).
    const CheckReport report = check_gradients(tape, J);
    fmt::print("{}\n", report.summary());
    return report.passed ? 0 : 1;
}
