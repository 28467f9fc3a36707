/// \file
/// The decoder's parameters (models/llama.hpp) under the names PyTorch users give them: Hugging
/// Face's LlamaForCausalLM state dict, in safetensors files (io/safetensors.hpp).
///   E                       model.embed_tokens.weight                    [V, D]       as is
///   block{l}.attn_norm.gain model.layers.{l}.input_layernorm.weight      [D]          as is
///   block{l}.attn.W_Q       model.layers.{l}.self_attn.q_proj.weight     [H·dh, D]    transposed
///   block{l}.attn.W_K, W_V  ...self_attn.k_proj.weight, v_proj.weight    [H_kv·dh, D] transposed
///   block{l}.attn.W_O       ...self_attn.o_proj.weight                   [D, H·dh]    transposed
///   block{l}.mlp_norm.gain  model.layers.{l}.post_attention_layernorm.weight [D]      as is
///   block{l}.mlp.W_gate, W_up  ...mlp.gate_proj.weight, up_proj.weight   [F, D]       transposed
///   block{l}.mlp.W_down     ...mlp.down_proj.weight                      [D, F]       transposed
///   norm_f.gain             model.norm.weight                            [D]          as is
///   W_out                   lm_head.weight                               [V, D]       transposed (untied only)
/// torch.nn.Linear stores its weight as [out, in] and computes x·Wᵀ; tapegrad's products are x·W,
/// hence the transpositions. Hugging Face's checkpoints rotate with rotate_half: load them into a
/// config with RopePairing::halves (Meta's original checkpoints pair interleaved).
#pragma once

#include "io/safetensors.hpp"
#include "models/llama.hpp"
#include "ops/transpose.hpp"

#include <fmt/core.h>

#include <map>
#include <string>
#include <vector>

namespace tapegrad {

namespace detail {

/// Hugging Face's name for each of parameter_names(c), and whether it is stored transposed.
inline std::vector<std::pair<std::string, bool>> hugging_face_names(const LlamaConfig& c) {
    std::vector<std::pair<std::string, bool>> names = {{"model.embed_tokens.weight", false}};
    for (std::size_t l = 0; l < c.layers; ++l) {
        const std::string layer = fmt::format("model.layers.{}.", l);
        for (const auto& [part, transposed] :
             {std::pair{"input_layernorm.weight", false}, std::pair{"self_attn.q_proj.weight", true},
              std::pair{"self_attn.k_proj.weight", true}, std::pair{"self_attn.v_proj.weight", true},
              std::pair{"self_attn.o_proj.weight", true}, std::pair{"post_attention_layernorm.weight", false},
              std::pair{"mlp.gate_proj.weight", true}, std::pair{"mlp.up_proj.weight", true},
              std::pair{"mlp.down_proj.weight", true}}) {
            names.emplace_back(layer + part, transposed);
        }
    }
    names.emplace_back("model.norm.weight", false);
    if (!c.tied) names.emplace_back("lm_head.weight", true);
    return names;
}

inline Tensor<double> transposed(const Tensor<double>& m) {
    Tensor<double> t(Shape{m.cols(), m.rows()});
    Transpose::copy_transposed(m.data().data(), m.rows(), m.cols(), t.data().data());
    return t;
}

}  // namespace detail

/// The parameters in parameter_names(c) order from a Hugging Face state dict's tensors: io_error
/// naming a tensor that is missing, one of the wrong shape, or one the decoder does not have.
inline std::vector<Tensor<double>> llama_parameters_from(std::span<const SafetensorsTensor> tensors,
                                                         const LlamaConfig& c) {
    check_llama_config(c);
    std::map<std::string, const Tensor<double>*> by_name;
    for (const SafetensorsTensor& t : tensors) by_name[t.name] = &t.value;
    const std::vector<Shape> shapes = parameter_shapes(c);
    const auto names = detail::hugging_face_names(c);
    std::vector<Tensor<double>> values;
    for (std::size_t i = 0; i < names.size(); ++i) {
        const auto& [name, transposed] = names[i];
        const auto found = by_name.find(name);
        if (found == by_name.end()) throw io_error(fmt::format("llama weights: no tensor '{}'", name));
        const Shape stored = transposed ? Shape{shapes[i].cols(), shapes[i].rows()} : shapes[i];
        if (!(found->second->shape() == stored)) {
            throw io_error(fmt::format("llama weights: '{}' is {}; the config needs {}", name,
                                       found->second->shape().to_string(), stored.to_string()));
        }
        values.push_back(transposed ? detail::transposed(*found->second) : *found->second);
        by_name.erase(found);
    }
    if (!by_name.empty()) {
        throw io_error(fmt::format("llama weights: tensor '{}' is not a parameter of this decoder",
                                   by_name.begin()->first));
    }
    return values;
}

/// The parameters under Hugging Face's names and layouts, to write with save_safetensors.
inline std::vector<SafetensorsTensor> llama_safetensors(std::span<const Tensor<double>> values, const LlamaConfig& c,
                                                        SafetensorsDtype dtype = SafetensorsDtype::float64) {
    const auto names = detail::hugging_face_names(c);
    if (values.size() != names.size()) {
        throw usage_error(fmt::format("llama weights: {} parameters given, the config needs {}", values.size(),
                                      names.size()));
    }
    std::vector<SafetensorsTensor> tensors;
    for (std::size_t i = 0; i < names.size(); ++i) {
        tensors.push_back({names[i].first, dtype, names[i].second ? detail::transposed(values[i]) : values[i]});
    }
    return tensors;
}

}  // namespace tapegrad
