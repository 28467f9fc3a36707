// Trains the character-level language model of models/charlm.hpp on the prose files of Debian's
// `fortunes` package: AdamW, warm-up + cosine decay, gradient clipping, validation in bits per
// character, checkpoints that resume exactly, and a sample from a prompt.
//   train_charlm [--model gpt2|llama] [--steps N] [--stop-after K] [--dtype float32|bfloat16]
//                [--save DIR [--save-every N]] [--load DIR] [--prompt TEXT] ...
// --model llama trains the LLaMA-style decoder of models/llama.hpp (RoPE, RMSNorm, grouped-query
// attention with --kv-heads key/value heads, a SwiGLU MLP of width --hidden, logits through Eᵀ
// unless --untied) instead of the GPT-2-shaped transformer, with every other option the same; its
// defaults hold as many parameters as the GPT-2 default's (to 64), and the model line prints both
// families' counts at the run's sizes. A checkpoint of the other family is refused by name.
// (--help lists every option). Progress is a bar on a terminal and plain lines otherwise. With
// --curve FILE.png and gnuplot on the PATH, the loss and validation curves are drawn; --curve-data
// writes the numbers (step, training bits/char, validation bits/char) without needing gnuplot.
// --dtype float32 trains on a Tape<float>: float32 parameters, gradients and Adam moments, as
// PyTorch trains in float32 (models/optimizer.hpp says which scalars stay double), and float32
// checkpoints; a checkpoint of the other type is refused by name. --dtype bfloat16 trains in mixed
// precision as torch.autocast("cpu", dtype=torch.bfloat16) does: the float32 trainer, with every
// matrix product reading bfloat16 copies and accumulating in float32 (ops/matmul_bf16.hpp); its
// checkpoints hold float32 parameters and say bfloat16, so neither float32 nor bfloat16 resumes
// the other. --save-every N writes the
// checkpoint every N steps as well as at the end, each write atomic with the last complete one kept
// until the next is in place, so a run killed at any moment (SIGKILL included) resumes with
// --load DIR (the same DIR as --save) from the last checkpoint written, to the same bits as a run
// never killed (examples/charlm_kill_resume.py tests it; charlm.hpp's find_checkpoint says how a
// killed write is recovered).
// --check-step takes one step and checks the gradients of the tape it ran (check/recorded.hpp);
// --audit-step takes one step and audits its tape's precision (check/audit.hpp: the digits each
// parameter's gradient loses, the nodes that lose them; --audit-storage bfloat16 asks what 16-bit
// storage would lose); with --save-tape FILE either saves that tape first (io/tape_file.hpp); all
// in either dtype. --micro-batches P cuts each batch into P parts recorded on P tapes, run on as
// many threads as --threads gives (two threads: --threads 2 --micro-batches 2); the result depends
// on P, never on the threads.
#include "models/charlm.hpp"
#include "autodiff/cpu.hpp"
#include "autodiff/parallel.hpp"
#include "check/audit.hpp"
#include "check/recorded.hpp"
#include "io/tape_file.hpp"
#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <unistd.h>

namespace {

using namespace tapegrad;
namespace po = boost::program_options;

struct RunOptions {
    CharLmSettings settings;
    std::string model{char_lm_model_name(CharLmSettings{}.model)};
    bool untied = false;
    std::size_t stop_after = 0;  // 0: run to --steps
    std::size_t eval_every = 200;
    std::size_t eval_windows = 64;
    std::size_t sample_length = 300;
    std::string kernel{attention_kernel_name(CharLmSettings{}.kernel)};
    unsigned threads = 1;
    std::size_t save_every = 0;  // 0: save only at the end
    std::string dtype = "float64";
    bool check_step = false, audit_step = false;
    std::string audit_storage = "recorded";
    std::string save, load, prompt = "The ", curve, curve_data, save_tape;
    std::vector<std::string> corpus;
};

// Refuses a run whose one training step cannot fit in this machine's memory, before the corpus is
// read. A lower bound on the step's tape: per block at least 8 tensors of B×T×D values (the two
// norms, Q, K, V, O, the projection, the residuals and the MLP's output) and the MLP's wide ones:
// GPT-2's 4D-wide product, bias and GELU (12·D values a row), the decoder's F-wide gate, up, SiLU
// and their product (4·F a row); with the composed kernel also the scores S and weights A (B·H·T²
// each); and a gradient of each. Measured: the default GPT-2 model at T = 4096 peaked at 4.2 GB
// resident where this says 2.7 GB. value_bytes: 8 for float64, 4 for float32.
void require_memory_for(const CharLmSettings& m, std::size_t value_bytes) {
    const double rows = static_cast<double>(m.batch) * static_cast<double>(m.context);
    const double mlp =
        m.model == CharLmModel::llama ? 4.0 * static_cast<double>(m.hidden) : 12.0 * static_cast<double>(m.width);
    double per_block = rows * (8.0 * static_cast<double>(m.width) + mlp);
    if (m.kernel == AttentionKernel::composed) per_block += 2.0 * rows * static_cast<double>(m.heads * m.context);
    const double values_and_gradients = 2.0;
    cli::require_memory(values_and_gradients * per_block * static_cast<double>(m.layers) * static_cast<double>(value_bytes),
                        "the values and gradients one training step keeps on its tape",
                        fmt::format("--context {} --batch {} --width {} --layers {}", m.context, m.batch, m.width, m.layers));
}

// The decoder's own options given to the GPT-2 model, or sizes the decoder cannot take: refused.
void check_family_options(const RunOptions& r, const po::variables_map& values) {
    const CharLmSettings& m = r.settings;
    if (m.model == CharLmModel::gpt2) {
        for (const char* option : {"kv-heads", "hidden", "untied"}) {
            if (!values[option].defaulted()) {
                throw cli::usage_error(fmt::format("--{} shapes the llama decoder; the gpt2 model has none: give "
                                                   "--model llama",
                                                   option));
            }
        }
        return;
    }
    if ((m.width / m.heads) % 2 != 0) {
        throw cli::usage_error(fmt::format("--model llama rotates pairs of a head's coordinates (RoPE): --width / "
                                           "--heads must be even (width {}, heads {})",
                                           m.width, m.heads));
    }
    if (m.heads % m.kv_heads != 0) {
        throw cli::usage_error(
            fmt::format("--kv-heads must divide --heads (kv-heads {}, heads {})", m.kv_heads, m.heads));
    }
}

// A typed setting read from its option's text: the library's refusal becomes a usage error naming
// the option.
template <class Read>
auto typed_option(std::string_view option, Read read) {
    try {
        return read();
    } catch (const tapegrad::error& e) {
        throw cli::usage_error(fmt::format("--{}: {}", option, e.what()));
    }
}

// The options, or nothing when --help was asked for.
std::optional<RunOptions> parse(int argc, char** argv) {
    RunOptions r;
    CharLmSettings& m = r.settings;
    po::options_description description("train_charlm options");
    using cli::integer;
    constexpr std::size_t one = 1, none = 0;
    description.add_options()("help", "this text")
        ("model", po::value(&r.model)->default_value(r.model), "gpt2 (models/transformer.hpp) or llama (the "
                                                              "decoder of models/llama.hpp)")
        ("steps", integer(&m.steps, one)->default_value(m.steps), "optimizer steps (the schedule's length)")
        ("stop-after", integer(&r.stop_after, none)->default_value(0), "stop (and save) after this many steps, 0: at --steps")
        ("layers", integer(&m.layers, one)->default_value(m.layers), "transformer blocks L")
        ("width", integer(&m.width, one)->default_value(m.width), "model width D")
        ("heads", integer(&m.heads, one)->default_value(m.heads), "attention heads")
        ("kv-heads", integer(&m.kv_heads, one)->default_value(m.kv_heads), "llama: key/value heads, dividing --heads "
                                                                          "(grouped-query attention)")
        ("hidden", integer(&m.hidden, one)->default_value(m.hidden), "llama: the SwiGLU MLP's width F (the default "
                                                                    "matches the gpt2 model's parameter count)")
        ("untied", po::bool_switch(&r.untied), "llama: logits through a W_out of their own instead of Eᵀ")
        ("context", integer(&m.context, one)->default_value(m.context), "characters per sequence T")
        ("batch", integer(&m.batch, one)->default_value(m.batch), "sequences per step")
        ("warmup", integer(&m.warmup, none)->default_value(m.warmup), "warm-up steps")
        ("lr", cli::positive_real(&m.peak_rate, 10.0)->default_value(m.peak_rate), "peak learning rate")
        ("weight-decay", cli::real(&m.weight_decay, 0.0, 10.0)->default_value(m.weight_decay), "AdamW weight decay (matrices)")
        ("clip", cli::positive_real(&m.clip_norm)->default_value(m.clip_norm), "gradient global-norm cap")
        ("seed", integer(&m.seed, std::uint64_t{0})->default_value(m.seed), "initialisation and batches")
        ("kernel", po::value(&r.kernel)->default_value(r.kernel), "attention kernel: fused or composed")
        ("threads", integer(&r.threads, 0u, cli::max_threads)->default_value(r.threads), "threads (tapegrad::set_threads; 0: one per core)")
        ("micro-batches", integer(&m.micro_batches, one)->default_value(m.micro_batches),
         "parts of each batch, each on its own tape and thread (results depend on it, not on --threads; "
         "two threads train faster with 2 than with 1)")
        ("eval-every", integer(&r.eval_every, one)->default_value(r.eval_every), "validation every this many steps")
        ("eval-windows", integer(&r.eval_windows, one)->default_value(r.eval_windows), "validation windows during training")
        ("dtype", po::value(&r.dtype)->default_value(r.dtype), "float64, float32 or bfloat16: the type of the "
                                                                "parameters, gradients, Adam's moments and checkpoints "
                                                                "(bfloat16: float32 ones, matrix products read in "
                                                                "bfloat16 and accumulated in float32, as torch.autocast)")
        ("save", po::value(&r.save), "checkpoint directory written at the end (and with --save-every, every N steps)")
        ("save-every", integer(&r.save_every, none)->default_value(0), "with --save: also write the checkpoint every "
                                                                       "this many steps (atomically; 0: only at the end)")
        ("load", po::value(&r.load), "checkpoint directory to resume from (after a killed save: what it left, the "
                                     "last complete checkpoint; give the same DIR as --save to go on)")
        ("prompt", po::value(&r.prompt)->default_value(r.prompt), "sample text after this prompt")
        ("sample-length", integer(&r.sample_length, none)->default_value(r.sample_length), "characters to sample, 0: none")
        ("curve", po::value(&r.curve), "PNG of the curves (needs gnuplot on the PATH)")
        ("curve-data", po::value(&r.curve_data), "text file of step, training and validation bits/char")
        ("corpus", po::value(&r.corpus)->multitoken(), "text files (default: prose files of Debian's fortunes)")
        ("check-step", po::bool_switch(&r.check_step), "take one step, check its tape's gradients against 50-digit "
                                                      "differences (fast mode) and stop; exit 3 if they disagree")
        ("audit-step", po::bool_switch(&r.audit_step), "take one step, audit its tape's precision (check/audit.hpp: "
                                                      "digits lost per parameter gradient, the worst nodes) and stop")
        ("audit-storage", po::value(&r.audit_storage)->default_value(r.audit_storage),
         "with --audit-step: recorded, bfloat16 or float16 (values and gradients kept in 16 bits)")
        ("save-tape", po::value(&r.save_tape), "with --check-step or --audit-step: save the step's tape to this file "
                                               "first (io/tape_file.hpp; check it anywhere with tapegrad-check --tape)");
    po::variables_map values;
    po::store(cli::options_only(argc, argv, description, "train_charlm"), values);
    if (values.count("help")) {
        std::cout << description << "\n";
        return std::nullopt;
    }
    po::notify(values);
    if (r.dtype != "float64" && r.dtype != "float32" && r.dtype != "bfloat16") {
        throw cli::usage_error(fmt::format("--dtype must be float64, float32 or bfloat16, not '{}'", r.dtype));
    }
    if (r.dtype == "bfloat16") m.products = ProductPrecision::bfloat16;
    if (r.save_every > 0 && r.save.empty()) throw cli::usage_error("--save-every needs --save DIR");
    if (!r.save_tape.empty() && !r.check_step && !r.audit_step) {
        throw cli::usage_error("--save-tape saves the tape of the step --check-step or --audit-step takes; give one of them");
    }
    if (r.check_step && r.audit_step) throw cli::usage_error("--check-step and --audit-step: choose one");
    if ((r.check_step || r.audit_step) && m.micro_batches > 1) {
        throw cli::usage_error("--check-step and --audit-step take the step on one tape: give --micro-batches 1");
    }
    if (m.micro_batches > m.batch) {
        throw cli::usage_error(fmt::format("--micro-batches {} is more than --batch {}", m.micro_batches, m.batch));
    }
    if (!storage_named(r.audit_storage)) {
        throw cli::usage_error(fmt::format("--audit-storage must be recorded, bfloat16 or float16, not '{}'", r.audit_storage));
    }
    m.kernel = typed_option("kernel", [&] { return attention_kernel_from(r.kernel); });
    m.model = typed_option("model", [&] { return char_lm_model_from(r.model); });
    m.tied = !r.untied;
    if (m.width % m.heads != 0) {
        throw cli::usage_error(fmt::format("--width must be a multiple of --heads (width {}, heads {})", m.width, m.heads));
    }
    check_family_options(r, values);
    require_memory_for(m, r.dtype == "float64" ? sizeof(double) : sizeof(float));
    return r;
}

// One line per report on a pipe or file; a bar redrawn in place on a terminal.
class Progress {
public:
    explicit Progress(std::size_t total) : total_(total), terminal_(isatty(STDOUT_FILENO) != 0) {}
    bool terminal() const { return terminal_; }
    void report(std::size_t step, double loss_bits, double validation_bits, double seconds, bool force) {
        const std::string figures = fmt::format("step {:5d}/{}  train {:.3f} bits/char  validation {:.3f} bits/char  {:.0f} s",
                                                step, total_, loss_bits, validation_bits, seconds);
        if (terminal_) {
            const std::size_t filled = 30 * step / std::max<std::size_t>(total_, 1);
            fmt::print("\r[{}{}] {}", std::string(filled, '#'), std::string(30 - filled, '.'), figures);
            if (step == total_) fmt::print("\n");
            std::fflush(stdout);
        } else if (force) {
            fmt::print("{}\n", figures);
            std::fflush(stdout);  // a pipe's reader (a log, CTest) sees each line as it comes
        }
    }

private:
    std::size_t total_;
    bool terminal_;
};

struct CurvePoint {
    std::size_t step;
    double train_bits, validation_bits;
};

void write_curve_data(const std::string& path, const std::vector<CurvePoint>& points) {
    std::string text = "# step  training bits/char (mean since the last point)  validation bits/char\n";
    for (const CurvePoint& p : points) text += fmt::format("{} {:.6f} {:.6f}\n", p.step, p.train_bits, p.validation_bits);
    write_file_atomically(path, text, "train_charlm");
}

// Draws the curves with gnuplot when it is on the PATH; says so and goes on when it is not.
void draw_curve(const std::string& png, const std::string& data) {
    if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) {
        fmt::print("gnuplot not found: no picture drawn (the data is in {})\n", data);
        return;
    }
    const std::string script = fmt::format(
        "set terminal pngcairo size 800,500; set output '{}.tmp'; set xlabel 'step'; set ylabel 'bits per character'; "
        "set grid; plot '{}' using 1:2 with lines title 'training', '' using 1:3 with linespoints title 'validation'",
        png, data);
    FILE* pipe = popen("gnuplot", "w");
    if (pipe == nullptr) throw io_error("train_charlm: cannot start gnuplot");
    fmt::print(pipe, "{}\n", script);
    if (pclose(pipe) != 0) throw io_error("train_charlm: gnuplot failed to draw the curve");
    std::filesystem::rename(png + ".tmp", png);
    fmt::print("curve written to {}\n", png);
}

// --check-step: one training step, then its tape checked as it ran (check/recorded.hpp), fast mode,
// without branch attribution.
template <std::floating_point T>
int check_one_step(BasicCharLmTrainer<T>& trainer, const std::string& save_tape_file) {
    const double loss = trainer.step();
    if (!save_tape_file.empty()) {  // first, so that a check that fails leaves the tape to attach
        save_tape(save_tape_file, trainer.last_step_tape(), trainer.last_step_loss());
        fmt::print("step {}: tape saved to {}\n", trainer.steps_done(), save_tape_file);
    }
    CheckOptions options;
    options.mode = CheckOptions::Mode::fast;
    // Branches (E tied to the output projection) are attributed coordinate by coordinate, a
    // 50-digit replay of the whole step for each of E's entries: hours at the default size. The
    // whole gradient of every parameter, E's included, is checked by the fast directions.
    options.check_branches = false;
    options.progress = [](const CheckProgress& p) {
        if (p.done == p.mine) fmt::print("  {}: {} derivatives, {:.1f} s\n", p.stage, p.done, p.seconds);
    };
    fmt::print("step {}: loss {:.4f} nats/char; checking its tape ({} nodes) against 50-digit differences\n",
               trainer.steps_done(), loss, trainer.last_step_tape().size());
    std::fflush(stdout);
    const CheckReport report = check_gradients(trainer.last_step_tape(), trainer.last_step_loss(), options);
    fmt::print("{}\n", report.summary());
    return report.passed ? EXIT_SUCCESS : 3;
}

// --audit-step: one training step, then its tape's precision audited (check/audit.hpp).
template <std::floating_point T>
int audit_one_step(BasicCharLmTrainer<T>& trainer, const RunOptions& r) {
    const double loss = trainer.step();
    if (!r.save_tape.empty()) {
        save_tape(r.save_tape, trainer.last_step_tape(), trainer.last_step_loss());
        fmt::print("step {}: tape saved to {}\n", trainer.steps_done(), r.save_tape);
    }
    AuditOptions options;
    options.storage = *storage_named(r.audit_storage);  // checked when the command line was read
    options.progress = true;
    fmt::print("step {}: loss {:.4f} nats/char; auditing its tape ({} nodes) against its 50-digit re-run\n",
               trainer.steps_done(), loss, trainer.last_step_tape().size());
    std::fflush(stdout);
    const PrecisionAudit audit = audit_precision(trainer.last_step_tape(), trainer.last_step_loss(), options);
    fmt::print("{}", audit.table(15));
    return EXIT_SUCCESS;
}

// The family and the sizes that shape it, as the network holds them (what is trained, not what
// was asked for).
std::string model_sizes(const CharLmNetwork& network) {
    std::string text{char_lm_model_name(model_of(network))};
    for (const auto& [key, value] : sizes_of(network)) text += fmt::format(" {}={}", key, value);
    return text;
}

// The other family at the run's sizes (the decoder with its own sizes as the settings hold them)
// and its parameter count: the comparison the decoder's default F was chosen for.
std::string other_family(const CharLmSettings& m, std::size_t vocabulary) {
    CharLmSettings other = m;
    other.model = m.model == CharLmModel::gpt2 ? CharLmModel::llama : CharLmModel::gpt2;
    const CharLmNetwork network = char_lm_network(other, vocabulary);
    try {
        check_network(network);
    } catch (const value_error&) {
        return fmt::format("{} does not fit these sizes", char_lm_model_name(other.model));
    }
    return fmt::format("{}: {} parameters", model_sizes(network), parameter_values(network));
}

template <std::floating_point T>
int run(const RunOptions& r, const Corpus& corpus, const std::vector<std::filesystem::path>& files) {
    BasicCharLmTrainer<T> trainer(r.settings, corpus);
    if (!r.load.empty()) {
        const std::filesystem::path read = trainer.load(r.load);
        if (read != std::filesystem::path(r.load)) {
            fmt::print("a save into {} was killed: resuming from its newest complete checkpoint, {}\n", r.load,
                       read.string());
        }
    }
    const std::size_t last = r.stop_after ? std::min(r.stop_after, r.settings.steps) : r.settings.steps;
    fmt::print("corpus: {} files, {} training and {} validation characters, alphabet of {}\n", files.size(),
               corpus.train.size(), corpus.validation.size(), corpus.alphabet.size());
    const CharLmSettings& m = r.settings;
    fmt::print("model: {} batch={}{}, {} parameters (against {}), {} attention, {}; steps {}..{} of {}; {} thread(s)\n",
               model_sizes(trainer.network()), m.batch,
               m.micro_batches > 1 ? fmt::format(" in {} micro-batches", m.micro_batches) : std::string(),
               parameter_values(trainer.network()), other_family(m, corpus.alphabet.size()),
               attention_kernel_name(m.kernel), trainer.dtype(), trainer.steps_done() + 1, last, m.steps,
               thread_count());  // the library's setting, as --threads left it
    if (m.products == ProductPrecision::bfloat16 && cpu_level() != CpuLevel::avx512_bf16) {
        if (bf16_products_widened()) {
            fmt::print("note: the CPU level is {}, without AVX512_BF16: the bfloat16 products are widened to float32 "
                       "(the same products, summed in another order: not bit for bit an AVX512_BF16 machine's run; "
                       "TAPEGRAD_BF16=vdpbf16ps reproduces that, slowly)\n",
                       cpu_level_name(cpu_level()));
        } else {
            fmt::print("note: the CPU level is {}, without AVX512_BF16: the bfloat16 products are emulated exactly "
                       "(TAPEGRAD_BF16=vdpbf16ps: an AVX512_BF16 machine's results), 7 to 9 times slower than "
                       "float32 steps (docs/performance.md)\n",
                       cpu_level_name(cpu_level()));
        }
    }
    if (r.check_step) return check_one_step(trainer, r.save_tape);
    if (r.audit_step) return audit_one_step(trainer, r);
    const auto start = std::chrono::steady_clock::now();
    const auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    Progress progress(last);
    std::vector<CurvePoint> curve;
    double running = 0, validation = 0;
    std::size_t window = 0, saved_at = 0;
    while (trainer.steps_done() < last) {
        running += trainer.step() / std::numbers::ln2;
        ++window;
        const std::size_t step = trainer.steps_done();
        const bool evaluate = step % r.eval_every == 0 || step == last;
        if (evaluate) {
            validation = trainer.validation_loss(r.eval_windows) / std::numbers::ln2;
            curve.push_back({step, running / static_cast<double>(window), validation});
        }
        progress.report(step, running / static_cast<double>(window), validation, seconds(), evaluate);
        if (evaluate) running = 0, window = 0;
        // The last step's checkpoint too, before the final validation (minutes at the default size).
        if (r.save_every > 0 && (step % r.save_every == 0 || step == last)) {
            trainer.save(r.save);
            saved_at = step;
            if (!progress.terminal()) fmt::print("checkpoint after step {} saved to {}\n", step, r.save);
        }
    }
    const double full = trainer.validation_loss() / std::numbers::ln2;
    fmt::print("final validation (all {} characters): {:.4f} bits/char after {} steps, {:.1f} s training\n",
               corpus.validation.size(), full, trainer.steps_done(), seconds());
    if (!r.save.empty()) {
        if (!(saved_at > 0 && saved_at == trainer.steps_done())) trainer.save(r.save);
        fmt::print("checkpoint saved to {}\n", r.save);
    }
    if (!r.curve_data.empty() || !r.curve.empty()) {
        const std::string data = r.curve_data.empty() ? r.curve + ".dat" : r.curve_data;
        write_curve_data(data, curve);
        if (!r.curve.empty()) draw_curve(r.curve, data);
    }
    if (r.sample_length > 0) {
        fmt::print("sample (seed {}) after \"{}\":\n{}{}\n", m.seed, r.prompt, r.prompt,
                   trainer.sample(r.prompt, r.sample_length, m.seed));
    }
    return EXIT_SUCCESS;
}

int run(const RunOptions& r) {
    set_threads(r.threads);
    std::vector<std::filesystem::path> files(r.corpus.begin(), r.corpus.end());
    if (files.empty()) files = default_corpus_files();
    const Corpus corpus = load_corpus(files);
    return r.dtype == "float64" ? run<double>(r, corpus, files) : run<float>(r, corpus, files);
}

}  // namespace

int main(int argc, char** argv) {
    std::optional<RunOptions> options;
    try {
        options = parse(argc, argv);
    } catch (const std::exception& e) {
        fmt::print(stderr, "train_charlm: {} (see --help)\n", e.what());
        return cli::exit_usage;
    }
    try {
        return options ? run(*options) : EXIT_SUCCESS;
    } catch (const std::exception& e) {
        fmt::print(stderr, "train_charlm: {}\n", e.what());
        return EXIT_FAILURE;
    }
}
