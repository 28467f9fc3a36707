// How a user adds an op of their own: an elementwise tanh, written in one struct (name, arity, how to
// record it again, forward, VJP with its formula; a public function with its shape check), then
// verified by the 50-digit checker, alone and inside attention (as a nonlinearity on the values),
// and, registered (one line: its siblings and saved form), on a tape recorded by ordinary code,
// checked as it ran, then saved and loaded again. tapegrad has a tanh of
// its own (ops/tanh.hpp); this one lives in the user's namespace my_ops and is called as
// my_ops::tanh, so the two never meet.
#include "tapegrad.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <span>
#include <string>

namespace my_ops {

using namespace tapegrad;

// tanh: Y = tanh(X), elementwise.
// VJP: dX = G ∘ (1 − Y²), since d tanh(x)/dx = 1 − tanh²(x); the saved output Y is all it needs.
template <Scalar T>
Var<T> tanh(const Var<T>& X);

struct Tanh {
    static constexpr std::string_view name = "tanh";  // saved as "user:tanh": never the library's tanh
    static constexpr Arity arity{1};
    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {  // a loaded tape's node, recorded again
        return my_ops::tanh(in[0]);  // qualified: tapegrad::tanh is found too, by the argument's namespace
    }

    template <Scalar T>
    static void forward(const NoSettings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        using std::tanh;
        const Tensor<T>& X = *in[0];
        Y.resize(X.shape());
        for (std::size_t k = 0; k < X.size(); ++k) Y[k] = tanh(X[k]);
    }

    template <Scalar T>
    static void vjp(const NoSettings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        const Tensor<T>& Y = at.out;  // tanh' = 1 − tanh², from the saved output
        for (std::size_t k = 0; k < at.G.size(); ++k) dX[k] = at.G[k] * (1 - Y[k] * Y[k]);
    }
};

template <Scalar T>
Var<T> tanh(const Var<T>& X) {
    checks::non_empty(Tanh::name, "X", X);
    return X.tape().template record<Tanh>({X});
}

// The op registered: its siblings at double, 50 digits and the duals, so that a tape holding it can
// be re-run and checked as recorded (check_gradients(tape, J)), and its saved form, so that the tape
// can be saved and loaded (autodiff/registry.hpp).
inline const bool tanh_registered = register_op<Tanh>();

}  // namespace my_ops

int main() {
    using namespace tapegrad;
    const Tensor<double> X = Tensor<double>::matrix({{0.5, -1.0, 2.0}, {0.1, 0.3, -0.7}});
    const Tensor<double> W = Tensor<double>::matrix({{0.2, -0.4}, {1.1, 0.3}, {-0.6, 0.9}});

    // The op alone: J = Σ tanh(X)·W.
    const CheckReport alone = check_gradients(
        [](auto in) {
            auto [X, W] = in;
            return sum(matmul(my_ops::tanh(X), W));
        },
        {{"X", X}, {"W", W}});
    fmt::print("tanh alone: {}\n\n", alone.summary());

    // Inside attention, on the values: O = softmax(QKᵀ/√d)·tanh(V).
    const CheckReport inside = check_gradients(
        [](auto in) {
            auto [X, W_Q, W_K, W_V] = in;
            const auto Q = matmul(X, W_Q), K = matmul(X, W_K), V = my_ops::tanh(matmul(X, W_V));
            return sum(attention_from_qkv(Q, K, V).O);
        },
        {{"X", X}, {"W_Q", W}, {"W_K", W}, {"W_V", W}});
    fmt::print("tanh inside attention: {}\n\n", inside.summary());

    // A tape recorded by ordinary code, checked as it ran.
    Tape<double> tape;
    const Var<double> x = tape.leaf(X, "X"), w = tape.leaf(W, "W");
    const Var<double> J = sum(matmul(my_ops::tanh(x), w));
    tape.backward(J);
    const CheckReport recorded = check_gradients(tape, J);
    fmt::print("tanh on a recorded tape: {}\n", recorded.summary());

    // Saved (the op as "user:tanh") and loaded again: the same J, bit for bit.
    const std::string text = tape_file_text(tape, J);
    Tape<double> loaded;
    const Var<double> J_loaded = parse_tape(text, "custom_op tape", loaded);
    const bool round_trip = text.find("\"user:tanh\"") != std::string::npos && J_loaded.value()[0] == J.value()[0];
    fmt::print("saved and loaded as user:tanh: {}\n", round_trip ? "same J" : "DIFFERENT");
    return alone.passed && inside.passed && recorded.passed && round_trip ? EXIT_SUCCESS : EXIT_FAILURE;
}
