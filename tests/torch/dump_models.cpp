// dump_models: the C++ half of the PyTorch cross-check (tests/torch/cross_check.py). For each
// case it runs a model on tapegrad's double tape from seeded inputs and writes, as .npy files in
// one directory per case, the inputs, the parameters, the forward outputs and the gradients, with
// a meta.json naming the model and its settings. The Python half recomputes every case with
// PyTorch's own modules and asserts agreement. The cases: multi-head attention (both kernels;
// causal with a query offset; padding; self- and cross-attention), the retrieval model (both
// kernels, and 20 Adam steps), one transformer block (both kernels, both GELU forms), the whole
// transformer's logits (both kernels), 20 steps of the char-LM's own training step
// (CharLmTrainer: AdamW, warm-up + cosine, clipping), and six AdamW steps of the LLaMA-style
// decoder (grouped-query, multi-query and multi-head; both RoPE pairings; tied and untied), whose
// final parameters are also written by the library as safetensors files under Hugging Face's
// names, final.<DTYPE>.safetensors for F64, F32, BF16 and F16 (llama_safetensors, save_safetensors),
// which the script compares byte for byte with the files Python writes from the same values.
//   usage: dump_models OUTPUT_DIR [--fault none|drop_mask|flip_scale|nudge_learning_rate|skip_clipping|
//                                          rope_other_pairing|gqa_without_group_sum|
//                                          rms_norm_without_gain|alibi_reversed|
//                                          weights_file_untransposed|weights_file_truncated]
//          dump_models OUTPUT_DIR --charlm-default STEPS   (only the example's default char-LM run)
//          dump_models LOGITS.npy --llama-logits WEIGHTS.safetensors TOKENS.npy V D H H_KV L F tied|untied PAIRING
//                                                ALIBI(0|1) WINDOW
//                                 (the decoder's logits from a weights file PyTorch's side wrote)
// The whole output is written under a temporary name and renamed into place at the end, so
// OUTPUT_DIR holds either a complete dump or nothing new.
// --fault is test-only: it perturbs what some cases compute (while their meta.json still states
// the unperturbed model) and marks those cases "fault_applied", so the cross-check's negative
// control can assert that exactly those cases are rejected:
//   drop_mask            attention computed without its causal or padding mask
//   flip_scale           scores scaled by √dh instead of 1/√dh (W_Q multiplied by dh on the tape)
//   nudge_learning_rate  training with a learning rate 1e-6 (relative) too high
//   skip_clipping        char-LM training without gradient clipping
//   rope_other_pairing   the decoder's RoPE pairing the other convention's features
//   gqa_without_group_sum  the decoder's dK, dV of each key/value head taken from one query head
//   rms_norm_without_gain  the decoder's rms_norm VJP without the gain in dX (llm.c #763): the
//                        recorded tape saved, its rms_norm nodes renamed to a registered variant
//                        op with that VJP, loaded and back-propagated (io/tape_file.hpp)
//   alibi_reversed       the ALiBi decoder's slopes reversed (head h given head H − 1 − h's slope):
//                        run on weights whose heads are in reverse order, gradients put back
//                        of its group instead of summed over the group
//   weights_file_untransposed  the decoder's weights files with each transposed parameter's data
//                        left in tapegrad's [in, out] order under Hugging Face's [out, in] shape
//                        (the classic missing transpose, invisible to a check of shapes alone)
//   weights_file_truncated  the decoder's F32, BF16 and F16 files rounded toward zero instead of
//                        to nearest (the values truncated here, in the test; the library's
//                        writer then stores them exactly)
#include "models/charlm.hpp"
#include "models/llama.hpp"
#include "models/llama_weights.hpp"
#include "models/retrieval.hpp"
#include "autodiff/low_precision.hpp"
#include "io/npy.hpp"
#include "io/safetensors.hpp"
#include "tapegrad.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using namespace tapegrad;

enum class Fault { none, drop_mask, flip_scale, nudge_learning_rate, skip_clipping, rope_other_pairing,
                   gqa_without_group_sum, rms_norm_without_gain, alibi_reversed, weights_file_untransposed,
                   weights_file_truncated };

const std::map<std::string, Fault> fault_names{{"none", Fault::none},
                                               {"drop_mask", Fault::drop_mask},
                                               {"flip_scale", Fault::flip_scale},
                                               {"nudge_learning_rate", Fault::nudge_learning_rate},
                                               {"skip_clipping", Fault::skip_clipping},
                                               {"rope_other_pairing", Fault::rope_other_pairing},
                                               {"gqa_without_group_sum", Fault::gqa_without_group_sum},
                                               {"rms_norm_without_gain", Fault::rms_norm_without_gain},
                                               {"alibi_reversed", Fault::alibi_reversed},
                                               {"weights_file_untransposed", Fault::weights_file_untransposed},
                                               {"weights_file_truncated", Fault::weights_file_truncated}};

// One case's output: its .npy files (name -> tensor), its safetensors files (file name -> the
// tensors the library writes into it) and the JSON members describing its model.
struct Dump {
    std::vector<std::pair<std::string, Tensor<double>>> files;
    std::vector<std::pair<std::string, std::vector<SafetensorsTensor>>> safetensors_files;
    std::vector<std::string> meta;  // `"key": value` members of meta.json
    bool fault_applied = false;

    void add(std::string name, Tensor<double> tensor) { files.emplace_back(std::move(name), std::move(tensor)); }
    void add_safetensors(std::string file_name, std::vector<SafetensorsTensor> tensors) {
        safetensors_files.emplace_back(std::move(file_name), std::move(tensors));
    }
    void describe(std::string_view key, std::string_view json_value) {
        meta.push_back(fmt::format("\"{}\": {}", key, json_value));
    }
};

Tensor<double> uniform(const Shape& shape, double a, std::mt19937_64& generator) {
    Tensor<double> t(shape);
    for (double& x : t.data()) x = draw_uniform(generator, a);
    return t;
}

// Integer lists travel as float64 arrays (exact below 2^53), shaped [rows, n / rows].
Tensor<double> indices_tensor(std::span<const std::size_t> indices, std::size_t rows) {
    Tensor<double> t(rows == 1 ? Shape{indices.size()} : Shape{rows, indices.size() / rows});
    for (std::size_t k = 0; k < indices.size(); ++k) t[k] = static_cast<double>(indices[k]);
    return t;
}

std::string kernel_name(AttentionKernel kernel) { return kernel == AttentionKernel::fused ? "\"fused\"" : "\"composed\""; }

// ---- Multi-head attention ---------------------------------------------------------------------

struct MultiHeadCase {
    std::string name;
    std::size_t B, Tq, Tk, D, heads;
    bool self_attention;  // X_q and X_kv are one leaf (then Tq = Tk and the offset is 0)
    bool causal;
    std::size_t query_offset;
    std::vector<std::size_t> lengths;  // empty: no padding
    AttentionKernel kernel;
};

Dump multihead_case(const MultiHeadCase& c, Fault fault, std::uint64_t seed) {
    std::mt19937_64 generator(seed);
    const double projection = std::sqrt(3.0 / static_cast<double>(c.D));
    const Tensor<double> X_kv = uniform(Shape{c.B, c.Tk, c.D}, 1.0, generator);
    const Tensor<double> X_q = c.self_attention ? X_kv : uniform(Shape{c.B, c.Tq, c.D}, 1.0, generator);
    const Tensor<double> W_Q = uniform(Shape{c.D, c.D}, projection, generator),
                         W_K = uniform(Shape{c.D, c.D}, projection, generator),
                         W_V = uniform(Shape{c.D, c.D}, projection, generator),
                         W_O = uniform(Shape{c.D, c.D}, projection, generator);
    const Tensor<double> G = uniform(Shape{c.B, c.Tq, c.D}, 1.0, generator);  // upstream dJ/dY

    Tape<double> tape;
    const Var<double> Xkv = tape.leaf(X_kv, "X_kv");
    const Var<double> Xq = c.self_attention ? Xkv : tape.leaf(X_q, "X_q");
    const MultiHeadWeights<double> w{tape.leaf(W_Q, "W_Q"), tape.leaf(W_K, "W_K"), tape.leaf(W_V, "W_V"),
                                     tape.leaf(W_O, "W_O")};
    MultiHeadOptions options{.heads = c.heads, .causal = c.causal, .query_offset = c.query_offset,
                             .lengths = c.lengths, .dropout = std::nullopt, .kernel = c.kernel};
    Dump dump;
    MultiHeadWeights<double> used = w;
    if (fault == Fault::drop_mask && (c.causal || !c.lengths.empty())) {
        options.causal = false;
        options.lengths.clear();
        dump.fault_applied = true;
    }
    if (fault == Fault::flip_scale) {
        used.W_Q = scale(w.W_Q, static_cast<double>(c.D / c.heads));  // Q·Kᵀ·dh/√dh = Q·Kᵀ·√dh
        dump.fault_applied = true;
    }
    const MultiHeadResult<double> r = multihead_attention(Xq, Xkv, used, options);
    tape.backward(r.Y, G);

    dump.describe("model", "\"multihead\"");
    dump.describe("heads", fmt::format("{}", c.heads));
    dump.describe("self_attention", c.self_attention ? "true" : "false");
    dump.describe("causal", c.causal ? "true" : "false");
    dump.describe("query_offset", fmt::format("{}", c.query_offset));
    dump.describe("lengths", fmt::format("[{}]", fmt::join(c.lengths, ", ")));
    dump.describe("kernel", kernel_name(c.kernel));
    if (c.self_attention) {
        dump.add("X", X_kv);
        dump.add("dX", Xkv.grad());
    } else {
        dump.add("X_q", X_q);
        dump.add("X_kv", X_kv);
        dump.add("dX_q", Xq.grad());
        dump.add("dX_kv", Xkv.grad());
    }
    for (const auto& [name, W] : {std::pair{"W_Q", w.W_Q}, std::pair{"W_K", w.W_K}, std::pair{"W_V", w.W_V},
                                  std::pair{"W_O", w.W_O}}) {
        dump.add(name, W.value());
        dump.add(fmt::format("d{}", name), W.grad());
    }
    dump.add("G", G);
    dump.add("Y", r.Y.value());
    if (c.kernel == AttentionKernel::composed) dump.add("A", r.A.value());
    return dump;
}

// ---- The retrieval model (models/retrieval.hpp) ------------------------------------------------

// Small enough to keep the dump quick, large enough for two heads and several stored pairs.
RetrievalConfig small_retrieval(AttentionKernel kernel) {
    return RetrievalConfig{.keys = 8, .values = 6, .pairs = 5, .width = 8, .heads = 2, .seed = 7, .kernel = kernel};
}

void describe_retrieval(Dump& dump, const RetrievalConfig& config) {
    dump.describe("heads", fmt::format("{}", config.heads));
    dump.describe("keys", fmt::format("{}", config.keys));
    dump.describe("values", fmt::format("{}", config.values));
    dump.describe("kernel", kernel_name(config.kernel));
}

void add_batch(Dump& dump, const RetrievalBatch& batch, std::string_view suffix = "") {
    dump.add(fmt::format("key_tokens{}", suffix), indices_tensor(batch.key_tokens, batch.size));
    dump.add(fmt::format("value_tokens{}", suffix), indices_tensor(batch.value_tokens, batch.size));
    dump.add(fmt::format("targets{}", suffix), indices_tensor(batch.targets, 1));
}

constexpr std::array<std::string_view, 7> retrieval_names{"E", "P", "W_Q", "W_K", "W_V", "W_O", "W_U"};

Dump retrieval_case(AttentionKernel kernel, Fault fault) {
    const RetrievalConfig config = small_retrieval(kernel);
    RetrievalParameters parameters = RetrievalParameters::initial(config);
    std::mt19937_64 data(41);
    const RetrievalBatch batch = make_retrieval_batch(config, 4, data);

    Tape<double> tape;
    RetrievalVars<double> vars{tape.leaf(parameters.E, "E"),     tape.leaf(parameters.P, "P"),
                               tape.leaf(parameters.W_Q, "W_Q"), tape.leaf(parameters.W_K, "W_K"),
                               tape.leaf(parameters.W_V, "W_V"), tape.leaf(parameters.W_O, "W_O"),
                               tape.leaf(parameters.W_U, "W_U")};
    const std::array<Var<double>, 7> leaves{vars.E, vars.P, vars.W_Q, vars.W_K, vars.W_V, vars.W_O, vars.W_U};
    Dump dump;
    if (fault == Fault::flip_scale) {
        vars.W_Q = scale(vars.W_Q, static_cast<double>(config.width / config.heads));
        dump.fault_applied = true;
    }
    // The causal mask cannot matter here: the loss reads only the last position, which sees
    // every key either way. drop_mask leaves this case alone.
    const Var<double> logits = retrieval_logits(vars, batch, config.heads, config.kernel);
    const Var<double> J = cross_entropy(logits, std::span<const std::size_t>(batch.targets));
    tape.backward(J);

    dump.describe("model", "\"retrieval\"");
    describe_retrieval(dump, config);
    add_batch(dump, batch);
    for (std::size_t i = 0; i < leaves.size(); ++i) {
        dump.add(std::string(retrieval_names[i]), leaves[i].value());
        dump.add(fmt::format("d{}", retrieval_names[i]), leaves[i].grad());
    }
    dump.add("logits", logits.value());
    dump.add("loss", J.value());
    return dump;
}

// Adam training of the retrieval model: the batches, the loss before each step, the initial and
// the final parameters.
Dump retrieval_training_case(Fault fault) {
    constexpr std::size_t steps = 20, batch_size = 8;
    const RetrievalConfig config = small_retrieval(AttentionKernel::composed);
    AdamSettings settings{.learning_rate = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .epsilon = 1e-8};
    Dump dump;
    dump.describe("model", "\"retrieval_training\"");
    describe_retrieval(dump, config);
    dump.describe("steps", fmt::format("{}", steps));
    dump.describe("adam", fmt::format("{{\"learning_rate\": {}, \"beta1\": {}, \"beta2\": {}, \"epsilon\": {}}}",
                                      settings.learning_rate, settings.beta1, settings.beta2, settings.epsilon));
    if (fault == Fault::nudge_learning_rate) {
        settings.learning_rate *= 1 + 1e-6;
        dump.fault_applied = true;
    }
    RetrievalTrainer trainer(config, settings);
    RetrievalParameters initial = trainer.parameters();
    for (std::size_t i = 0; i < retrieval_names.size(); ++i) {
        dump.add(fmt::format("initial_{}", retrieval_names[i]), *initial.all()[i]);
    }
    std::mt19937_64 data(2026);
    Tensor<double> losses(Shape{steps});
    for (std::size_t step = 0; step < steps; ++step) {
        const RetrievalBatch batch = make_retrieval_batch(config, batch_size, data);
        add_batch(dump, batch, fmt::format("_{}", step));
        losses[step] = trainer.step(batch);
    }
    dump.add("losses", losses);
    RetrievalParameters final_parameters = trainer.parameters();
    for (std::size_t i = 0; i < retrieval_names.size(); ++i) {
        dump.add(fmt::format("final_{}", retrieval_names[i]), *final_parameters.all()[i]);
    }
    return dump;
}

// ---- The transformer (models/transformer.hpp) and the char-LM (models/charlm.hpp) -----------------

std::string gelu_name(GeluForm form) { return form == GeluForm::tanh ? "\"tanh\"" : "\"erf\""; }

void describe_transformer(Dump& dump, const TransformerConfig& c) {
    dump.describe("layers", fmt::format("{}", c.layers));
    dump.describe("width", fmt::format("{}", c.width));
    dump.describe("heads", fmt::format("{}", c.heads));
    dump.describe("context", fmt::format("{}", c.context));
    dump.describe("vocabulary", fmt::format("{}", c.vocabulary));
    dump.describe("gelu", gelu_name(c.gelu));
    dump.describe("layer_norm_epsilon", fmt::format("{}", c.layer_norm.epsilon));
    dump.describe("kernel", kernel_name(c.kernel));
    dump.describe("parameter_names", fmt::format("[\"{}\"]", fmt::join(parameter_names(c), "\", \"")));
}

// Parameters drawn away from GPT-2's start (gains 1, biases 0, small matrices), so every term of
// the block (gain, bias, the MLP's curvature) is exercised at generic values.
std::vector<Tensor<double>> generic_parameters(const TransformerConfig& c, std::mt19937_64& generator) {
    const std::vector<std::string> names = parameter_names(c);
    const std::vector<Shape> shapes = parameter_shapes(c);
    std::vector<Tensor<double>> values;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
        // Matrices keep their input's variance; gains lie in [0.5, 1.5), biases in [−0.5, 0.5).
        const double spread = shapes[i].rank() == 2 ? std::sqrt(3.0 / static_cast<double>(shapes[i][0])) : 0.5;
        Tensor<double> t = uniform(shapes[i], spread, generator);
        if (names[i].ends_with("gain")) {
            for (double& x : t.data()) x += 1.0;
        }
        values.push_back(std::move(t));
    }
    return values;
}

// One pre-norm block on its own: Y = block(X), upstream G, gradients of X and of the block's 12
// parameters (block 0 of a one-layer model).
Dump transformer_block_case(AttentionKernel kernel, GeluForm gelu, Fault fault, std::uint64_t seed) {
    TransformerConfig c{.vocabulary = 5, .context = 6, .width = 8, .heads = 2, .layers = 1};
    c.gelu = gelu;
    c.kernel = kernel;
    std::mt19937_64 generator(seed);
    const std::vector<Tensor<double>> values = generic_parameters(c, generator);
    const std::size_t B = 2, T = 6;
    const Tensor<double> X0 = uniform(Shape{B, T, c.width}, 1.0, generator);
    const Tensor<double> G = uniform(Shape{B, T, c.width}, 1.0, generator);

    Tape<double> tape;
    const TransformerVars<double> vars = TransformerVars<double>::record(tape, values, c);
    const Var<double> X = tape.leaf(X0, "X");
    Dump dump;
    BlockVars<double> block = vars.blocks[0];
    if (fault == Fault::flip_scale) {
        block.attention.W_Q = scale(block.attention.W_Q, static_cast<double>(c.width / c.heads));
        dump.fault_applied = true;
    }
    const Var<double> Y = detail::transformer_block(X, block, c, TransformerRun<double>{}, 0, 0);
    tape.backward(Y, G);

    dump.describe("model", "\"transformer_block\"");
    describe_transformer(dump, c);
    const std::vector<std::string> names = parameter_names(c);
    const std::vector<Var<double>> leaves = vars.all();
    for (std::size_t i = 2; i < 14; ++i) {  // the block's own parameters
        dump.add(names[i], leaves[i].value());
        dump.add("d" + names[i], leaves[i].grad());
    }
    dump.add("X", X0);
    dump.add("G", G);
    dump.add("Y", Y.value());
    dump.add("dX", X.grad());
    return dump;
}

// The whole model: logits for B sequences, upstream G on the logits, every parameter's gradient
// (the tied E sums its embedding and output branches).
Dump transformer_logits_case(AttentionKernel kernel, Fault fault, std::uint64_t seed) {
    TransformerConfig c{.vocabulary = 12, .context = 8, .width = 16, .heads = 2, .layers = 2};
    c.kernel = kernel;
    std::mt19937_64 generator(seed);
    const std::vector<Tensor<double>> values = generic_parameters(c, generator);
    const std::size_t B = 3, T = 7;  // T < context: positions 0..6 of 8
    std::vector<std::size_t> tokens(B * T);
    for (std::size_t& t : tokens) t = draw_below(generator, c.vocabulary);
    const Tensor<double> G = uniform(Shape{B, T, c.vocabulary}, 1.0, generator);

    Tape<double> tape;
    TransformerVars<double> vars = TransformerVars<double>::record(tape, values, c);
    const std::vector<Var<double>> leaves = vars.all();
    Dump dump;
    if (fault == Fault::flip_scale) {
        for (BlockVars<double>& b : vars.blocks) {
            b.attention.W_Q = scale(b.attention.W_Q, static_cast<double>(c.width / c.heads));
        }
        dump.fault_applied = true;
    }
    const Var<double> logits = transformer_logits(vars, c, std::span<const std::size_t>(tokens), B);
    tape.backward(logits, G);

    dump.describe("model", "\"transformer_logits\"");
    describe_transformer(dump, c);
    const std::vector<std::string> names = parameter_names(c);
    for (std::size_t i = 0; i < names.size(); ++i) {
        dump.add(names[i], leaves[i].value());
        dump.add("d" + names[i], leaves[i].grad());
    }
    dump.add("tokens", indices_tensor(tokens, B));
    dump.add("G", G);
    dump.add("logits", logits.value());
    return dump;
}

// `steps` steps of CharLmTrainer (the example's own step: the batch of the step number, forward,
// backward, global-norm clipping, the warm-up + cosine rate, AdamW) from its initial parameters:
// the settings, the batches ([steps, B, T]), the loss, rate and gradient norm of each step, and
// the initial and final parameters. `nominal` is what meta.json states; `actual` what runs (they
// differ only under a fault).
void dump_charlm_run(Dump& dump, CharLmTrainer& trainer, const Corpus& corpus, const CharLmSettings& nominal,
                     const CharLmSettings& actual, std::size_t steps) {
    const AdamSettings adam = nominal.adam();
    dump.describe("steps", fmt::format("{}", steps));
    dump.describe("batch", fmt::format("{}", nominal.batch));
    dump.describe("optimizer",
                  fmt::format("{{\"peak_rate\": {}, \"warmup\": {}, \"schedule_steps\": {}, \"floor_ratio\": {}, "
                              "\"beta1\": {}, \"beta2\": {}, \"epsilon\": {}, \"weight_decay\": {}, \"clip_norm\": {}}}",
                              nominal.peak_rate, nominal.warmup, nominal.steps, nominal.floor_ratio, adam.beta1,
                              adam.beta2, adam.epsilon, adam.weight_decay, nominal.clip_norm));
    describe_transformer(dump, trainer.config());
    const std::vector<std::string> names = parameter_names(trainer.config());
    for (std::size_t i = 0; i < names.size(); ++i) dump.add("initial." + names[i], trainer.parameters()[i]);
    Tensor<double> losses(Shape{steps}), norms(Shape{steps}), rates(Shape{steps});
    Tensor<double> tokens(Shape{steps, actual.batch, actual.context}), targets(tokens.shape());
    const std::size_t per_step = actual.batch * actual.context;
    for (std::size_t step = 0; step < steps; ++step) {
        const CharBatch batch = training_batch(corpus, actual, step);  // the batch trainer.step() draws
        for (std::size_t k = 0; k < per_step; ++k) {
            tokens[step * per_step + k] = static_cast<double>(batch.tokens[k]);
            targets[step * per_step + k] = static_cast<double>(batch.targets[k]);
        }
        rates[step] = actual.schedule().rate(step);
        losses[step] = trainer.step();
        norms[step] = trainer.last_gradient_norm();
    }
    dump.add("tokens", tokens);
    dump.add("targets", targets);
    dump.add("losses", losses);
    dump.add("gradient_norms", norms);
    dump.add("learning_rates", rates);
    for (std::size_t i = 0; i < names.size(); ++i) dump.add("final." + names[i], trainer.parameters()[i]);
}

// A short text for the char-LM training case (public domain: the opening of Jane Austen's
// Pride and Prejudice, 1813).
constexpr std::string_view training_text =
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
    "want of a wife.\nHowever little known the feelings or views of such a man may be on his first entering a "
    "neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is "
    "considered the rightful property of some one or other of their daughters.\n";

// 20 steps of a small char-LM, with a schedule short enough that they cover the warm-up, the
// cosine and the floor.
Dump charlm_training_case(const fs::path& scratch, Fault fault) {
    // The schedule's S = 15 and W = 5: warm-up to step 5, cosine to step 15, the floor after it.
    // clip_norm lies between the steps' gradient norms (0.5 to 1.6), so clipping acts in some
    // steps and not in others (the script requires both).
    const CharLmSettings nominal{.layers = 2, .width = 16, .heads = 2, .context = 8, .batch = 4, .steps = 15,
                                 .warmup = 5, .peak_rate = 1e-2, .weight_decay = 0.1, .clip_norm = 0.9, .seed = 3};
    CharLmSettings actual = nominal;
    Dump dump;
    dump.describe("model", "\"charlm_training\"");
    if (fault == Fault::nudge_learning_rate) {
        actual.peak_rate *= 1 + 1e-6;
        dump.fault_applied = true;
    }
    if (fault == Fault::skip_clipping) {
        actual.clip_norm = 1e9;
        dump.fault_applied = true;
    }
    const fs::path text_file = scratch / "charlm_text.txt";
    std::ofstream(text_file) << training_text;
    const Corpus corpus = load_corpus({text_file});
    CharLmTrainer trainer(actual, corpus);
    dump_charlm_run(dump, trainer, corpus, nominal, actual, 20);
    return dump;
}

// The example's default model and schedule on the fortunes corpus, trained for `steps` steps (not
// part of CTest: minutes of training on each side), with the validation windows and tapegrad's
// mean validation loss over all of them, for the comparison of validation bits per character.
Dump charlm_default_case(std::size_t steps) {
    const CharLmSettings settings{};
    const Corpus corpus = load_corpus(default_corpus_files());
    CharLmTrainer trainer(settings, corpus);
    Dump dump;
    dump.describe("model", "\"charlm_default\"");
    dump_charlm_run(dump, trainer, corpus, settings, settings, steps);
    const std::size_t T = settings.context, windows = (corpus.validation.size() - 1) / T;
    std::vector<std::size_t> starts(windows);
    for (std::size_t w = 0; w < windows; ++w) starts[w] = w * T;  // validation_loss()'s windows, all of them
    const CharBatch validation = windows_at(corpus.validation, starts, T);
    dump.add("validation_tokens", indices_tensor(validation.tokens, windows));
    dump.add("validation_targets", indices_tensor(validation.targets, windows));
    dump.add("validation_loss", Tensor<double>::scalar(trainer.validation_loss()));
    return dump;
}

// ---- The LLaMA-style decoder (models/llama.hpp) ---------------------------------------------------

void describe_llama(Dump& dump, const LlamaConfig& c) {
    dump.describe("layers", fmt::format("{}", c.layers));
    dump.describe("width", fmt::format("{}", c.width));
    dump.describe("heads", fmt::format("{}", c.heads));
    dump.describe("kv_heads", fmt::format("{}", c.kv_heads));
    dump.describe("hidden", fmt::format("{}", c.hidden));
    dump.describe("vocabulary", fmt::format("{}", c.vocabulary));
    dump.describe("tied", c.tied ? "true" : "false");
    dump.describe("rms_epsilon", fmt::format("{}", c.rms_norm.epsilon));
    dump.describe("rope_base", fmt::format("{}", c.rope_base));
    dump.describe("rope_pairing", fmt::format("\"{}\"", rope_pairing_names[std::size_t(c.rope_pairing)]));
    dump.describe("alibi", c.alibi ? "true" : "false");
    dump.describe("window", fmt::format("{}", c.window));
    dump.describe("parameter_names", fmt::format("[\"{}\"]", fmt::join(parameter_names(c), "\", \"")));
}

// W [D × H_kv·dh] widened to [D × H·dh]: query head h's columns are key/value head ⌊h/g⌋'s.
Tensor<double> widen_heads(const Tensor<double>& W, std::size_t groups, std::size_t dh) {
    const std::size_t D = W.rows(), kv = W.cols() / dh;
    Tensor<double> wide(Shape{D, kv * groups * dh});
    for (std::size_t i = 0; i < D; ++i)
        for (std::size_t h = 0; h < kv * groups; ++h)
            for (std::size_t c = 0; c < dh; ++c) wide(i, h * dh + c) = W(i, (h / groups) * dh + c);
    return wide;
}

// The gradient of a widened W back at [D × H_kv·dh], from the first query head of each group only.
Tensor<double> first_of_each_group(const Tensor<double>& wide, std::size_t groups, std::size_t dh) {
    const std::size_t D = wide.rows(), kv = wide.cols() / dh / groups;
    Tensor<double> narrow(Shape{D, kv * dh});
    for (std::size_t i = 0; i < D; ++i)
        for (std::size_t k = 0; k < kv; ++k)
            for (std::size_t c = 0; c < dh; ++c) narrow(i, k * dh + c) = wide(i, k * groups * dh + c);
    return narrow;
}

// rms_norm with llm.c #763's VJP: dX = r·(G − x̂·mean(G∘x̂)), the gain dropped (dg exact). A
// user's op (registered below), so a saved tape's rms_norm nodes can be loaded as it.
struct RmsNormWithoutGain : RmsNorm {
    static constexpr std::string_view name = "rms_norm_without_gain";
    template <Scalar T>
    static Var<T> record(const Settings<T>& s, std::span<const Var<T>> in) {
        return in[0].tape().template record<RmsNormWithoutGain>({in[0], in[1]}, s);
    }
    template <Scalar T>
    static void vjp(const Settings<T>& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& din) {
        if (which != 0) return RmsNorm::vjp(s, at, which, din);
        const Tensor<T>& X = *at.in[0];
        const std::size_t D = X.cols(), N = X.size() / D;
        for (std::size_t n = 0; n < N; ++n) {
            T mean(0);
            for (std::size_t j = 0; j < D; ++j) mean += at.G[n * D + j] * T(X[n * D + j] * at.saved[n]);
            mean /= T(D);
            for (std::size_t j = 0; j < D; ++j)
                din[n * D + j] = at.saved[n] * (at.G[n * D + j] - T(X[n * D + j] * at.saved[n]) * mean);
        }
    }
};
const bool rms_norm_without_gain_registered = register_op<RmsNormWithoutGain>();

// The gradients of `J` on `tape` with every rms_norm node run as RmsNormWithoutGain: the tape saved,
// its rms_norm ops renamed in the file, loaded and back-propagated; the leaves' gradients by name.
std::vector<Tensor<double>> gradients_with_gain_dropped(const Tape<double>& tape, const Var<double>& J,
                                                        const std::vector<std::string>& names) {
    std::string text = tape_file_text(tape, J);
    const std::string from = "\"rms_norm\"", to = fmt::format("\"user:{}\"", RmsNormWithoutGain::name);
    std::size_t renamed = 0;
    for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()), ++renamed)
        text.replace(at, from.size(), to);
    if (renamed == 0) throw usage_error("dump_models: the decoder's tape holds no rms_norm node to rename");
    Tape<double> loaded;
    const Var<double> J_loaded = parse_tape(text, "the decoder's tape, rms_norm renamed", loaded);
    loaded.backward(J_loaded);
    std::map<std::string, Tensor<double>> by_name;
    for (const std::uint32_t i : gradient_leaves(loaded, J_loaded)) {
        const auto node = loaded.recorded(i);
        by_name[std::string(node.label)] = node.grad ? *node.grad : Tensor<double>(node.value.shape(), 0.0);
    }
    std::vector<Tensor<double>> gradients;
    for (const std::string& name : names) gradients.push_back(by_name.at(name));
    return gradients;
}

// W's head blocks in reverse order: columns of [D × n·dh] (W_Q, W_K, W_V) or rows of [n·dh × D]
// (W_O). Its own inverse.
Tensor<double> reverse_heads(const Tensor<double>& W, std::size_t dh, bool rows) {
    Tensor<double> out(W.shape());
    const std::size_t n = (rows ? W.rows() : W.cols()) / dh;
    for (std::size_t i = 0; i < W.rows(); ++i)
        for (std::size_t k = 0; k < W.cols(); ++k) {
            const std::size_t along = rows ? i : k, head = along / dh, moved = (n - 1 - head) * dh + along % dh;
            out(i, k) = rows ? W(moved, k) : W(i, moved);
        }
    return out;
}

// W W_Q, W_K, W_V or W_O: the block whose heads alibi_reversed reverses (others: not one).
std::optional<bool> head_blocks_of(const std::string& name) {
    if (name.ends_with("W_Q") || name.ends_with("W_K") || name.ends_with("W_V")) return false;  // columns
    if (name.ends_with("W_O")) return true;                                                      // rows
    return std::nullopt;
}

// The decoder's faults and how each one runs.
struct LlamaFaults {
    bool without_group_sum = false;  // GQA run as MHA on widened W_K, W_V; dK, dV from each group's first head
    bool gain_dropped = false;       // rms_norm's VJP without the gain (gradients_with_gain_dropped)
    bool reversed_heads = false;     // heads in reverse order on the way in and out: ALiBi's slopes reversed
};

// The decoder's loss on one batch and every parameter's gradient, under the faults asked for. Under
// `without_group_sum` the model runs as multi-head attention with each key/value head repeated into
// its group's query heads (the same forward), and each key/value head's gradient is its group's
// first query head's: the GQA kernels' dK, dV without the sum over the group. Under
// `reversed_heads` the query and key/value heads are reversed together (group g of H_kv becomes
// H_kv − 1 − g: the same attention), so only the slope each head's bias takes changes.
double llama_gradients(const LlamaConfig& c, const std::vector<Tensor<double>>& values,
                       std::span<const std::size_t> tokens, std::span<const std::size_t> targets, std::size_t B,
                       const LlamaFaults& faults, std::vector<Tensor<double>>& gradients) {
    LlamaConfig run = c;
    std::vector<Tensor<double>> used = values;
    const std::vector<std::string> names = parameter_names(c);
    const std::size_t groups = c.heads / c.kv_heads, dh = c.head_width();
    const auto widened = [&](std::size_t i) {
        return faults.without_group_sum && (names[i].ends_with("W_K") || names[i].ends_with("W_V"));
    };
    if (faults.without_group_sum) run.kv_heads = c.heads;
    for (std::size_t i = 0; i < names.size(); ++i) {
        if (widened(i)) used[i] = widen_heads(values[i], groups, dh);
        if (faults.reversed_heads && head_blocks_of(names[i])) used[i] = reverse_heads(used[i], dh, *head_blocks_of(names[i]));
    }
    Tape<double> tape;
    const auto p = LlamaVars<double>::record(tape, used, run);
    const Var<double> J = llama_loss(p, run, tokens, targets, B);
    gradients.clear();
    if (faults.gain_dropped) {
        gradients = gradients_with_gain_dropped(tape, J, names);
    } else {
        tape.backward(J);
        for (const Var<double>& leaf : p.all()) gradients.push_back(leaf.grad());
    }
    for (std::size_t i = 0; i < names.size(); ++i) {
        if (faults.reversed_heads && head_blocks_of(names[i]))
            gradients[i] = reverse_heads(gradients[i], dh, *head_blocks_of(names[i]));
        if (widened(i)) gradients[i] = first_of_each_group(gradients[i], groups, dh);
    }
    return J.value().item();
}

// The decoder of one training case: its pairing (or ALiBi), heads, output, window and kernel.
struct LlamaCase {
    RopePairing pairing = RopePairing::interleaved;
    std::size_t kv_heads = 4;
    bool tied = false, alibi = false;
    std::size_t window = 0;
    AttentionKernel kernel = AttentionKernel::composed;
};

// `x` rounded toward zero to `dtype`, as the double it is exactly (weights_file_truncated): the
// nearest value, or when that lies beyond |x| the next one toward zero. A value of the dtype, so
// the library's writer, rounding to nearest, stores it unchanged.
double toward_zero(SafetensorsDtype dtype, double x) {
    if (dtype == SafetensorsDtype::float64) return x;
    if (dtype == SafetensorsDtype::float32) {
        float f = static_cast<float>(x);
        if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);
        return f;
    }
    const HalfFormat format = dtype == SafetensorsDtype::bfloat16 ? bfloat16_format : float16_format;
    std::uint16_t bits = half_bits(format, x);
    if (std::fabs(half_value(format, bits)) > std::fabs(x)) --bits;  // sign and magnitude: one step toward zero
    return half_value(format, bits);
}

// The decoder's parameters as the library writes them in `dtype` under Hugging Face's names
// (llama_safetensors), or as a faulty writer would under the weights_file_* faults.
std::vector<SafetensorsTensor> weights_file(const std::vector<Tensor<double>>& values, const LlamaConfig& c,
                                            SafetensorsDtype dtype, Fault fault) {
    std::vector<SafetensorsTensor> tensors = llama_safetensors(values, c, dtype);
    if (fault == Fault::weights_file_untransposed) {
        // tapegrad's own data under the stored shape: [in, out] bytes labelled [out, in] for the
        // transposed parameters (the parameters stored as they are, E and the gains, unchanged).
        // llama_safetensors keeps parameter_names(c)'s order, the order of `values`.
        for (std::size_t i = 0; i < tensors.size(); ++i)
            tensors[i].value = values[i].reshaped(tensors[i].value.shape());
    }
    if (fault == Fault::weights_file_truncated) {
        for (SafetensorsTensor& t : tensors)
            for (double& x : t.value.data()) x = toward_zero(dtype, x);
    }
    return tensors;
}

// Six AdamW steps of a small decoder from generic parameters on seeded batches: the start's
// gradients, each step's loss, the final parameters (as .npy files, and as the library's
// safetensors files in each of its four dtypes, final.<DTYPE>.safetensors).
Dump llama_training_case(const LlamaCase& decoder, Fault fault, std::uint64_t seed) {
    constexpr std::size_t steps = 6, B = 2;
    const RopePairing pairing = decoder.pairing;
    const std::size_t kv_heads = decoder.kv_heads;
    LlamaConfig c{.vocabulary = 11, .context = 8, .width = 16, .heads = 4, .kv_heads = kv_heads, .layers = 2,
                  .hidden = 24, .tied = decoder.tied};
    c.rope_pairing = pairing, c.alibi = decoder.alibi, c.window = decoder.window, c.kernel = decoder.kernel;
    const AdamSettings adam{.learning_rate = 1e-2, .weight_decay = 0.1};
    Dump dump;
    dump.describe("model", "\"llama_training\"");
    describe_llama(dump, c);
    dump.describe("steps", fmt::format("{}", steps));
    dump.describe("optimizer", fmt::format("{{\"learning_rate\": {}, \"beta1\": {}, \"beta2\": {}, \"epsilon\": {}, "
                                           "\"weight_decay\": {}}}",
                                           adam.learning_rate, adam.beta1, adam.beta2, adam.epsilon, adam.weight_decay));
    LlamaConfig actual = c;
    if (fault == Fault::rope_other_pairing && !c.alibi) {  // (ALiBi's decoder has no RoPE)
        actual.rope_pairing = pairing == RopePairing::interleaved ? RopePairing::halves : RopePairing::interleaved;
        dump.fault_applied = true;
    }
    const LlamaFaults faults{.without_group_sum = fault == Fault::gqa_without_group_sum && kv_heads < c.heads,
                             .gain_dropped = fault == Fault::rms_norm_without_gain,
                             .reversed_heads = fault == Fault::alibi_reversed && c.alibi};
    const bool file_fault = fault == Fault::weights_file_untransposed || fault == Fault::weights_file_truncated;
    dump.fault_applied =
        dump.fault_applied || faults.without_group_sum || faults.gain_dropped || faults.reversed_heads || file_fault;

    std::mt19937_64 generator(seed);
    std::vector<Tensor<double>> values;
    const std::vector<std::string> names = parameter_names(c);
    for (const Shape& shape : parameter_shapes(c)) {
        // Matrices keep their input's variance; gains lie in [0.5, 1.5).
        const double spread = shape.rank() == 2 ? std::sqrt(3.0 / static_cast<double>(shape[0])) : 0.5;
        Tensor<double> t = uniform(shape, spread, generator);
        if (shape.rank() == 1)
            for (double& x : t.data()) x += 1.0;
        values.push_back(std::move(t));
    }
    for (std::size_t i = 0; i < names.size(); ++i) dump.add("initial." + names[i], values[i]);
    Tensor<double> tokens(Shape{steps, B, c.context}), targets(tokens.shape()), losses(Shape{steps});
    for (double& t : tokens.data()) t = static_cast<double>(draw_below(generator, c.vocabulary));
    for (double& t : targets.data()) t = static_cast<double>(draw_below(generator, c.vocabulary));
    BasicAdam<double> optimizer(adam);
    for (std::size_t step = 0; step < steps; ++step) {
        std::vector<std::size_t> x(B * c.context), y(B * c.context);
        for (std::size_t k = 0; k < x.size(); ++k) {
            x[k] = static_cast<std::size_t>(tokens[step * x.size() + k]);
            y[k] = static_cast<std::size_t>(targets[step * x.size() + k]);
        }
        std::vector<Tensor<double>> gradients;
        losses[step] = llama_gradients(actual, values, x, y, B, faults, gradients);
        if (step == 0)
            for (std::size_t i = 0; i < names.size(); ++i) dump.add("d." + names[i], gradients[i]);
        std::vector<Tensor<double>*> parameters;
        std::vector<const Tensor<double>*> grads;
        for (std::size_t i = 0; i < values.size(); ++i) parameters.push_back(&values[i]), grads.push_back(&gradients[i]);
        optimizer.step(parameters, grads);
    }
    dump.add("tokens", tokens);
    dump.add("targets", targets);
    dump.add("losses", losses);
    for (std::size_t i = 0; i < names.size(); ++i) dump.add("final." + names[i], values[i]);
    for (const SafetensorsDtype dtype : {SafetensorsDtype::float64, SafetensorsDtype::float32,
                                         SafetensorsDtype::bfloat16, SafetensorsDtype::float16}) {
        dump.add_safetensors(fmt::format("final.{}.safetensors", safetensors_dtype_name(dtype)),
                             weights_file(values, c, dtype, fault));
    }
    return dump;
}

// The decoder's logits for the tokens in TOKENS.npy ([B, T]) from a safetensors file of its weights
// under Hugging Face's names (written by cross_check.py from the PyTorch model), into LOGITS.npy.
//   dump_models LOGITS.npy --llama-logits WEIGHTS.safetensors TOKENS.npy V D H H_KV L F tied|untied PAIRING
int llama_logits_from_file(char** argv) {
    const Tensor<double> token_values = load_npy(argv[4]);
    LlamaConfig c{.vocabulary = std::stoul(argv[5]), .context = token_values.cols(), .width = std::stoul(argv[6]),
                  .heads = std::stoul(argv[7]), .kv_heads = std::stoul(argv[8]), .layers = std::stoul(argv[9]),
                  .hidden = std::stoul(argv[10]), .tied = std::string_view(argv[11]) == "tied"};
    c.rope_pairing = std::string_view(argv[12]) == "halves" ? RopePairing::halves : RopePairing::interleaved;
    c.alibi = std::string_view(argv[13]) == "1", c.window = std::stoul(argv[14]);
    std::vector<std::size_t> tokens;
    for (const double t : token_values.data()) tokens.push_back(static_cast<std::size_t>(t));
    Tape<double> tape;
    const auto p = LlamaVars<double>::record(tape, llama_parameters_from(load_safetensors(argv[3]), c), c);
    save_npy(argv[1], llama_logits(p, c, std::span<const std::size_t>(tokens), token_values.rows()).value());
    return 0;
}

// ---- Writing ------------------------------------------------------------------------------------

void write_case(const fs::path& dir, const Dump& dump) {
    fs::create_directories(dir);
    for (const auto& [name, tensor] : dump.files) save_npy(dir / (name + ".npy"), tensor);
    for (const auto& [file_name, tensors] : dump.safetensors_files) save_safetensors(dir / file_name, tensors);
    std::vector<std::string> meta = dump.meta;
    meta.push_back(fmt::format("\"fault_applied\": {}", dump.fault_applied ? "true" : "false"));
    std::ofstream file(dir / "meta.json");
    file << fmt::format("{{{}}}\n", fmt::join(meta, ", "));
    file.close();
    if (!file) throw io_error(fmt::format("dump_models: cannot write '{}'", (dir / "meta.json").string()));
}

std::vector<std::pair<std::string, Dump>> all_cases(const fs::path& scratch, Fault fault) {
    using K = AttentionKernel;
    const std::vector<MultiHeadCase> multihead{
        // Queries at absolute positions 4..6 over a history of 7 keys (the key-value cache case).
        {"multihead_causal_offset_composed", 2, 3, 7, 8, 2, false, true, 4, {}, K::composed},
        {"multihead_causal_offset_fused", 2, 3, 7, 8, 2, false, true, 4, {}, K::fused},
        {"multihead_self_causal_composed", 2, 5, 5, 8, 4, true, true, 0, {}, K::composed},
        {"multihead_self_causal_fused", 2, 5, 5, 8, 4, true, true, 0, {}, K::fused},
        {"multihead_cross_plain_composed", 2, 3, 6, 6, 3, false, false, 0, {}, K::composed},
        {"multihead_cross_plain_fused", 2, 3, 6, 6, 3, false, false, 0, {}, K::fused},
        {"multihead_self_padding", 3, 6, 6, 8, 2, true, false, 0, {6, 4, 1}, K::composed},
        {"multihead_self_padding_causal", 3, 6, 6, 8, 2, true, true, 0, {6, 3, 1}, K::composed},
        {"multihead_padding_causal_offset", 3, 2, 6, 8, 2, false, true, 4, {6, 5, 3}, K::composed},
    };
    std::vector<std::pair<std::string, Dump>> cases;
    std::uint64_t seed = 100;
    for (const MultiHeadCase& c : multihead) cases.emplace_back(c.name, multihead_case(c, fault, seed++));
    cases.emplace_back("retrieval_composed", retrieval_case(K::composed, fault));
    cases.emplace_back("retrieval_fused", retrieval_case(K::fused, fault));
    cases.emplace_back("retrieval_training", retrieval_training_case(fault));
    cases.emplace_back("transformer_block_composed", transformer_block_case(K::composed, GeluForm::tanh, fault, 300));
    cases.emplace_back("transformer_block_fused", transformer_block_case(K::fused, GeluForm::tanh, fault, 301));
    cases.emplace_back("transformer_block_gelu_erf", transformer_block_case(K::composed, GeluForm::erf, fault, 302));
    cases.emplace_back("transformer_logits_composed", transformer_logits_case(K::composed, fault, 310));
    cases.emplace_back("transformer_logits_fused", transformer_logits_case(K::fused, fault, 311));
    cases.emplace_back("charlm_training", charlm_training_case(scratch, fault));
    using P = RopePairing;
    cases.emplace_back("llama_gqa_interleaved", llama_training_case({P::interleaved, 2, false}, fault, 400));
    cases.emplace_back("llama_mqa_halves_tied", llama_training_case({P::halves, 1, true}, fault, 401));
    cases.emplace_back("llama_mha_halves", llama_training_case({P::halves, 4, false}, fault, 402));
    // ALiBi and a sliding window of 3 keys on the fused kernel (ops/fused_attention.hpp).
    cases.emplace_back("llama_gqa_alibi_window_fused",
                       llama_training_case({P::interleaved, 2, false, true, 3, AttentionKernel::fused}, fault, 403));
    return cases;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string usage = "usage: dump_models OUTPUT_DIR [--fault none|drop_mask|flip_scale|nudge_learning_rate|"
                              "skip_clipping|rope_other_pairing|gqa_without_group_sum|rms_norm_without_gain|"
                              "alibi_reversed|weights_file_untransposed|weights_file_truncated]\n"
                              "       dump_models OUTPUT_DIR --charlm-default STEPS\n"
                              "       dump_models LOGITS.npy --llama-logits WEIGHTS.safetensors TOKENS.npy V D H H_KV L F "
                              "tied|untied PAIRING ALIBI(0|1) WINDOW";
    if (argc == 15 && std::string_view(argv[2]) == "--llama-logits") {
        try {
            return llama_logits_from_file(argv);
        } catch (const std::exception& e) {
            fmt::print(stderr, "dump_models: {}\n", e.what());
            return 1;
        }
    }
    const std::string option = argc == 4 ? argv[2] : "";
    if (argc != 2 && !(argc == 4 && (option == "--fault" || option == "--charlm-default"))) {
        fmt::print(stderr, "{}\n", usage);
        return 2;
    }
    const auto fault = option == "--fault" ? fault_names.find(argv[3]) : fault_names.find("none");
    if (fault == fault_names.end()) {
        fmt::print(stderr, "dump_models: unknown fault '{}'\n{}\n", argv[3], usage);
        return 2;
    }
    const fs::path output = argv[1];
    const fs::path temporary = fs::path(output.string() + fmt::format(".tmp-{}", ::getpid()));
    try {
        fs::remove_all(temporary);
        fs::create_directories(temporary);
        if (option == "--charlm-default") {
            write_case(temporary / "charlm_default", charlm_default_case(std::stoul(argv[3])));
        } else {
            for (const auto& [name, dump] : all_cases(temporary, fault->second)) write_case(temporary / name, dump);
        }
        fs::remove_all(output);
        fs::rename(temporary, output);
        return 0;
    } catch (const std::exception& e) {
        std::error_code ignored;
        fs::remove_all(temporary, ignored);
        fmt::print(stderr, "dump_models: {}\n", e.what());
        return 1;
    }
}
