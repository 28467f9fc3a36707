// tapegrad-attention: single-head attention (models/attention.hpp, optionally causal) forward and
// backward on .npy files, for cross-checking tapegrad against NumPy or PyTorch. See
// `tapegrad-attention --help`.
// Everything is computed (and checked, with --check) before any output is written; outputs go
// to temporary files that are renamed into place only when all of them were written, so an
// error never leaves partial outputs behind. Every error is one line on stderr and an exit code.
#include "io/npy.hpp"
#include "tapegrad.hpp"

#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;
namespace po = boost::program_options;
using namespace tapegrad;

constexpr int exit_ok = 0, exit_error = 1, exit_usage = 2, exit_check_failed = 3;

constexpr std::string_view description = R"(tapegrad-attention: single-head attention, forward and backward, on .npy files.

Reads from --inputs DIR (float64 or float32 .npy, C order; shapes as in the spec):
  X.npy   T x D   the input tokens
  Wq.npy  D x d   query projection      Wk.npy  D x d   key projection
  Wv.npy  D x r   value projection      G.npy   T x r   upstream gradient dJ/dO
and computes Q = X Wq, K = X Wk, V = X Wv, S = Q K^T / sqrt(d) (with --causal, S_ij = -inf
for j > i), A = softmax(S) row by row, O = A V, and the probe J = sum(O * G), whose gradients
are the backward pass of attention for the upstream gradient G.

Writes to --outputs DIR (created if missing; float64 .npy):
  O.npy (T x r), A.npy (T x T), J.npy (0-d), dX.npy, dWq.npy, dWk.npy, dWv.npy (shaped like
  X, Wq, Wk, Wv). Outputs are written only when everything succeeded (including --check), via
  temporary files renamed into place: on any error no output file is created or changed.

--check runs tapegrad's gradient checker on these inputs: the double and 50-digit tapes against
50-digit central differences (thresholds 1e-9 and 1e-25), and prints its report. Every
coordinate is checked; --fast checks random directional derivatives instead (for large inputs).

Exit status: 0 success; 1 bad input or I/O error (one line on stderr naming the file, shape or
value at fault); 2 bad command line; 3 the gradient check failed.

Example (NumPy):  python -c "import numpy as n; r=n.random.default_rng(0);
  [n.save(f'in/{k}.npy', r.standard_normal(s)) for k,s in
   dict(X=(4,3),Wq=(3,2),Wk=(3,2),Wv=(3,2),G=(4,2)).items()]"
  tapegrad-attention --inputs in --outputs out --check

Options)";

struct Inputs {
    Tensor<double> X, Wq, Wk, Wv, G;
};

// A one-line error (file, shape or value at fault), reported with exit status 1.
struct InputError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

Tensor<double> load_input(const fs::path& dir, const std::string& name, std::size_t rank) {
    Tensor<double> t = load_npy(dir / (name + ".npy"));
    if (t.rank() != rank) {
        throw InputError(fmt::format("{}.npy: expected a {}-d array, got shape {}", name, rank, t.shape().to_string()));
    }
    if (t.size() == 0) throw InputError(fmt::format("{}.npy: empty array (shape {})", name, t.shape().to_string()));
    for (std::size_t k = 0; k < t.size(); ++k) {
        if (!is_finite(t[k])) {
            throw InputError(fmt::format("{}.npy: non-finite value {} at {} (shape {})", name, t[k],
                                         index_string(t.shape(), k), t.shape().to_string()));
        }
    }
    return t;
}

Inputs load_inputs(const fs::path& dir) {
    if (!fs::is_directory(dir)) throw InputError(fmt::format("--inputs '{}' is not a directory", dir.string()));
    Inputs in{load_input(dir, "X", 2), load_input(dir, "Wq", 2), load_input(dir, "Wk", 2), load_input(dir, "Wv", 2),
              load_input(dir, "G", 2)};
    const std::size_t T = in.X.rows(), D = in.X.cols();
    for (const auto& [name, W] : {std::pair{"Wq", &in.Wq}, std::pair{"Wk", &in.Wk}, std::pair{"Wv", &in.Wv}}) {
        if (W->rows() != D) {
            throw InputError(fmt::format("{}.npy has shape {} but X.npy is {}: {} needs D = {} rows", name,
                                         W->shape().to_string(), in.X.shape().to_string(), name, D));
        }
    }
    if (in.Wq.cols() != in.Wk.cols()) {
        throw InputError(fmt::format("Wq.npy is {} and Wk.npy is {}: queries and keys need one width d",
                                     in.Wq.shape().to_string(), in.Wk.shape().to_string()));
    }
    if (!(in.G.shape() == Shape{T, in.Wv.cols()})) {
        throw InputError(fmt::format("G.npy has shape {} but O is [{}x{}] (T from X.npy, r from Wv.npy)",
                                     in.G.shape().to_string(), T, in.Wv.cols()));
    }
    return in;
}

template <Scalar T>
struct Outputs {
    Var<T> A, O, J;
};

// The graph, for any scalar type: the tool's double run and the checker's two tapes share it.
// Attention itself is the library's (models/attention.hpp); the tool adds the probe J.
template <Scalar T>
Outputs<T> attention_probe(const Var<T>& X, const Var<T>& Wq, const Var<T>& Wk, const Var<T>& Wv,
                           const Tensor<double>& G, bool causal) {
    const AttentionResult<T> attn = causal ? causal_attention(X, Wq, Wk, Wv) : attention(X, Wq, Wk, Wv);
    const Var<T> J = sum(attn.O * X.tape().constant(tensor_cast<T>(G), "G")).named("J");
    return {attn.A, attn.O, J};
}

// Writes every file under a temporary name, then renames them all into place; on failure
// removes what it wrote, so the directory holds all the outputs or none of the new ones.
void write_outputs_atomically(const fs::path& dir, const std::vector<std::pair<std::string, Tensor<double>>>& files) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (!fs::is_directory(dir)) {
        throw InputError(fmt::format("--outputs '{}' is not a directory and cannot be created{}", dir.string(),
                                     ec ? ": " + ec.message() : ""));
    }
    std::vector<fs::path> temporaries;
    try {
        for (const auto& [name, tensor] : files) {
            temporaries.push_back(dir / fmt::format(".{}.npy.tmp-{}", name, ::getpid()));
            save_npy(temporaries.back(), tensor);
        }
        for (std::size_t f = 0; f < files.size(); ++f) fs::rename(temporaries[f], dir / (files[f].first + ".npy"));
    } catch (...) {
        for (const fs::path& temporary : temporaries) fs::remove(temporary, ec);
        throw;
    }
}

int run(const po::variables_map& options) {
    const bool causal = options.count("causal") > 0, check = options.count("check") > 0;
    const Inputs in = load_inputs(options["inputs"].as<std::string>());

    Tape<double> tape;
    const Var<double> X = tape.leaf(in.X, "X"), Wq = tape.leaf(in.Wq, "Wq"), Wk = tape.leaf(in.Wk, "Wk"),
                      Wv = tape.leaf(in.Wv, "Wv");
    const Outputs<double> out = attention_probe(X, Wq, Wk, Wv, in.G, causal);
    tape.backward(out.J);

    if (check) {
        CheckOptions check_options;
        if (options.count("fast")) check_options.mode = CheckOptions::Mode::fast;
        const CheckReport report = check_gradients(
            [&](auto leaves) {
                const auto [cX, cWq, cWk, cWv] = leaves;
                return attention_probe(cX, cWq, cWk, cWv, in.G, causal).J;
            },
            {{"X", in.X}, {"Wq", in.Wq}, {"Wk", in.Wk}, {"Wv", in.Wv}}, check_options);
        fmt::print("{}\n", report.summary());
        if (!report.passed) {
            fmt::print(stderr, "tapegrad-attention: the gradient check failed; no outputs written\n");
            return exit_check_failed;
        }
    }

    if (options.count("outputs")) {
        const fs::path dir = options["outputs"].as<std::string>();
        write_outputs_atomically(dir, {{"O", out.O.value()},
                                       {"A", out.A.value()},
                                       {"J", out.J.value()},
                                       {"dX", X.grad()},
                                       {"dWq", Wq.grad()},
                                       {"dWk", Wk.grad()},
                                       {"dWv", Wv.grad()}});
        fmt::print("J = {}; wrote O, A, J, dX, dWq, dWk, dWv to {}\n", out.J.value(), dir.string());
    } else if (!check) {
        fmt::print("J = {} (no --outputs given, nothing written)\n", out.J.value());
    }
    return exit_ok;
}

std::string one_line(std::string text) {
    for (char& c : text)
        if (c == '\n' || c == '\r') c = ' ';
    return text;
}

}  // namespace

int main(int argc, char** argv) {
    po::options_description visible{std::string(description)};
    visible.add_options()                                                                   //
        ("help,h", "print this help")                                                       //
        ("inputs,i", po::value<std::string>()->value_name("DIR"), "directory with X, Wq, Wk, Wv, G .npy files")  //
        ("outputs,o", po::value<std::string>()->value_name("DIR"), "directory for O, A, J, dX, dWq, dWk, dWv")  //
        ("causal", "hide future positions: query i sees keys j <= i")                      //
        ("check", "run the 50-digit gradient checker; exit 3 when it fails")               //
        ("fast", "with --check: random directional derivatives instead of every coordinate");
    po::variables_map options;
    try {
        po::store(cli::options_only(argc, argv, visible, "tapegrad-attention"), options);
        po::notify(options);
        if (options.count("help")) {
            fmt::print("{}\n", fmt::streamed(visible));
            return exit_ok;
        }
        if (!options.count("inputs")) throw po::error("--inputs DIR is required (see --help)");
        if (!options.count("outputs") && !options.count("check")) {
            throw po::error("nothing to do: give --outputs DIR, --check, or both (see --help)");
        }
        if (options.count("fast") && !options.count("check")) throw po::error("--fast only applies to --check");
    } catch (const po::error& e) {
        fmt::print(stderr, "tapegrad-attention: {}\n", one_line(e.what()));
        return exit_usage;
    }
    try {
        return run(options);
    } catch (const std::exception& e) {
        fmt::print(stderr, "tapegrad-attention: {}\n", one_line(e.what()));
    } catch (...) {
        fmt::print(stderr, "tapegrad-attention: unknown error\n");
    }
    return exit_error;
}
