// The models' new ops (dropout, embedding, cross_entropy, split_heads, merge_heads) through the
// generic 50-digit checker, one line per op, on random shapes; then their specific promises:
// errors that name the fault, dropout's determinism and scaling, its keep-mask drawn as documented,
// embedding's summed repeated rows, cross-entropy's stability at logits of ±1e4.
#define BOOST_TEST_MODULE models_ops
#include "support.hpp"

#include <cmath>
#include <functional>
#include <limits>

using namespace tapegrad;
using tapegrad::testing::message_of;
using tapegrad::testing::check_op;
using tapegrad::testing::OpCase;
using tapegrad::testing::OpDims;
using tapegrad::testing::scalar_of;
using tapegrad::testing::random_tensor;

namespace {

// Indices with repeats: n + 2 picks from `rows` rows, so at least two rows are picked twice.
std::vector<std::size_t> repeated_indices(std::size_t rows, std::size_t n) {
    std::vector<std::size_t> indices(n + 2);
    for (std::size_t r = 0; r < indices.size(); ++r) indices[r] = (r * 3 + 1) % rows;
    return indices;
}

std::vector<std::size_t> targets_for(std::size_t rows, std::size_t classes) {
    std::vector<std::size_t> targets(rows);
    for (std::size_t r = 0; r < rows; ++r) targets[r] = (r * 7 + 1) % classes;
    return targets;
}

// Dropout with a keep-mask drawn from a generator seeded inside the graph, so the double and the
// 50-digit recordings draw the same mask and the checker's replays hold it fixed.
template <class V>
V seeded_dropout(const V& X, double p) {
    std::mt19937_64 generator(99);
    return dropout(X, p, generator);
}

const std::vector<OpCase> op_table = {
    {"dropout p=0.3", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return seeded_dropout(in[0], 0.3); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"dropout p=0", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return seeded_dropout(in[0], 0.0); }, rng, Shape{d.m, d.n}); }},
    {"embedding", [](const OpDims& d, auto& rng) { return check_op([&d](auto in) { return embedding(in[0], std::span<const std::size_t>(repeated_indices(d.k + 1, d.m))); }, rng, Shape{d.k + 1, d.n}); }},
    {"embedding batched", [](const OpDims& d, auto& rng) { return check_op([&d](auto in) { return embedding(in[0], std::span<const std::size_t>(repeated_indices(d.k + 1, 2 * d.batch * d.m - 2)), d.batch); }, rng, Shape{d.k + 1, d.n}); }},
    {"embedding rows of a batch", [](const OpDims& d, auto& rng) { return check_op([&d](auto in) { return embedding(in[0], std::span<const std::size_t>(repeated_indices(d.batch * d.m, d.k))); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"cross_entropy", [](const OpDims& d, auto& rng) { return check_op([&d](auto in) { return cross_entropy(in[0], std::span<const std::size_t>(targets_for(d.m, d.n))); }, rng, Shape{d.m, d.n}); }},
    {"cross_entropy batched", [](const OpDims& d, auto& rng) { return check_op([&d](auto in) { return cross_entropy(in[0], std::span<const std::size_t>(targets_for(d.batch * d.m, d.n))); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"split_heads", [](const OpDims& d, auto& rng) { return check_op([&d](auto in) { return split_heads(in[0], d.k); }, rng, Shape{d.batch, d.m, d.k * d.n}); }},
    {"split_heads rank 2", [](const OpDims& d, auto& rng) { return check_op([&d](auto in) { return split_heads(in[0], d.k); }, rng, Shape{d.m, d.k * d.n}); }},
    {"merge_heads", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return merge_heads(in[0]); }, rng, Shape{d.batch, d.k, d.m, d.n}); }},
    {"merge_heads rank 3", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return merge_heads(in[0]); }, rng, Shape{d.k, d.m, d.n}); }},
};

}  // namespace

BOOST_AUTO_TEST_CASE(every_new_op_passes_the_50_digit_checker) {
    testing::check_op_table(op_table, 43, 5);
}

BOOST_AUTO_TEST_CASE(dropout_p_zero_is_the_identity_and_a_seed_fixes_the_mask) {
    std::mt19937_64 rng(1);
    const Tensor<double> x = random_tensor(Shape{4, 50}, rng);
    Tape<double> tape;
    const Var<double> X = tape.leaf(x, "X");
    std::mt19937_64 g0(5);
    BOOST_TEST((dropout(X, 0.0, g0).value() == x));

    std::mt19937_64 a(5), b(5), c(6);
    const Tensor<double> ya = dropout(X, 0.25, a).value();
    const Tensor<double> yb = dropout(X, 0.25, b).value();
    const Tensor<double> yc = dropout(X, 0.25, c).value();
    BOOST_TEST((ya == yb));
    BOOST_TEST(!(ya == yc));
    // Kept entries are x/(1−p) (to the last bit of the product), dropped ones exactly 0.
    std::size_t kept = 0;
    for (std::size_t k = 0; k < x.size(); ++k) {
        if (ya[k] != 0.0) {
            BOOST_TEST(ya[k] == (1.0 / 0.75) * x[k]);
            ++kept;
        }
    }
    // 200 Bernoulli(0.75) draws: mean 150, standard deviation 6.1; 120..180 is about 5σ.
    BOOST_TEST(kept >= 120u);
    BOOST_TEST(kept <= 180u);
}

BOOST_AUTO_TEST_CASE(dropout_vjp_reuses_the_forward_mask) {
    std::mt19937_64 rng(2);
    Tape<double> tape;
    const Var<double> X = tape.leaf(random_tensor(Shape{3, 7}, rng), "X");
    std::mt19937_64 generator(17);
    const Var<double> Y = dropout(X, 0.5, generator);
    const Tensor<double> G = random_tensor(Y.shape(), rng);
    tape.backward(Y, G);
    for (std::size_t k = 0; k < G.size(); ++k) {
        BOOST_TEST(X.grad()[k] == (Y.value()[k] != 0.0 ? 2.0 * G[k] : 0.0));
    }
}

BOOST_AUTO_TEST_CASE(dropout_rejects_p_outside_zero_one) {
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>(Shape{2, 2}, 1.0), "X");
    std::mt19937_64 generator(1);
    for (const double p : {1.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
        BOOST_CHECK_THROW(dropout(X, p, generator), value_error);
    }
    BOOST_TEST(message_of<value_error>([&] { dropout(X, 1.0, generator); }).find("outside [0, 1)") !=
               std::string::npos);
}

// draw_keep_mask's promise, element by element: element k is kept exactly when u_k >= p, where u_k is
// the generator's k-th raw 64-bit output less its low 11 bits, times 2^-53 (so one seed gives one
// mask with every standard library); it draws once per element, in order, and no more. At p = 0
// everything is kept; just below 1, almost nothing. The shapes run from one element to several
// batches, the first and last elements included.
BOOST_AUTO_TEST_CASE(the_keep_mask_is_the_documented_draw_element_by_element) {
    const double below_one = std::nextafter(1.0, 0.0);
    for (const double p : {0.0, 0.1, 0.5, 0.75, below_one}) {
        for (const Shape& shape : {Shape{1}, Shape{3, 7}, Shape{2, 3, 5}}) {
            std::mt19937_64 generator(29), replay(29);
            const Tensor<double> keep = draw_keep_mask(shape, p, generator);
            BOOST_TEST_REQUIRE((keep.shape() == shape));
            std::size_t kept = 0;
            for (std::size_t k = 0; k < keep.size(); ++k) {
                const double u = static_cast<double>(replay() >> 11) * 0x1.0p-53;
                BOOST_TEST(keep[k] == (u >= p ? 1.0 : 0.0), "p = " << p << ", element " << k);
                kept += keep[k] == 1.0;
            }
            BOOST_TEST((generator == replay), "p = " << p << ": one draw per element, " << keep.size());
            if (p == 0.0) BOOST_TEST(kept == keep.size());
            if (p == below_one) BOOST_TEST(kept == 0u);  // u >= 1 - 2^-53 needs all 53 bits set
        }
    }
}

// check_dropout_probability names its caller and p; [0, 1) is accepted to its ends, and the keep-mask
// refuses what it refuses, before drawing anything.
BOOST_AUTO_TEST_CASE(the_dropout_probability_is_checked_in_zero_to_one) {
    for (const double p : {0.0, -0.0, 0.5, std::nextafter(1.0, 0.0)}) {
        BOOST_CHECK_NO_THROW(check_dropout_probability("attention", p));
    }
    for (const double p :
         {1.0, -0.25, 1.5, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
        BOOST_TEST(message_of<value_error>([p] { check_dropout_probability("attention", p); }) ==
                       fmt::format("attention: dropout probability p = {} is outside [0, 1)", p),
                   "p = " << p);
        std::mt19937_64 generator(3);
        const std::mt19937_64 untouched = generator;
        const auto draw = [&] { (void)draw_keep_mask(Shape{2, 2}, p, generator); };
        BOOST_TEST(
            message_of<value_error>(draw) == fmt::format("dropout: dropout probability p = {} is outside [0, 1)", p),
            "p = " << p);
        BOOST_TEST((generator == untouched), "p = " << p << ": a refused p draws nothing");
    }
}

BOOST_AUTO_TEST_CASE(embedding_sums_the_gradient_of_a_repeated_index) {
    Tape<double> tape;
    const Var<double> E = tape.leaf(Tensor<double>::matrix({{1, 2}, {3, 4}, {5, 6}}), "E");
    const std::vector<std::size_t> indices = {1, 1, 0};
    const Var<double> Y = embedding(E, std::span<const std::size_t>(indices));
    BOOST_TEST((Y.value() == Tensor<double>::matrix({{3, 4}, {3, 4}, {1, 2}})));
    tape.backward(Y, Tensor<double>::matrix({{1, 10}, {100, 1000}, {7, 8}}));
    BOOST_TEST((E.grad() == Tensor<double>::matrix({{7, 8}, {101, 1010}, {0, 0}})));
}

BOOST_AUTO_TEST_CASE(embedding_rejects_bad_indices_by_name) {
    Tape<double> tape;
    const Var<double> E = tape.leaf(Tensor<double>(Shape{3, 2}, 1.0), "E");
    const std::vector<std::size_t> bad = {0, 3};
    const std::string message =
        message_of<value_error>([&] { embedding(E, std::span<const std::size_t>(bad)); });
    BOOST_TEST(message.find("index 3 at position 1") != std::string::npos, message);
    BOOST_CHECK_THROW(embedding(E, std::span<const std::size_t>()), shape_error);
    const std::vector<std::size_t> three = {0, 1, 2};
    BOOST_CHECK_THROW(embedding(E, std::span<const std::size_t>(three), 2), shape_error);  // 3 rows into 2 sequences
}

BOOST_AUTO_TEST_CASE(cross_entropy_is_stable_at_logits_of_1e4) {
    Tape<double> tape;
    const Var<double> z = tape.leaf(Tensor<double>::matrix({{1e4, -1e4, 0}, {-1e4, 1e4, 1e4}}), "z");
    const std::vector<std::size_t> targets = {1, 2};
    const Var<double> J = cross_entropy(z, std::span<const std::size_t>(targets));
    // Row 0: −log softmax picks 1e4 − (−1e4) = 2e4 (exp(−1e4) terms vanish); row 1: log 2.
    BOOST_TEST(J.value().item() == (2e4 + std::log(2.0)) / 2, boost::test_tools::tolerance(1e-15));
    tape.backward(J);
    for (const double g : z.grad().data()) BOOST_TEST(std::isfinite(g));
    BOOST_TEST(z.grad()(0, 1) == -0.5);  // (P − 1)/N with P = 0
    BOOST_TEST(z.grad()(1, 2) == -0.25);  // (1/2 − 1)/2

    // And the checker agrees at that scale (random logits in ±1e4).
    std::mt19937_64 rng(3);
    const std::vector<std::size_t> t3 = {0, 2, 1};
    const CheckReport report = check_gradients(
        [&](auto leaves) { return cross_entropy(leaves[0], std::span<const std::size_t>(t3)); },
        {{"z", random_tensor(Shape{3, 4}, rng, 1e4)}});
    BOOST_TEST(report.passed, report.summary());
}

BOOST_AUTO_TEST_CASE(cross_entropy_names_a_bad_target_and_its_row) {
    Tape<double> tape;
    const Var<double> z = tape.leaf(Tensor<double>(Shape{2, 3}, 0.0), "z");
    const std::vector<std::size_t> bad = {0, 3};
    const std::string message = message_of<value_error>([&] { cross_entropy(z, std::span<const std::size_t>(bad)); });
    BOOST_TEST(message.find("target 3 in row 1") != std::string::npos, message);
    const std::vector<std::size_t> short_list = {0};
    BOOST_CHECK_THROW(cross_entropy(z, std::span<const std::size_t>(short_list)), shape_error);
}

BOOST_AUTO_TEST_CASE(merge_heads_undoes_split_heads) {
    std::mt19937_64 rng(4);
    Tape<double> tape;
    const Tensor<double> x = random_tensor(Shape{2, 3, 6}, rng);
    const Var<double> X = tape.leaf(x, "X");
    const Var<double> heads = split_heads(X, 3);
    BOOST_TEST((heads.shape() == Shape{2, 3, 3, 2}));
    BOOST_TEST(heads.value().at({1, 2, 0, 1}) == x.at({1, 0, 2 * 2 + 1}));
    BOOST_TEST((merge_heads(heads).value() == x));
    BOOST_CHECK_THROW(split_heads(X, 4), shape_error);
    BOOST_CHECK_THROW(split_heads(X, 0), shape_error);
    BOOST_CHECK_THROW(merge_heads(tape.leaf(Tensor<double>(Shape{2, 2}, 1.0))), shape_error);
}
