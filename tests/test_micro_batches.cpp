// One micro-batch and several are one training step, in every dtype, model and kernel (issue 49:
// a setting applied to the first of several micro-batches only passed every test that trains with
// one). The char-LM trainer (models/charlm.hpp) cuts a batch of B = 6 sequences into 1, 2, 3 or 6
// parts, each on its own tape; the first step's loss and the gradient's global norm must agree
// across splits within the rounding of the other summation order, and a run of 2 parts
// saved after two steps and resumed by a new trainer must go on bit for bit.
#define BOOST_TEST_MODULE micro_batches
#include "support.hpp"
#include "charlm_corpus.hpp"
#include "models/charlm.hpp"

#include <filesystem>

using namespace tapegrad;
namespace fs = std::filesystem;

namespace {

enum class Dtype { float64, float32, bfloat16 };

struct Case {
    CharLmModel model;
    AttentionKernel kernel;
    Dtype dtype;

    std::string name() const {
        const std::string_view dtype_names[] = {"float64", "float32", "bfloat16"};
        return fmt::format("{}, {} attention, {}", char_lm_model_name(model), attention_kernel_name(kernel),
                           dtype_names[int(dtype)]);
    }
    CharLmSettings settings(std::size_t micro_batches) const {
        CharLmSettings s{.layers = 1, .width = 8, .heads = 2, .context = 16, .batch = 6};
        s.model = model, s.kernel = kernel, s.micro_batches = micro_batches;
        if (model == CharLmModel::llama) s.kv_heads = 1, s.hidden = 24;
        if (dtype == Dtype::bfloat16) s.products = ProductPrecision::bfloat16;
        return s;
    }
};

// The first step's loss and the global gradient norm (before clipping), in double.
template <std::floating_point T>
std::pair<double, double> first_step(const Case& c, std::size_t micro_batches, const Corpus& corpus) {
    BasicCharLmTrainer<T> trainer(c.settings(micro_batches), corpus);
    const double loss = trainer.step();
    return {loss, trainer.last_gradient_norm()};
}

// The bound, fixed before the runs: the parts hold the same sequences, whose products and
// per-position losses are computed alike (bfloat16 operands rounded alike, each row of a product
// one chain of roundings); only the sums over the batch split differently, B·context = 96 terms
// (the loss's mean, each parameter's gradient): γ_96 = 96·u relative, 5.7e-6 in float32 (and so
// in bfloat16, whose accumulation is float32), 1.1e-14 in float64. The bounds leave a factor of 5;
// a part without the run's bfloat16 products misses by about u_bf16 = 3.9e-3 times the products'
// share of the loss, orders above.
double bound(Dtype dtype) { return dtype == Dtype::float64 ? 5.5e-14 : 3e-5; }

// The splits compared, as (parts, parts). A part's mean loss scales its upstream gradient by
// 1/(B_p·context): 1/96 and 1/48 for 1 and 2 parts hold a factor 1/3, 1/32 and 1/16 for 3 and 6
// are powers of two. bfloat16 products round that gradient to 8 bits (ops/matmul_bf16.hpp), so
// splits whose scales differ by a power of two round it alike, and others do not (measured: 2.5e-4
// apart in the gradient norm, one bfloat16 rounding's worth, not a fault). float32 and float64
// round nothing to 8 bits: every split against one part.
std::vector<std::pair<std::size_t, std::size_t>> compared_splits(Dtype dtype) {
    if (dtype == Dtype::bfloat16) return {{1, 2}, {3, 6}};
    return {{1, 2}, {1, 3}, {1, 6}};
}

template <std::floating_point T>
void parts_agree(const Case& c, const Corpus& corpus, double& worst) {
    for (const auto& [one, other] : compared_splits(c.dtype)) {
        const auto [loss, norm] = first_step<T>(c, one, corpus);
        const auto [part_loss, part_norm] = first_step<T>(c, other, corpus);
        const double loss_gap = std::abs(part_loss - loss) / loss, norm_gap = std::abs(part_norm - norm) / norm;
        worst = std::max({worst, loss_gap, norm_gap});
        BOOST_TEST_CONTEXT(other << " parts against " << one) {
            BOOST_TEST(loss_gap <= bound(c.dtype), "loss " << part_loss << " against " << loss);
            BOOST_TEST(norm_gap <= bound(c.dtype), "gradient norm " << part_norm << " against " << norm);
        }
    }
}

std::vector<Case> every_case() {
    std::vector<Case> all;
    for (const CharLmModel model : {CharLmModel::gpt2, CharLmModel::llama})
        for (const AttentionKernel kernel : {AttentionKernel::fused, AttentionKernel::composed})
            for (const Dtype dtype : {Dtype::float64, Dtype::float32, Dtype::bfloat16}) all.push_back({model, kernel, dtype});
    return all;
}

}  // namespace

BOOST_AUTO_TEST_CASE(one_micro_batch_and_several_take_one_step) {
    const Corpus corpus = testing::random_corpus(12, 2000);
    double worst_double = 0, worst_float = 0;
    for (const Case& c : every_case()) {
        BOOST_TEST_CONTEXT(c.name()) {
            if (c.dtype == Dtype::float64) {
                parts_agree<double>(c, corpus, worst_double);
            } else {
                parts_agree<float>(c, corpus, worst_float);
            }
        }
    }
    BOOST_TEST_MESSAGE(fmt::format("12 cases: largest relative gap float64 {:.3g}, float32 and bfloat16 {:.3g}",
                                   worst_double, worst_float));
}

// A run of 2 micro-batches saved after two steps and resumed by a new trainer (whose tapes are its
// own, set from its settings) goes on as the uninterrupted run, bit for bit, in every dtype.
BOOST_AUTO_TEST_CASE(a_run_of_several_micro_batches_resumes_exactly_in_every_dtype) {
    const Corpus corpus = testing::random_corpus(12, 2000);
    const fs::path root = fs::temp_directory_path() / fmt::format("tapegrad_micro_batches_{}", ::getpid());
    fs::remove_all(root);
    for (const Case& c : every_case()) {
        if (c.kernel != AttentionKernel::fused) continue;
        BOOST_TEST_CONTEXT(c.name()) {
            const auto resumes = [&](auto zero) {
                using T = decltype(zero);
                BasicCharLmTrainer<T> run(c.settings(2), corpus);
                run.step();
                run.step();
                const fs::path checkpoint = root / c.name();
                run.save(checkpoint);
                BasicCharLmTrainer<T> resumed(c.settings(2), corpus);
                resumed.load(checkpoint);
                BOOST_TEST(resumed.step() == run.step());
                BOOST_TEST((resumed.parameters() == run.parameters()));
                BOOST_TEST(resumed.last_gradient_norm() == run.last_gradient_norm());
            };
            if (c.dtype == Dtype::float64) {
                resumes(0.0);
            } else {
                resumes(0.0f);
            }
        }
    }
    fs::remove_all(root);
}
