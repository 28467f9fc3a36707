// Curvature with forward-over-reverse Hessian-vector products (autodiff/forward_mode.hpp).
//  1. The Hessian of the spec's Example 1 loss J = Σ O ∘ G with respect to Q (4×4), from four HVPs
//     on a 50-digit dual tape, printed next to the 50-digit central differences of the 50-digit
//     gradient; and the HVP check of Example 1 over Q, K and V.
//  2. The sharpness of the retrieval model (models/retrieval.hpp): the largest Hessian
//     eigenvalue λ of its loss over all parameters, by power iteration on HVPs (double dual tape),
//     at initialisation and after training. Gradient descent is stable for learning rates below
//     2/λ, so λ is a step-size guide; it also shows how sharp the minimum found is.
//   usage: curvature [training steps]   (default 300)
// Exits non-zero if the Hessian and the differences disagree beyond 1e-25 or a check fails.
#include "models/retrieval.hpp"
#include "tapegrad.hpp"
#include "tools/options.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <string>

using namespace tapegrad;

namespace {

// The spec's Example 1 (examples/seed_walkthrough.cpp): Q = a·I with a = √2·ln 3, K = I,
// V = diag(2, 4), probe G = diag(1, 2); A = [[3/4, 1/4], [1/4, 3/4]], J = 7.5.
struct Example1 {
    Tensor<double> Q, K, V, G;
    Example1() {
        const double a = std::sqrt(2.0) * std::log(3.0);
        Q = Tensor<double>::matrix({{a, 0}, {0, a}});
        K = Tensor<double>::matrix({{1, 0}, {0, 1}});
        V = Tensor<double>::matrix({{2, 0}, {0, 4}});
        G = Tensor<double>::matrix({{1, 0}, {0, 2}});
    }
    // J(Q, K, V) on a tape of any scalar type.
    auto loss() const {
        return [G = G](auto in) {
            using T = typename std::decay_t<decltype(in[0])>::scalar_type;
            return sum(attention_from_qkv(in[0], in[1], in[2]).O * in[0].tape().constant(tensor_cast<T>(G), "G"));
        };
    }
};

// ∇_Q J at Q in 50 digits (K and V fixed).
Tensor<mp50> gradient_wrt_Q(const Example1& e, const Tensor<mp50>& Q) {
    Tape<mp50> tape;
    const std::array<Var<mp50>, 3> in{tape.leaf(Q), tape.constant(tensor_cast<mp50>(e.K)), tape.constant(tensor_cast<mp50>(e.V))};
    tape.backward(e.loss()(in));
    return in[0].grad();
}

// Part 1. Returns the largest mixed error between the Hessian and the differences.
double example1_hessian(const Example1& e) {
    const auto J_of_Q = [&](auto in) {
        using T = typename std::decay_t<decltype(in[0])>::scalar_type;
        Tape<T>& tape = in[0].tape();
        return e.loss()(std::array{in[0], tape.constant(tensor_cast<T>(e.K)), tape.constant(tensor_cast<T>(e.V))});
    };
    const Tensor<mp50> H = hessian(J_of_Q, std::array<Tensor<mp50>, 1>{tensor_cast<mp50>(e.Q)});
    const mp50 h(1e-14);  // the checker's step (check/report.hpp): error ≤ 1.7e-29·|J''''|
    fmt::print("Example 1: Hessian of J = sum(O * G) with respect to Q (rows and columns Q00 Q01 Q10 Q11)\n");
    fmt::print("  {:>24} {:>24} {:>10}\n", "H (50-digit dual tape)", "50-digit differences", "mixed err");
    double worst = 0;
    for (std::size_t c = 0; c < 4; ++c) {
        Tensor<mp50> plus = tensor_cast<mp50>(e.Q), minus = plus;
        plus[c] += h;
        minus[c] -= h;
        const Tensor<mp50> g_plus = gradient_wrt_Q(e, plus), g_minus = gradient_wrt_Q(e, minus);
        for (std::size_t r = 0; r < 4; ++r) {
            const mp50 numeric = (g_plus[r] - g_minus[r]) / (2 * h);
            const double error = mixed_error(H(r, c), numeric);
            worst = std::max(worst, error);
            fmt::print("  H[{}][{}] {:>+22.17f} {:>+24.17f} {:>10.2e}\n", r, c, to_double(H(r, c)), to_double(numeric), error);
        }
    }
    fmt::print("Example 1 Hessian: max mixed error vs 50-digit differences {:.3g} (threshold 1e-25)\n", worst);
    const SecondOrderReport qkv = check_hvp(e.loss(), {{"Q", e.Q}, {"K", e.K}, {"V", e.V}});
    fmt::print("Example 1 over Q, K, V: {}\n", qkv.summary());
    return qkv.passed ? worst : 1.0;
}

// Part 2: power iteration on HVPs of the retrieval loss over all parameters, on one fixed batch.
struct Sharpness {
    double lambda;    // Rayleigh quotient <v, H v> of the final unit v
    double residual;  // |H v − λ v| / |λ|
};

Sharpness largest_eigenvalue(const RetrievalParameters& p, const RetrievalConfig& config, const RetrievalBatch& batch) {
    const auto loss = [&](auto in) {
        using T = typename std::decay_t<decltype(in[0])>::scalar_type;
        return retrieval_loss(RetrievalVars<T>{in[0], in[1], in[2], in[3], in[4], in[5], in[6]}, batch, config.heads);
    };
    std::array<Tensor<double>, 7> x{p.E, p.P, p.W_Q, p.W_K, p.W_V, p.W_O, p.W_U}, v;
    std::mt19937_64 generator(7);
    std::normal_distribution<double> normal;
    for (std::size_t l = 0; l < 7; ++l) {
        v[l] = Tensor<double>(x[l].shape());
        for (double& z : v[l].data()) z = normal(generator);
    }
    const auto inner = [](const auto& a, const auto& b) {
        double s = 0;
        for (std::size_t l = 0; l < 7; ++l)
            for (std::size_t k = 0; k < a[l].size(); ++k) s += a[l][k] * b[l][k];
        return s;
    };
    const auto normalise = [&](std::array<Tensor<double>, 7>& w) {
        const double norm = std::sqrt(inner(w, w));
        for (auto& part : w)
            for (double& z : part.data()) z /= norm;
    };
    normalise(v);
    Tape<Dual<double>> tape;  // reused by every HVP
    Sharpness s{0, 0};
    for (int iteration = 0; iteration < 50; ++iteration) {
        std::array<Tensor<double>, 7> Hv = hvp(tape, loss, x, v).Hv;
        s.lambda = inner(v, Hv);
        double r2 = 0;
        for (std::size_t l = 0; l < 7; ++l)
            for (std::size_t k = 0; k < v[l].size(); ++k) r2 += std::pow(Hv[l][k] - s.lambda * v[l][k], 2);
        s.residual = std::sqrt(r2) / std::abs(s.lambda);
        v = std::move(Hv);
        normalise(v);
    }
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    std::size_t steps = 300;
    try {  // read the way every program of the project reads its numbers (tools/options.hpp)
        if (argc > 2) throw cli::usage_error(fmt::format("at most one argument, got {}", argc - 1));
        if (argc > 1) steps = cli::integer_argument("training steps (the argument)", argv[1], std::size_t{0}, std::size_t{1000000});
    } catch (const std::exception& e) {
        fmt::print(stderr, "curvature: {} (usage: curvature [training steps])\n", e.what());
        return cli::exit_usage;
    }
    try {
        const double worst = example1_hessian(Example1{});

        RetrievalConfig config{};  // 32 keys, 32 values, 12 pairs, D = 32, 4 heads
        RetrievalTrainer trainer(config, AdamSettings{.learning_rate = 1e-2});
        std::mt19937_64 data(2026), probe_data(5);
        const RetrievalBatch probe_batch = make_retrieval_batch(config, 32, probe_data);
        const auto report = [&](const char* when) {
            const Sharpness s = largest_eigenvalue(trainer.parameters(), config, probe_batch);
            const auto [loss, accuracy] = trainer.evaluate(probe_batch);
            fmt::print("retrieval {}: loss {:.4f}, accuracy {:.1f}%, largest Hessian eigenvalue {:.4f} "
                       "(power iteration, 50 HVPs, residual {:.1e}), gradient-descent stability limit 2/lambda = {:.4f}\n",
                       when, loss, 100 * accuracy, s.lambda, s.residual, 2 / s.lambda);
        };
        report("at initialisation");
        const double peak = trainer.optimizer().learning_rate();
        for (std::size_t step = 1; step <= steps; ++step) {
            trainer.optimizer().set_learning_rate(peak * (1.0 - 0.9 * static_cast<double>(step - 1) / static_cast<double>(steps)));
            trainer.step(make_retrieval_batch(config, 64, data));
        }
        report(fmt::format("after {} Adam steps", steps).c_str());
        if (!(worst <= 1e-25)) return EXIT_FAILURE;
        fmt::print("curvature_checks_passed\n");
        return EXIT_SUCCESS;
    } catch (const std::exception& e) {
        fmt::print(stderr, "curvature: {}\n", e.what());
        return EXIT_FAILURE;
    }
}
