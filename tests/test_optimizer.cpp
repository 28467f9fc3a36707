// models/optimizer.hpp against PyTorch's own definitions: AdamW with decoupled weight decay on
// matrices only, clipping by the global norm (values printed by Debian's PyTorch 1.13 in float64,
// commands in the comments), and the warm-up + cosine schedule at its landmarks; plus the fault
// control that an Adam step without the decay would not match. The float32 optimizer (BasicAdam<float>,
// the clipping of float gradients) against PyTorch's float32 step (float32 parameters, gradients and
// moments; its scalars in Python doubles).
#define BOOST_TEST_MODULE optimizer
#include "support.hpp"

#include <cmath>
#include <numbers>

using namespace tapegrad;

namespace {

// Three AdamW steps (lr 0.1, λ 0.1, β 0.9/0.999, ε 1e-8) on W = [[1, −2]] (decayed) and b = [0.5]
// (not decayed) with gradients t·[[0.5, −1.5]] and −t·[0.25] at step t.
std::pair<Tensor<double>, Tensor<double>> three_steps(double weight_decay) {
    Tensor<double> W = Tensor<double>::matrix({{1.0, -2.0}}), b(Shape{1}, 0.5);
    Adam adam(AdamSettings{.learning_rate = 0.1, .weight_decay = weight_decay});
    for (int t = 1; t <= 3; ++t) {
        const Tensor<double> dW = Tensor<double>::matrix({{0.5 * t, -1.5 * t}}), db(Shape{1}, -0.25 * t);
        const std::array<Tensor<double>*, 2> parameters{&W, &b};
        const std::array<const Tensor<double>*, 2> gradients{&dW, &db};
        adam.step(parameters, gradients);
    }
    return {W, b};
}

}  // namespace

BOOST_AUTO_TEST_CASE(adamw_matches_pytorch) {
    // torch.optim.AdamW([{'params': [W], 'weight_decay': 0.1}, {'params': [b], 'weight_decay': 0.0}],
    //                   lr=0.1, betas=(0.9, 0.999), eps=1e-8), the same three steps, printed with 17 digits.
    // 1e-15 relative: the same operations in the same order, up to fused multiply-adds.
    const auto [W, b] = three_steps(0.1);
    BOOST_TEST(W[0] == 0.68093586108918058, boost::test_tools::tolerance(1e-15));
    BOOST_TEST(W[1] == -1.6512348583856056, boost::test_tools::tolerance(1e-15));
    BOOST_TEST(b[0] == 0.79231831677726494, boost::test_tools::tolerance(1e-15));
    // Fault control: without the decoupled decay, W ends elsewhere (by about lr·λ·|W| per step).
    const auto [W_plain, b_plain] = three_steps(0.0);
    BOOST_TEST(std::abs(W_plain[0] - W[0]) > 1e-3);
    BOOST_TEST(b_plain[0] == b[0]);  // b is never decayed
}

BOOST_AUTO_TEST_CASE(clipping_by_global_norm_matches_pytorch) {
    // torch.nn.utils.clip_grad_norm_ on gradients [3, 4] and [12] with max_norm 1: returns 13 and
    // scales by 1/(13 + 1e-6).
    Tensor<double> a = Tensor<double>::matrix({{3.0, 4.0}}), c(Shape{1}, 12.0);
    const std::array<Tensor<double>*, 2> gradients{&a, &c};
    BOOST_TEST(clip_by_global_norm(gradients, 1.0) == 13.0);
    BOOST_TEST(a[0] == 0.23076921301775288, boost::test_tools::tolerance(1e-15));
    BOOST_TEST(a[1] == 0.30769228402367049, boost::test_tools::tolerance(1e-15));
    BOOST_TEST(c[0] == 0.92307685207101153, boost::test_tools::tolerance(1e-15));
    // Under the cap nothing changes.
    Tensor<double> small = Tensor<double>::matrix({{0.3, 0.4}});
    const std::array<Tensor<double>*, 1> one{&small};
    BOOST_TEST(clip_by_global_norm(one, 1.0) == 0.5, boost::test_tools::tolerance(1e-15));
    BOOST_TEST((small == Tensor<double>::matrix({{0.3, 0.4}})));
    BOOST_CHECK_THROW(clip_by_global_norm(one, 0.0), value_error);
}

// The same three AdamW steps in float32: torch.optim.AdamW on float32 tensors (same command as
// above with dtype=torch.float32), printed as float.hex(). Every value agrees to the last bit: the
// per-entry arithmetic is float in the same order, the step's scalars double rounded once to float.
BOOST_AUTO_TEST_CASE(adamw_float32_matches_pytorch_float32) {
    Tensor<float> W = Tensor<float>::matrix({{1.0f, -2.0f}}), b(Shape{1}, 0.5f);
    BasicAdam<float> adam(AdamSettings{.learning_rate = 0.1, .weight_decay = 0.1});
    for (int t = 1; t <= 3; ++t) {
        const float tf = static_cast<float>(t);
        const Tensor<float> dW = Tensor<float>::matrix({{0.5f * tf, -1.5f * tf}}), db(Shape{1}, -0.25f * tf);
        const std::array<Tensor<float>*, 2> parameters{&W, &b};
        const std::array<const Tensor<float>*, 2> gradients{&dW, &db};
        adam.step(parameters, gradients);
    }
    BOOST_TEST(W[0] == 0x1.5ca3a2p-1f);
    BOOST_TEST(W[1] == -0x1.a6b754p+0f);
    BOOST_TEST(b[0] == 0x1.95aabep-1f);
    BOOST_TEST(adam.state().first[0][0] == 0x1.1f3b64p-2f);
    BOOST_TEST(adam.state().second[0][1] == 0x1.01effcp-5f);
    BOOST_TEST(adam.state().second[1][0] == 0x1.ca8e30p-11f);
    // Fault control: the same steps computed in double and rounded to float only at the end differ
    // in the last bit, so the checks above do see where the arithmetic is done.
    const auto [W64, b64] = three_steps(0.1);
    BOOST_TEST(static_cast<float>(W64[0]) != W[0]);
    BOOST_TEST(static_cast<float>(b64[0]) != b[0]);
}

BOOST_AUTO_TEST_CASE(clipping_float32_gradients_matches_pytorch) {
    // clip_grad_norm_ on float32 [3, 4] and [12], max_norm 1: 13, and the float32 results below.
    Tensor<float> a = Tensor<float>::matrix({{3.0f, 4.0f}}), c(Shape{1}, 12.0f);
    const std::array<Tensor<float>*, 2> gradients{&a, &c};
    BOOST_TEST(clip_by_global_norm(gradients, 1.0) == 13.0);
    BOOST_TEST(a[0] == 0x1.d89d88p-3f);
    BOOST_TEST(a[1] == 0x1.3b13b0p-2f);
    BOOST_TEST(c[0] == 0x1.d89d88p-1f);
}

BOOST_AUTO_TEST_CASE(warmup_then_cosine_decay) {
    const WarmupCosine schedule{.peak = 1e-3, .warmup_steps = 10, .total_steps = 110, .floor_ratio = 0.1};
    BOOST_TEST(schedule.rate(0) == 1e-4, boost::test_tools::tolerance(1e-14));
    BOOST_TEST(schedule.rate(9) == 1e-3, boost::test_tools::tolerance(1e-14));
    BOOST_TEST(schedule.rate(10) == 1e-3, boost::test_tools::tolerance(1e-14));     // cos 0 = 1
    BOOST_TEST(schedule.rate(60) == 0.55e-3, boost::test_tools::tolerance(1e-14));  // half way: the mean
    BOOST_TEST(schedule.rate(110) == 1e-4, boost::test_tools::tolerance(1e-14));    // the floor, and after
    BOOST_TEST(schedule.rate(1000) == 1e-4, boost::test_tools::tolerance(1e-14));
    for (std::size_t s = 10; s < 110; ++s) BOOST_TEST(schedule.rate(s + 1) < schedule.rate(s));
}

BOOST_AUTO_TEST_CASE(adam_state_restores_exactly) {
    Tensor<double> W = Tensor<double>::matrix({{1.0, -2.0}});
    const Tensor<double> g = Tensor<double>::matrix({{0.5, 0.25}});
    const std::array<Tensor<double>*, 1> p{&W};
    const std::array<const Tensor<double>*, 1> grads{&g};
    Adam first(AdamSettings{.weight_decay = 0.1});
    first.step(p, grads);
    Tensor<double> copy = W;
    Adam second(AdamSettings{.weight_decay = 0.1});
    second.restore(first.state());
    first.step(p, grads);
    const std::array<Tensor<double>*, 1> q{&copy};
    second.step(q, grads);
    BOOST_TEST((copy == W));
    BOOST_TEST(second.steps() == 2u);
    BOOST_CHECK_THROW(Adam(AdamSettings{.weight_decay = -1.0}), value_error);
}
