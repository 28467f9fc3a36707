// Multi-head attention and the retrieval model through the 50-digit checker: every parameter and
// the input embeddings (full mode on small sizes, fast mode on bigger ones), tied W_Q = W_K,
// padding (padded keys never attended, padded query rows exactly zero), the key-value cache with
// several heads, causality, the fused-kernel switch's usage errors and the kernels' names.
#define BOOST_TEST_MODULE multihead
#include "support.hpp"
#include "models/retrieval.hpp"

#include <cmath>
#include <iostream>

using namespace tapegrad;
using tapegrad::testing::probe;
using tapegrad::testing::random_tensor;

namespace {

MultiHeadOptions heads_options(std::size_t heads, std::vector<std::size_t> lengths = {}) {
    MultiHeadOptions options;
    options.heads = heads;
    options.lengths = std::move(lengths);
    return options;
}

// Rows [begin, end) of each sequence of a [B × T × D] tensor.
Tensor<double> time_slice(const Tensor<double>& x, std::size_t begin, std::size_t end) {
    const std::size_t B = x.shape()[0], T = x.shape()[1], D = x.shape()[2];
    Tensor<double> part(Shape{B, end - begin, D});
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t t = begin; t < end; ++t)
            for (std::size_t c = 0; c < D; ++c) part.at({b, t - begin, c}) = x.at({b, t, c});
    (void)T;
    return part;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_parameter_and_the_input_pass_the_full_50_digit_check) {
    std::mt19937_64 rng(20);
    // B = 2, T = 3, D = 4, two heads of width 2, D_out = 3.
    const CheckReport report = check_gradients(
        [](auto in) {
            const auto [X, W_Q, W_K, W_V, W_O] = in;
            return probe(multihead_attention(X, MultiHeadWeights<typename decltype(X)::scalar_type>{W_Q, W_K, W_V, W_O},
                                             heads_options(2))
                             .Y);
        },
        {{"X", random_tensor(Shape{2, 3, 4}, rng)},
         {"W_Q", random_tensor(Shape{4, 4}, rng)},
         {"W_K", random_tensor(Shape{4, 4}, rng)},
         {"W_V", random_tensor(Shape{4, 4}, rng)},
         {"W_O", random_tensor(Shape{4, 3}, rng)}});
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.failed_branches().empty());
    std::cout << "multi-head full check: " << report.summary() << "\n";
}

BOOST_AUTO_TEST_CASE(padding_offset_and_dropout_pass_the_full_check) {
    std::mt19937_64 rng(21);
    // Queries at positions 1..2 of sequences of lengths 3 and 2 (so one padded query row), with
    // dropout held fixed by a generator seeded inside the graph.
    const CheckReport report = check_gradients(
        [](auto in) {
            const auto [Xq, Xm, W_Q, W_K, W_V, W_O] = in;
            std::mt19937_64 generator(7);
            MultiHeadOptions options = heads_options(2, {3, 2});
            options.query_offset = 1;
            options.dropout = DropoutSettings{0.2, generator};
            return probe(
                multihead_attention(Xq, Xm, MultiHeadWeights<typename decltype(Xq)::scalar_type>{W_Q, W_K, W_V, W_O},
                                    options)
                    .Y);
        },
        {{"X_query", random_tensor(Shape{2, 2, 4}, rng)},
         {"X_memory", random_tensor(Shape{2, 3, 4}, rng)},
         {"W_Q", random_tensor(Shape{4, 4}, rng)},
         {"W_K", random_tensor(Shape{4, 4}, rng)},
         {"W_V", random_tensor(Shape{4, 2}, rng)},
         {"W_O", random_tensor(Shape{2, 3}, rng)}});
    BOOST_TEST(report.passed, report.summary());
}

BOOST_AUTO_TEST_CASE(a_bigger_model_passes_the_fast_check) {
    std::mt19937_64 rng(22);
    CheckOptions fast;
    fast.mode = CheckOptions::Mode::fast;
    // Branch attribution perturbs every coordinate (it is a full check per branch); the full
    // checks on small sizes above cover the branches, fast mode here covers the size.
    fast.check_branches = false;
    const CheckReport report = check_gradients(
        [](auto in) {
            const auto [X, W_Q, W_K, W_V, W_O] = in;
            return probe(multihead_attention(X, MultiHeadWeights<typename decltype(X)::scalar_type>{W_Q, W_K, W_V, W_O},
                                             heads_options(4, {8, 5}))
                             .Y);
        },
        {{"X", random_tensor(Shape{2, 8, 16}, rng)},
         {"W_Q", random_tensor(Shape{16, 16}, rng, 0.5)},
         {"W_K", random_tensor(Shape{16, 16}, rng, 0.5)},
         {"W_V", random_tensor(Shape{16, 16}, rng, 0.5)},
         {"W_O", random_tensor(Shape{16, 16}, rng, 0.5)}},
        fast);
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.mode == CheckMode::fast);  // no direction disagreed, so no fallback was needed
}

BOOST_AUTO_TEST_CASE(tied_query_and_key_weights_sum_both_paths) {
    std::mt19937_64 rng(23);
    // W_Q and W_K are one leaf: its gradient is the Q path plus the K path, and the checker
    // confirms the sum and each branch on its own.
    const CheckReport report = check_gradients(
        [](auto in) {
            const auto [X, W_QK, W_V, W_O] = in;
            return probe(
                multihead_attention(X, MultiHeadWeights<typename decltype(X)::scalar_type>{W_QK, W_QK, W_V, W_O},
                                    heads_options(2))
                    .Y);
        },
        {{"X", random_tensor(Shape{2, 3, 4}, rng)},
         {"W_QK", random_tensor(Shape{4, 4}, rng)},
         {"W_V", random_tensor(Shape{4, 2}, rng)},
         {"W_O", random_tensor(Shape{2, 3}, rng)}});
    BOOST_TEST(report.passed, report.summary());
    std::size_t tied_branches = 0;
    for (const BranchReport& b : report.branches) tied_branches += b.leaf == "W_QK";
    BOOST_TEST(tied_branches == 2u);  // the Q projection and the K projection
}

BOOST_AUTO_TEST_CASE(padded_keys_are_never_attended_and_padded_rows_are_zero) {
    std::mt19937_64 rng(24);
    const std::size_t B = 2, T = 5, D = 4;
    const std::vector<std::size_t> lengths = {5, 3};
    const Tensor<double> x = random_tensor(Shape{B, T, D}, rng);
    Tensor<double> x_changed = x;  // padding of sequence 1 replaced by anything else
    for (std::size_t t = lengths[1]; t < T; ++t)
        for (std::size_t c = 0; c < D; ++c) x_changed.at({1, t, c}) = 100.0 + static_cast<double>(t * c);
    Tape<double> tape;
    const MultiHeadWeights<double> w{tape.leaf(random_tensor(Shape{D, D}, rng)), tape.leaf(random_tensor(Shape{D, D}, rng)),
                                     tape.leaf(random_tensor(Shape{D, D}, rng)), tape.leaf(random_tensor(Shape{D, 3}, rng))};
    for (const bool causal : {true, false}) {
        MultiHeadOptions options = heads_options(2, lengths);
        options.causal = causal;
        const auto r = multihead_attention(tape.leaf(x), w, options);
        const auto r2 = multihead_attention(tape.leaf(x_changed), w, options);
        for (std::size_t h = 0; h < 2; ++h)
            for (std::size_t i = 0; i < T; ++i)
                for (std::size_t j = lengths[1]; j < T; ++j) BOOST_TEST(r.A.value().at({1, h, i, j}) == 0.0);
        for (std::size_t t = 0; t < T; ++t)
            for (std::size_t c = 0; c < 3; ++c) {
                if (t < lengths[1]) {
                    BOOST_TEST(r.Y.value().at({1, t, c}) == r2.Y.value().at({1, t, c}));
                } else {
                    BOOST_TEST(r.Y.value().at({1, t, c}) == 0.0);  // a padded query row: defined as zero
                }
            }
    }
    BOOST_CHECK_THROW(multihead_attention(tape.leaf(x), w, heads_options(2, {5, 0})), value_error);
    BOOST_CHECK_THROW(multihead_attention(tape.leaf(x), w, heads_options(2, {5})), shape_error);
}

BOOST_AUTO_TEST_CASE(several_heads_in_blocks_equal_the_full_pass) {
    std::mt19937_64 rng(25);
    const std::size_t B = 2, T = 6, D = 8;
    const Tensor<double> x = random_tensor(Shape{B, T, D}, rng);
    Tape<double> tape;
    const MultiHeadWeights<double> w{tape.leaf(random_tensor(Shape{D, D}, rng)), tape.leaf(random_tensor(Shape{D, D}, rng)),
                                     tape.leaf(random_tensor(Shape{D, D}, rng)), tape.leaf(random_tensor(Shape{D, D}, rng))};
    const Tensor<double> full = multihead_attention(tape.leaf(x), w, heads_options(4)).Y.value();
    double worst = 0;
    for (const auto& [begin, end] : {std::pair<std::size_t, std::size_t>{0, 1}, {1, 4}, {4, 6}}) {
        MultiHeadOptions options = heads_options(4);
        options.query_offset = begin;
        const Tensor<double> block =
            multihead_attention(tape.leaf(time_slice(x, begin, end)), tape.leaf(time_slice(x, 0, end)), w, options)
                .Y.value();
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t t = begin; t < end; ++t)
                for (std::size_t c = 0; c < D; ++c)
                    worst = std::max(worst, std::abs(block.at({b, t - begin, c}) - full.at({b, t, c})));
    }
    BOOST_TEST(worst <= 1e-12);  // the same sums in (at most) another order
}

BOOST_AUTO_TEST_CASE(the_gradient_of_an_output_to_any_later_input_is_exactly_zero) {
    std::mt19937_64 rng(26);
    const std::size_t T = 5, D = 4, t = 1;
    Tape<double> tape;
    const Var<double> X = tape.leaf(random_tensor(Shape{1, T, D}, rng), "X");
    const MultiHeadWeights<double> w{tape.leaf(random_tensor(Shape{D, D}, rng)), tape.leaf(random_tensor(Shape{D, D}, rng)),
                                     tape.leaf(random_tensor(Shape{D, D}, rng)), tape.leaf(random_tensor(Shape{D, D}, rng))};
    const Var<double> Y = multihead_attention(X, w, heads_options(2)).Y;
    Tensor<double> G(Y.shape(), 0.0);
    for (std::size_t c = 0; c < D; ++c) G.at({0, t, c}) = 1.0 + static_cast<double>(c);
    tape.backward(Y, G);
    for (std::size_t j = t + 1; j < T; ++j)
        for (std::size_t c = 0; c < D; ++c) BOOST_TEST(X.grad().at({0, j, c}) == 0.0);
}

BOOST_AUTO_TEST_CASE(the_fused_switch_refuses_what_the_fused_kernel_cannot_do) {
    std::mt19937_64 rng(27);
    Tape<double> tape;
    const Var<double> X = tape.leaf(random_tensor(Shape{2, 3, 4}, rng));
    const MultiHeadWeights<double> w{tape.leaf(random_tensor(Shape{4, 4}, rng)), tape.leaf(random_tensor(Shape{4, 4}, rng)),
                                     tape.leaf(random_tensor(Shape{4, 4}, rng)), tape.leaf(random_tensor(Shape{4, 4}, rng))};
    MultiHeadOptions padded = heads_options(2, {3, 2});
    padded.kernel = AttentionKernel::fused;
    try {
        multihead_attention(X, w, padded);
        BOOST_FAIL("fused with padding did not throw");
    } catch (const usage_error& e) {
        BOOST_TEST(std::string(e.what()).find("padding") != std::string::npos, e.what());
    }
    std::mt19937_64 generator(1);
    MultiHeadOptions dropped = heads_options(2);
    dropped.kernel = AttentionKernel::fused;
    dropped.dropout = DropoutSettings{0.1, generator};
    try {
        multihead_attention(X, w, dropped);
        BOOST_FAIL("fused with dropout did not throw");
    } catch (const usage_error& e) {
        BOOST_TEST(std::string(e.what()).find("dropout") != std::string::npos, e.what());
    }
}

// The kernels by the names a command line gives (train_charlm --kernel, train_retrieval): each name
// gives its kernel back, and a near miss (another case, a prefix, a longer word, a trailing space,
// nothing) is refused with the word at fault.
BOOST_AUTO_TEST_CASE(a_kernel_is_named_composed_or_fused) {
    BOOST_TEST(attention_kernel_name(AttentionKernel::composed) == "composed");
    BOOST_TEST(attention_kernel_name(AttentionKernel::fused) == "fused");
    for (const AttentionKernel kernel : {AttentionKernel::composed, AttentionKernel::fused})
        BOOST_TEST((attention_kernel_from(attention_kernel_name(kernel)) == kernel));
    for (const std::string_view word : {"Fused", "fuse", "fusedd", "composed ", ""}) {
        BOOST_TEST(testing::message_of<usage_error>([word] { (void)attention_kernel_from(word); }) ==
                       fmt::format("attention kernel must be 'composed' or 'fused', not '{}'", word),
                   "'" << word << "'");
    }
}

BOOST_AUTO_TEST_CASE(the_whole_retrieval_model_passes_the_checker) {
    // Tiny configuration, full mode: every parameter, E used twice per position (key and value).
    RetrievalConfig config;
    config.keys = 3;
    config.values = 3;
    config.pairs = 2;
    config.width = 4;
    config.heads = 2;
    std::mt19937_64 data(30);
    const RetrievalBatch batch = make_retrieval_batch(config, 2, data);
    const RetrievalParameters p = RetrievalParameters::initial(config);
    const auto graph = [&](auto in) {
        const auto [E, P, W_Q, W_K, W_V, W_O, W_U] = in;
        using T = typename decltype(E)::scalar_type;
        return retrieval_loss(RetrievalVars<T>{E, P, W_Q, W_K, W_V, W_O, W_U}, batch, config.heads);
    };
    const CheckReport full = check_gradients(
        graph, {{"E", p.E}, {"P", p.P}, {"W_Q", p.W_Q}, {"W_K", p.W_K}, {"W_V", p.W_V}, {"W_O", p.W_O}, {"W_U", p.W_U}});
    BOOST_TEST(full.passed, full.summary());
    std::cout << "retrieval model full check: " << full.summary() << "\n";

    // The default configuration (D = 32, 4 heads, 13 positions), fast mode.
    const RetrievalConfig big;
    const RetrievalBatch big_batch = make_retrieval_batch(big, 3, data);
    const RetrievalParameters q = RetrievalParameters::initial(big);
    CheckOptions fast;
    fast.mode = CheckOptions::Mode::fast;
    // Branch attribution perturbs every coordinate (it is a full check per branch); the full
    // checks on small sizes above cover the branches, fast mode here covers the size.
    fast.check_branches = false;
    const CheckReport quick = check_gradients(
        [&](auto in) {
            const auto [E, P, W_Q, W_K, W_V, W_O, W_U] = in;
            using T = typename decltype(E)::scalar_type;
            return retrieval_loss(RetrievalVars<T>{E, P, W_Q, W_K, W_V, W_O, W_U}, big_batch, big.heads);
        },
        {{"E", q.E}, {"P", q.P}, {"W_Q", q.W_Q}, {"W_K", q.W_K}, {"W_V", q.W_V}, {"W_O", q.W_O}, {"W_U", q.W_U}},
        fast);
    BOOST_TEST(quick.passed, quick.summary());
    std::cout << "retrieval model (default size) fast check: " << quick.summary() << "\n";
}

// ---- Grouped-query attention, RoPE, ALiBi and sliding windows (composed kernel) ----

namespace {

// Multi-head attention written out loop by loop from its definition, independent of the ops:
// per head h (key/value head ⌊h/g⌋), query i at position p = i, scores q·k/√dh + b, the keys
// p − w < j ≤ p visible (all j ≤ p without a window), softmax, times V, merged, times W_O. No RoPE.
// `slopes` gives ALiBi's bias b = −m_h·(p − j) (empty: none).
Tensor<double> reference_attention(const Tensor<double>& X, const std::array<Tensor<double>, 4>& W, std::size_t H,
                                   std::size_t H_kv, std::size_t window, const std::vector<double>& slopes) {
    const std::size_t T = X.rows(), D = X.cols(), dh = W[0].cols() / H, g = H / H_kv;
    Tensor<double> merged(Shape{T, H * dh}, 0.0);
    for (std::size_t h = 0; h < H; ++h) {
        const std::size_t kv = h / g;
        const auto project = [&](const Tensor<double>& Wm, std::size_t head, std::size_t t, std::size_t c) {
            double s = 0;
            for (std::size_t e = 0; e < D; ++e) s += X(t, e) * Wm(e, head * dh + c);
            return s;
        };
        for (std::size_t i = 0; i < T; ++i) {
            std::vector<double> weights(T, 0.0);
            double largest = -1e300, total = 0;
            const auto visible = [&](std::size_t j) { return j <= i && (window == 0 || i - j < window); };
            for (std::size_t j = 0; j < T; ++j) {
                if (!visible(j)) continue;
                double s = 0;
                for (std::size_t c = 0; c < dh; ++c) s += project(W[0], h, i, c) * project(W[1], kv, j, c);
                weights[j] = s / std::sqrt(static_cast<double>(dh)) -
                             (slopes.empty() ? 0.0 : slopes[h] * static_cast<double>(i - j));
                largest = std::max(largest, weights[j]);
            }
            for (std::size_t j = 0; j < T; ++j) total += visible(j) ? std::exp(weights[j] - largest) : 0.0;
            for (std::size_t j = 0; j < T; ++j) {
                if (!visible(j)) continue;
                const double a = std::exp(weights[j] - largest) / total;
                for (std::size_t c = 0; c < dh; ++c) merged(i, h * dh + c) += a * project(W[2], kv, j, c);
            }
        }
    }
    Tensor<double> Y(Shape{T, W[3].cols()}, 0.0);
    for (std::size_t t = 0; t < T; ++t)
        for (std::size_t o = 0; o < W[3].cols(); ++o)
            for (std::size_t e = 0; e < H * dh; ++e) Y(t, o) += merged(t, e) * W[3](e, o);
    return Y;
}

double largest_difference(const Tensor<double>& a, const Tensor<double>& b) {
    double gap = 0;
    for (std::size_t k = 0; k < a.size(); ++k) gap = std::max(gap, std::abs(a[k] - b[k]));
    return gap;
}

}  // namespace

BOOST_AUTO_TEST_CASE(alibi_slopes_are_the_papers) {
    const std::vector<double> eight = alibi_slopes(8), six = alibi_slopes(6);
    for (std::size_t h = 0; h < 8; ++h) BOOST_TEST(eight[h] == std::exp2(-1.0 * static_cast<double>(h + 1)));
    // 6 heads: the 4 of 2^(−8h/4), then 2^(−1) and 2^(−3) of the 8-head series (BLOOM's rule).
    const std::vector<double> expected{0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125};
    BOOST_TEST(six == expected, boost::test_tools::per_element());
}

// The composed attention with grouped-query heads, ALiBi and a sliding window against the loop
// reference (1e-13: one computation in two summation orders), and controls: the reference with
// the slopes reversed or their sign flipped, or with the window one key wider or narrower,
// differs from it by far (the comparison can
// fail, and fails for the published mistakes).
BOOST_AUTO_TEST_CASE(grouped_query_alibi_and_a_window_match_their_definition) {
    std::mt19937_64 rng(77);
    const std::size_t T = 7, D = 8, H = 4, H_kv = 2, dh = 2, window = 3;
    const Tensor<double> x = random_tensor(Shape{T, D}, rng);
    const std::array<Tensor<double>, 4> W{random_tensor(Shape{D, H * dh}, rng), random_tensor(Shape{D, H_kv * dh}, rng),
                                          random_tensor(Shape{D, H_kv * dh}, rng), random_tensor(Shape{H * dh, D}, rng)};
    Tape<double> tape;
    const MultiHeadWeights<double> w{tape.leaf(W[0]), tape.leaf(W[1]), tape.leaf(W[2]), tape.leaf(W[3])};
    MultiHeadOptions options;
    options.heads = H, options.kv_heads = H_kv, options.window = window, options.alibi = true;
    const Tensor<double> ours = multihead_attention(tape.leaf(x), w, options).Y.value();
    std::vector<double> slopes = alibi_slopes(H);
    BOOST_TEST(largest_difference(ours, reference_attention(x, W, H, H_kv, window, slopes)) <= 1e-13);
    // The fused kernel's window and bias (ops/fused_attention.hpp) meet the same definition.
    options.kernel = AttentionKernel::fused;
    const Tensor<double> fused = multihead_attention(tape.leaf(x), w, options).Y.value();
    BOOST_TEST(largest_difference(fused, reference_attention(x, W, H, H_kv, window, slopes)) <= 1e-13);
    options.kernel = AttentionKernel::composed;
    std::vector<double> reversed(slopes.rbegin(), slopes.rend());
    BOOST_TEST(largest_difference(ours, reference_attention(x, W, H, H_kv, window, reversed)) > 1e-3);
    std::vector<double> flipped;  // the bias's sign flipped: +m·(p − j), farther keys weighing more
    for (const double m : slopes) flipped.push_back(-m);
    BOOST_TEST(largest_difference(ours, reference_attention(x, W, H, H_kv, window, flipped)) > 1e-3);
    BOOST_TEST(largest_difference(ours, reference_attention(x, W, H, H_kv, window + 1, slopes)) > 1e-3);
    BOOST_TEST(largest_difference(ours, reference_attention(x, W, H, H_kv, window - 1, slopes)) > 1e-3);
    // Without ALiBi, and with every key visible, it is the reference's plain GQA.
    options.alibi = false, options.window = 0;
    const Tensor<double> plain = multihead_attention(tape.leaf(x), w, options).Y.value();
    BOOST_TEST(largest_difference(plain, reference_attention(x, W, H, H_kv, 0, {})) <= 1e-13);
}

// The same attention (with RoPE too) through the 50-digit checker over X and the four weights.
BOOST_AUTO_TEST_CASE(grouped_query_rope_alibi_and_a_window_pass_the_full_check) {
    std::mt19937_64 rng(78);
    const std::size_t B = 2, T = 5, D = 8, H = 4, H_kv = 2, dh = 2;
    const NamedTensor leaves[] = {{"X", random_tensor(Shape{B, T, D}, rng)},
                                  {"W_Q", random_tensor(Shape{D, H * dh}, rng)},
                                  {"W_K", random_tensor(Shape{D, H_kv * dh}, rng)},
                                  {"W_V", random_tensor(Shape{D, H_kv * dh}, rng)},
                                  {"W_O", random_tensor(Shape{H * dh, D}, rng)}};
    for (const AttentionKernel kernel : {AttentionKernel::composed, AttentionKernel::fused}) {
        for (const bool alibi : {false, true}) {
            const CheckReport report = check_gradients(
                [alibi, kernel](auto in) {
                    MultiHeadOptions options;
                    options.heads = H, options.kv_heads = H_kv, options.window = 3, options.alibi = alibi;
                    options.rope = RopeSettings{.base = 100}, options.kernel = kernel;
                    return probe(multihead_attention(in[0], {in[1], in[2], in[3], in[4]}, options).Y);
                },
                leaves);
            BOOST_TEST(report.passed, report.summary());
            BOOST_TEST(report.max_error_mp <= 1e-25);
            BOOST_TEST_MESSAGE(attention_kernel_name(kernel)
                               << (alibi ? ", GQA + RoPE + ALiBi + window 3: " : ", GQA + RoPE + window 3: ")
                               << report.summary());
        }
    }
}

BOOST_AUTO_TEST_CASE(alibi_and_windows_refuse_what_they_cannot_do) {
    Tape<double> tape;
    std::mt19937_64 rng(79);
    const Var<double> X = tape.leaf(random_tensor(Shape{3, 4}, rng));
    const Var<double> W = tape.leaf(random_tensor(Shape{4, 4}, rng));
    MultiHeadOptions options;
    options.heads = 2, options.window = 2, options.causal = false;
    BOOST_TEST(testing::message_of<usage_error>([&] { (void)multihead_attention(X, {W, W, W, W}, options); })
                   .find("a sliding window (window 2) is causal") != std::string::npos);
    options.causal = true, options.kv_heads = 3;
    BOOST_TEST(testing::message_of<shape_error>([&] { (void)multihead_attention(X, {W, W, W, W}, options); })
                   .find("3 key/value heads do not divide 2 query heads") != std::string::npos);
    BOOST_TEST(testing::message_of<shape_error>([] { (void)alibi_slopes(0); }).find("heads must be at least 1") !=
               std::string::npos);
}

// The layer's shape refusals name the numbers at fault: W_O's rows against the merged heads' width
// (W_V's head width times the query heads, not the key/value heads), and padding lengths given for
// an X that is not a [B, T, D] batch, or one length short of its sequences.
BOOST_AUTO_TEST_CASE(shape_refusals_name_the_numbers_at_fault) {
    Tape<double> tape;
    std::mt19937_64 rng(83);
    const auto leaf = [&](Shape shape) { return tape.leaf(random_tensor(shape, rng)); };
    const Var<double> X = leaf(Shape{3, 4}), W = leaf(Shape{4, 4});
    MultiHeadOptions options;
    options.heads = 2;
    const std::string w_o = testing::message_of<shape_error>(
        [&] { (void)multihead_attention(X, {W, W, leaf(Shape{4, 6}), W}, options); });
    BOOST_TEST(w_o.find("W_O is " + Shape{4, 4}.to_string() + "; it needs 6 rows (the merged heads' width, W_V is " +
                        Shape{4, 6}.to_string() + ")") != std::string::npos,
               w_o);
    options.lengths = {1};
    const Var<double> single = leaf(Shape{1, 4});
    const std::string rank_two = testing::message_of<shape_error>(
        [&] { (void)multihead_attention(single, {W, W, W, W}, options); });
    BOOST_TEST(rank_two.find("1 sequence lengths for X_query " + Shape{1, 4}.to_string() +
                             "; give one length per sequence of a [B, T, D] batch") != std::string::npos,
               rank_two);
    const Var<double> batch = leaf(Shape{2, 3, 4});
    const std::string short_by_one = testing::message_of<shape_error>(
        [&] { (void)multihead_attention(batch, {W, W, W, W}, options); });
    BOOST_TEST(short_by_one.find("1 sequence lengths for X_query " + Shape{2, 3, 4}.to_string()) != std::string::npos,
               short_by_one);
}
