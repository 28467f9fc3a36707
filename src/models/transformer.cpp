/// \file
/// The compiled part of models/transformer.hpp: the configuration's check, the parameters' names,
/// shapes and GPT-2 initial values, and the check of a token block, kept out of the header so that a
/// program including the models does not compile them again.
#include "models/transformer.hpp"

#include <fmt/core.h>

namespace tapegrad {

void check_transformer_config(const TransformerConfig& c) {
    if (c.vocabulary < 2 || c.context == 0 || c.width == 0 || c.heads == 0 || c.width % c.heads != 0 || c.layers == 0 ||
        c.mlp_factor == 0) {
        throw value_error(
            fmt::format("transformer: bad config (vocabulary {}, context {}, width {}, heads {}, layers "
                        "{}, mlp_factor {}): need vocabulary >= 2, a width that is a positive multiple "
                        "of heads, and context, layers, mlp_factor >= 1",
                        c.vocabulary, c.context, c.width, c.heads, c.layers, c.mlp_factor));
    }
}

std::vector<std::string> parameter_names(const TransformerConfig& c) {
    std::vector<std::string> names = {"E", "P"};
    for (std::size_t l = 0; l < c.layers; ++l) {
        for (const char* part : {"ln1.gain", "ln1.bias", "attn.W_Q", "attn.W_K", "attn.W_V", "attn.W_O", "ln2.gain",
                                 "ln2.bias", "mlp.W_1", "mlp.b_1", "mlp.W_2", "mlp.b_2"}) {
            names.push_back(fmt::format("block{}.{}", l, part));
        }
    }
    names.push_back("ln_f.gain");
    names.push_back("ln_f.bias");
    return names;
}

std::vector<Shape> parameter_shapes(const TransformerConfig& c) {
    const std::size_t D = c.width, M = c.mlp_factor * c.width;
    std::vector<Shape> shapes = {Shape{c.vocabulary, D}, Shape{c.context, D}};
    for (std::size_t l = 0; l < c.layers; ++l) {
        for (const Shape& s : {Shape{D}, Shape{D}, Shape{D, D}, Shape{D, D}, Shape{D, D}, Shape{D, D}, Shape{D},
                               Shape{D}, Shape{D, M}, Shape{M}, Shape{M, D}, Shape{D}}) {
            shapes.push_back(s);
        }
    }
    shapes.push_back(Shape{D});
    shapes.push_back(Shape{D});
    return shapes;
}

namespace detail {

double draw_standard_normal(std::mt19937_64& generator) {
    const double u1 = (static_cast<double>(generator() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(generator() >> 11) * 0x1.0p-53;          // [0, 1)
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

InitialValue initial_value(const std::string& name) {
    if (name.ends_with("gain")) return InitialValue::one;
    if (name.ends_with("bias") || name.ends_with("b_1") || name.ends_with("b_2")) return InitialValue::zero;
    return InitialValue::normal;
}

std::vector<Tensor<double>> gpt2_initialisation(const std::vector<std::string>& names, const std::vector<Shape>& shapes,
                                                std::uint64_t seed, std::size_t layers,
                                                std::initializer_list<std::string_view> residual_outputs) {
    std::mt19937_64 generator(seed);
    const double residual_spread = 0.02 / std::sqrt(2.0 * static_cast<double>(layers));
    std::vector<Tensor<double>> values;
    for (std::size_t i = 0; i < names.size(); ++i) {
        const InitialValue kind = initial_value(names[i]);
        Tensor<double> t(shapes[i], kind == InitialValue::one ? 1.0 : 0.0);
        if (kind == InitialValue::normal) {
            const bool residual_output = std::any_of(residual_outputs.begin(), residual_outputs.end(),
                                                     [&](std::string_view end) { return names[i].ends_with(end); });
            const double spread = residual_output ? residual_spread : 0.02;
            for (double& x : t.data()) x = spread * draw_standard_normal(generator);
        }
        values.push_back(std::move(t));
    }
    return values;
}

void check_token_block(std::string_view model, std::size_t context, std::span<const std::size_t> tokens,
                       std::size_t batch, std::size_t first) {
    if (batch == 0 || tokens.empty() || tokens.size() % batch != 0) {
        throw shape_error(
            fmt::format("{}: {} tokens do not make {} sequences of one length", model, tokens.size(), batch));
    }
    if (first + tokens.size() / batch > context) {
        throw shape_error(fmt::format("{}: positions {}..{} exceed the context of {}", model, first,
                                      first + tokens.size() / batch - 1, context));
    }
}

}  // namespace detail

std::vector<Tensor<double>> initial_parameters(const TransformerConfig& c) {
    check_transformer_config(c);
    return detail::gpt2_initialisation(parameter_names(c), parameter_shapes(c), c.seed, c.layers, {"W_O", "W_2"});
}

}  // namespace tapegrad
