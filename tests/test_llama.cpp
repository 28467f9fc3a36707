// The LLaMA-style decoder (models/llama.hpp) through the 50-digit checker: small decoders over
// every parameter in full mode, with multi-query, grouped-query and multi-head attention, both RoPE
// pairings, tied and untied output, composed and fused kernels; generation through the key/value
// cache giving the full pass's logits at cache lengths 1, 17, 64 and 255 (and a control that the
// comparison sees a cache at the wrong positions); its argument checks; its initialisation.
#define BOOST_TEST_MODULE llama
#include "support.hpp"
#include "models/llama.hpp"

#include <iostream>

using namespace tapegrad;
using tapegrad::testing::random_tensor;

namespace {

// V = 7, D = 8, H = 4 (head width 2), H_kv = 2, L = 2, F = 6, context 6.
LlamaConfig small_config() {
    LlamaConfig c;
    c.vocabulary = 7, c.width = 8, c.heads = 4, c.kv_heads = 2, c.layers = 2, c.hidden = 6, c.context = 6;
    return c;
}

std::vector<std::size_t> random_tokens(std::size_t n, std::size_t vocabulary, std::uint64_t seed) {
    std::mt19937_64 generator(seed);
    std::vector<std::size_t> tokens(n);
    for (std::size_t& t : tokens) t = generator() % vocabulary;
    return tokens;
}

// Random parameters of the config's shapes (spread 0.5; gains around 1, away from it, so the
// gain's terms of every VJP are exercised).
std::vector<Tensor<double>> random_parameters(const LlamaConfig& c, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<Tensor<double>> values;
    const std::vector<std::string> names = parameter_names(c);
    const std::vector<Shape> shapes = parameter_shapes(c);
    for (std::size_t i = 0; i < names.size(); ++i) {
        Tensor<double> t = random_tensor(shapes[i], rng, 0.5);
        if (names[i].ends_with("gain"))
            for (double& x : t.data()) x += 1.0;
        values.push_back(std::move(t));
    }
    return values;
}

// The decoder's loss on 2 sequences of 5 tokens, recorded once and checked as recorded (re-run at
// 50 digits through the ops' siblings): the checker's full mode over every parameter.
CheckReport check_decoder(const LlamaConfig& c, std::uint64_t seed) {
    const std::size_t B = 2, T = 5;
    const std::vector<std::size_t> tokens = random_tokens(B * T, c.vocabulary, seed);
    const std::vector<std::size_t> targets = random_tokens(B * T, c.vocabulary, seed + 1);
    Tape<double> tape;
    const auto p = LlamaVars<double>::record(tape, random_parameters(c, seed + 2), c);
    const Var<double> J = llama_loss(p, c, std::span<const std::size_t>(tokens), std::span<const std::size_t>(targets), B);
    return check_gradients(tape, J);
}

// The largest |difference| between the logits of the token after a prompt of `cached` tokens,
// computed through the cache (the prompt in one call, then the token alone), and the same row of
// one full pass over prompt and token.
double cache_gap(const LlamaConfig& c, std::size_t cached, bool wrong_positions = false) {
    const std::size_t B = 2, T = cached + 1;
    const std::vector<std::size_t> tokens = random_tokens(B * T, c.vocabulary, 40 + cached);
    Tape<double> tape;
    const auto p = LlamaVars<double>::record(tape, random_parameters(c, 41), c);
    const Tensor<double> full = llama_logits(p, c, std::span<const std::size_t>(tokens), B).value();
    std::vector<std::size_t> prompt, next;
    for (std::size_t b = 0; b < B; ++b) {
        prompt.insert(prompt.end(), tokens.begin() + static_cast<std::ptrdiff_t>(b * T),
                      tokens.begin() + static_cast<std::ptrdiff_t>(b * T + cached));
        next.push_back(tokens[b * T + cached]);
    }
    LlamaCache<double> cache;
    (void)llama_logits(p, c, std::span<const std::size_t>(prompt), B, &cache);
    if (wrong_positions) cache = {};  // the token alone at position 0, seeing no history
    const Tensor<double> step = llama_logits(p, c, std::span<const std::size_t>(next), B, &cache).value();
    double gap = 0;
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t v = 0; v < c.vocabulary; ++v)
            gap = std::max(gap, std::abs(step.at({b, 0, v}) - full.at({b, cached, v})));
    return gap;
}

}  // namespace

BOOST_AUTO_TEST_CASE(small_decoders_pass_the_full_check_over_every_parameter) {
    struct Variant {
        std::string what;
        std::size_t kv_heads;
        RopePairing pairing;
        bool tied;
        AttentionKernel kernel;
    };
    const std::vector<Variant> variants = {
        {"grouped-query (4 heads over 2), interleaved, untied, composed", 2, RopePairing::interleaved, false,
         AttentionKernel::composed},
        {"multi-query (4 heads over 1), halves, tied, composed", 1, RopePairing::halves, true, AttentionKernel::composed},
        {"multi-head (4 over 4), interleaved, untied, fused", 4, RopePairing::interleaved, false, AttentionKernel::fused},
        {"grouped-query (4 heads over 2), halves, tied, fused", 2, RopePairing::halves, true, AttentionKernel::fused},
        {"grouped-query (4 heads over 2), ALiBi, window 3, untied, composed", 2, RopePairing::interleaved, false,
         AttentionKernel::composed},
        {"grouped-query (4 heads over 2), ALiBi, window 3, tied, fused", 2, RopePairing::interleaved, true,
         AttentionKernel::fused},
    };
    for (const Variant& v : variants) {
        LlamaConfig c = small_config();
        c.kv_heads = v.kv_heads, c.rope_pairing = v.pairing, c.tied = v.tied, c.kernel = v.kernel;
        if (v.what.find("ALiBi") != std::string::npos) c.alibi = true, c.window = 3;
        const CheckReport report = check_decoder(c, 60 + v.kv_heads);
        BOOST_TEST_CONTEXT(v.what) {
            BOOST_TEST_MESSAGE(v.what << ": " << report.summary());
            BOOST_TEST(report.passed, report.summary());
            BOOST_TEST(report.max_error_mp <= 1e-25);
            std::size_t entries = 0;
            for (const Shape& shape : parameter_shapes(c)) entries += shape.size();
            BOOST_TEST(report.coordinates == entries);  // every parameter entry
        }
    }
}

BOOST_AUTO_TEST_CASE(generating_through_the_cache_gives_the_full_pass_logits) {
    // The cache computes each position's keys and values once, from the same rows by the same
    // operations as the full pass; what differs is the order of sums over keys (a block's
    // products over S + 1 keys against the full pass's over T with the hidden ones weighted 0, and
    // the product kernels' blocking). Each such sum of n ≤ 256 terms moves by at most n·u·Σ|terms|
    // (u = 2^-53), about 3e-14 of logits of order 1-10 per reordered sum, through 2 blocks and the
    // output product a few of them: 1e-12 holds them with a margin, and a wrong cache misses by
    // far more (the control below).
    LlamaConfig c = small_config();
    c.context = 256;
    for (const AttentionKernel kernel : {AttentionKernel::composed, AttentionKernel::fused}) {
        c.kernel = kernel;
        for (const std::size_t cached : {1u, 17u, 64u, 255u}) {
            const double gap = cache_gap(c, cached);
            std::cout << fmt::format("cache ({} kernel) of {} positions: max |logit difference| {:.3g}\n",
                                     attention_kernel_name(kernel), cached, gap);
            BOOST_TEST(gap <= 1e-12, attention_kernel_name(kernel) << " kernel, " << cached << " cached");
        }
    }
    // ALiBi and a sliding window of 5 keys, on both kernels: the cache holds every position, the
    // mask (or the fused kernel's window) hides those out of the window.
    c.alibi = true, c.window = 5;
    for (const AttentionKernel kernel : {AttentionKernel::composed, AttentionKernel::fused}) {
        c.kernel = kernel;
        for (const std::size_t cached : {1u, 17u, 64u, 255u}) {
            const double gap = cache_gap(c, cached);
            std::cout << fmt::format("cache ({} kernel, ALiBi, window 5) of {} positions: max |logit difference| "
                                     "{:.3g}\n",
                                     attention_kernel_name(kernel), cached, gap);
            BOOST_TEST(gap <= 1e-12, attention_kernel_name(kernel) << " kernel, ALiBi, window 5, " << cached << " cached");
        }
    }
    c.kernel = AttentionKernel::composed, c.alibi = false, c.window = 0;
    // Control: the token alone at position 0 (a cache dropped) misses the full pass by far.
    BOOST_TEST(cache_gap(c, 17, true) > 1e-3);
}

BOOST_AUTO_TEST_CASE(the_decoder_refuses_bad_configs_tokens_and_caches) {
    LlamaConfig bad = small_config();
    bad.kv_heads = 3;
    BOOST_TEST(testing::message_of<value_error>([&] { (void)initial_parameters(bad); }).find("kv_heads dividing heads") !=
               std::string::npos);
    bad = small_config();
    bad.heads = 8;  // head width 1: RoPE needs an even one
    BOOST_TEST(testing::message_of<value_error>([&] { (void)initial_parameters(bad); }).find("even head width") !=
               std::string::npos);
    const LlamaConfig c = small_config();
    Tape<double> tape;
    const auto p = LlamaVars<double>::record(tape, random_parameters(c, 3), c);
    const std::vector<std::size_t> seven(7, 1), five(5, 1);
    BOOST_TEST(testing::message_of<shape_error>([&] { (void)llama_logits(p, c, std::span<const std::size_t>(seven), 1); })
                   .find("llama: positions 0..6 exceed the context of 6") != std::string::npos);
    BOOST_TEST(testing::message_of<shape_error>([&] { (void)llama_logits(p, c, std::span<const std::size_t>(five), 2); })
                   .find("5 tokens do not make 2 sequences") != std::string::npos);
    BOOST_TEST(testing::message_of<usage_error>([&] {
                   (void)LlamaVars<double>::record(tape, std::vector<Tensor<double>>(3), c);
               }).find("3 parameters given, the config needs 21") != std::string::npos);
    // A cache whose length is not the queries' first position is refused by the attention.
    KeyValueCache<double> cache;
    cache.length = 2;
    MultiHeadOptions options;
    options.heads = 4, options.kv_heads = 2;
    std::mt19937_64 rng(5);
    const Var<double> X = tape.leaf(random_tensor(Shape{1, 3, 8}, rng));
    BOOST_TEST(testing::message_of<usage_error>([&] { (void)multihead_attention(X, p.blocks[0].attention, options, &cache); })
                   .find("query_offset 0 but the key/value cache holds 2 positions") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(initialisation_is_gpt2s_with_unit_gains) {
    LlamaConfig c = small_config();
    const std::vector<Tensor<double>> values = initial_parameters(c);
    const std::vector<std::string> names = parameter_names(c);
    BOOST_TEST(values.size() == c.parameter_count());
    BOOST_TEST(names.back() == "W_out");
    for (std::size_t i = 0; i < names.size(); ++i) {
        if (names[i].ends_with("gain")) {
            for (const double x : values[i].data()) BOOST_TEST(x == 1.0);
            continue;
        }
        double squares = 0;
        for (const double x : values[i].data()) squares += x * x;
        const double spread = std::sqrt(squares / static_cast<double>(values[i].size()));
        const bool residual = names[i].ends_with("W_O") || names[i].ends_with("W_down");
        BOOST_TEST(spread < (residual ? 0.02 : 0.04), names[i]);  // N(0, 0.02²), N(0, (0.02/√(2L))²)
        BOOST_TEST(spread > (residual ? 0.003 : 0.01), names[i]);
    }
    c.tied = true;
    BOOST_TEST(parameter_names(c).back() == "norm_f.gain");
    BOOST_TEST(initial_parameters(c).size() == 20u);
}
