/// \file
/// The compiled part of models/llama.hpp: the configuration's check, the parameters' names, shapes
/// and initial values, and the attention options of a block, kept out of the header so that a
/// program including the models does not compile them again.
#include "models/llama.hpp"

#include <fmt/core.h>

namespace tapegrad {

void check_llama_config(const LlamaConfig& c) {
    const bool heads_fit = c.heads > 0 && c.width % c.heads == 0 && (c.width / c.heads) % 2 == 0 && c.kv_heads > 0 &&
                           c.heads % c.kv_heads == 0;
    if (c.vocabulary < 2 || c.context == 0 || c.layers == 0 || c.hidden == 0 || !heads_fit) {
        throw value_error(fmt::format(
            "llama: bad config (vocabulary {}, context {}, width {}, heads {}, kv_heads {}, layers {}, hidden {}): "
            "need vocabulary >= 2, context, layers, hidden >= 1, a width that is heads times an even head width, "
            "and kv_heads dividing heads",
            c.vocabulary, c.context, c.width, c.heads, c.kv_heads, c.layers, c.hidden));
    }
}

std::vector<std::string> parameter_names(const LlamaConfig& c) {
    std::vector<std::string> names = {"E"};
    for (std::size_t l = 0; l < c.layers; ++l) {
        for (const char* part : {"attn_norm.gain", "attn.W_Q", "attn.W_K", "attn.W_V", "attn.W_O", "mlp_norm.gain",
                                 "mlp.W_gate", "mlp.W_up", "mlp.W_down"}) {
            names.push_back(fmt::format("block{}.{}", l, part));
        }
    }
    names.push_back("norm_f.gain");
    if (!c.tied) names.push_back("W_out");
    return names;
}

std::vector<Shape> parameter_shapes(const LlamaConfig& c) {
    const std::size_t D = c.width, F = c.hidden, q = c.heads * c.head_width(), kv = c.kv_heads * c.head_width();
    std::vector<Shape> shapes = {Shape{c.vocabulary, D}};
    for (std::size_t l = 0; l < c.layers; ++l) {
        for (const Shape& s : {Shape{D}, Shape{D, q}, Shape{D, kv}, Shape{D, kv}, Shape{q, D}, Shape{D}, Shape{D, F},
                               Shape{D, F}, Shape{F, D}}) {
            shapes.push_back(s);
        }
    }
    shapes.push_back(Shape{D});
    if (!c.tied) shapes.push_back(Shape{D, c.vocabulary});
    return shapes;
}

std::vector<Tensor<double>> initial_parameters(const LlamaConfig& c) {
    check_llama_config(c);
    return detail::gpt2_initialisation(parameter_names(c), parameter_shapes(c), c.seed, c.layers, {"W_O", "W_down"});
}

namespace detail {

MultiHeadOptions llama_attention_options(const LlamaConfig& c, std::size_t first_position) {
    MultiHeadOptions options;
    options.heads = c.heads;
    options.kv_heads = c.kv_heads;
    options.query_offset = first_position;
    if (!c.alibi) options.rope = RopeSettings{.base = c.rope_base, .pairing = c.rope_pairing};
    options.alibi = c.alibi;
    options.window = c.window;
    options.kernel = c.kernel;
    return options;
}

}  // namespace detail

}  // namespace tapegrad
