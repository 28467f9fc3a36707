/// \file
/// The precision audit of a recorded tape: which node of a float32 (or double) graph loses the
/// digits of its gradients, and how many. The checker (check/recorded.hpp) proves the gradient of
/// the function a tape recorded to 1e-9 or 1e-25; the audit measures what the tape's own precision
/// made of that gradient, node by node:
///
///     Tape<float> tape;  ...record a training step...;  Var<float> J = ...;
///     PrecisionAudit audit = audit_precision(tape, J);
///     fmt::print("{}", audit.table());      // ranked by the digits each node loses itself
///     std::ofstream("audit.json") << audit.json();   std::ofstream("audit.dot") << audit.dot();
///
/// The truth is the same tape re-run at 50 digits on the same leaves and constants (its values and
/// adjoints). For every node the audit reports
///   * `value`, `adjoint`: the error of the value the low-precision run holds there and of the
///     gradient flowing into it (everything upstream carried along);
///   * `local_forward`, `local_vjp`: the error the node makes itself: its op evaluated in the low
///     precision on the exact inputs (50-digit values rounded to it), and its VJP on the exact
///     inputs and the exact upstream gradient (rounded), against the op at 50 digits. This lays an
///     error at the node that makes it, not at every node that carries it; the table is ranked by
///     it (in units of u, so that below one u the order still says where the rounding is).
/// and for every leaf its gradient's error (beside the error estimate_precision predicted for it
/// without the 50 digits: on a float tape whose products are bfloat16, that prediction is the
/// model of the bfloat16 error held to the actual bfloat16 run), the branches it sums (one per consuming edge, the
/// checker's attribution: X via Q, K and V), and the node that contributes most: of the nodes that
/// lose the most digits locally, the one whose low-precision evaluation alone (every other node
/// exact) moves that gradient most.
///
/// Errors are relative: normwise ‖low − true‖₂ / ‖true‖₂, and per element |low − true| / |true|.
/// `in_u` is the normwise error in units of the precision's unit roundoff u (2⁻²⁴ for float, 2⁻⁵³
/// for double, 2⁻⁸ for bfloat16, 2⁻¹¹ for float16), `digits_lost` is log10(normwise / u), between 0
/// (an error below u) and log10(1/u) (nothing right; also a value that overflowed to inf or NaN,
/// which the audit reports as not finite instead of letting it through).
///
/// Storage::bfloat16 and Storage::float16 answer "what would this graph lose in bf16?" before
/// anyone trains it that way: every value and every gradient the graph keeps is rounded to that
/// format (to nearest, ties to even; overflow to inf), and each op computes in the recorded
/// precision on those values, as mixed-precision training keeps activations and gradients in
/// 16 bits and accumulates in float32. A node's local error then includes the rounding of what it
/// produces to the storage format (its value; its VJP's contributions); a leaf's or constant's is
/// the rounding of its value. What an op saves for its VJP (indices, statistics) stays in the
/// computing precision.
///
/// Compiled in the library; this header includes nothing of the 50-digit side. Every op on the tape
/// needs its siblings (autodiff/rerun.hpp), as for the check of a recorded tape.
#pragma once

#include "autodiff/tape.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tapegrad {

/// The format values and gradients are kept in during the audited run.
enum class Storage { recorded, bfloat16, float16 };

struct AuditOptions {
    Storage storage = Storage::recorded;
    /// Candidates for a leaf's largest contributor: this many nodes of largest local error, each
    /// evaluated alone in low precision (one extra forward and backward each).
    std::size_t contributor_candidates = 8;
    bool progress = false;  ///< one line on stderr per stage and contributor run, with the seconds so far
};

/// One error, of a tensor held in low precision against its 50-digit truth.
struct AuditError {
    double normwise = 0;       ///< ‖low − true‖₂ / ‖true‖₂ (‖low − true‖₂ when true is zero)
    double worst_element = 0;  ///< max |low − true| / |true| over the elements (0/0 counts as 0)
    std::string worst_at;      ///< that element's index, "(i, j)"
    double ulps = 0;           ///< max |low − true| in units in the last place of the true value, in the storage format
    double in_u = 0;           ///< normwise / u
    double digits_lost = 0;    ///< log10(normwise / u), clipped to [0, log10(1/u)]
    bool finite = true;        ///< false when the low-precision tensor holds inf or NaN
    bool measured = false;     ///< false where there is nothing to measure (a node with no gradient)
};

struct NodeAudit {
    std::uint32_t node = 0;
    std::string op;  ///< "leaf", "constant" or the op's name
    std::string label;
    std::string shape;
    AuditError value, adjoint;
    AuditError local_forward;
    AuditError local_vjp;     ///< the worst over the node's inputs that need a gradient
    double local_digits = 0;  ///< max(local_forward, local_vjp) digits lost
    double local_in_u = 0;    ///< max(local_forward, local_vjp) in units of u: the ranking key
};

struct BranchAudit {
    std::uint32_t consumer = 0;  ///< the node that uses the leaf
    std::uint32_t slot = 0;      ///< as its input number
    std::string op;
    AuditError error;  ///< that edge's VJP contribution, as the low-precision run computed it
};

struct LeafAudit {
    std::uint32_t node = 0;
    std::string name;  ///< the leaf's label, or "leaf N"
    AuditError gradient;
    std::vector<BranchAudit> branches;  ///< when the leaf feeds more than one op input
    std::uint32_t top_contributor = 0;  ///< the node whose low precision alone moves this gradient most
    std::string top_contributor_op;
    double top_contributor_share = 0;  ///< its error alone over the whole error (normwise)
    /// The error predicted before the 50-digit run: estimate_precision's spread of this gradient
    /// (below), to set beside the measured `gradient.normwise`. Only for Storage::recorded (the
    /// estimate models the recorded run, not a simulated storage format).
    std::optional<double> predicted;
};

/// What the low precision did that no error figure says: an op refusing a value its storage made
/// (`sqrt` of a variance that went negative in bfloat16, `log` of a value rounded to 0), or a
/// value or gradient that became inf or NaN where the truth is finite (a float16 overflow, inf −
/// inf). The audit goes on past each: the node's value is NaN from there, and the nodes downstream
/// are audited with it.
struct AuditEvent {
    std::uint32_t node = 0;
    std::string op;    ///< the node's op
    std::string run;   ///< where: "the bfloat16 (computing in float32) run", "node 7 alone in ...", ...
    std::string what;  ///< the op's message, or "value at (0, 1) is inf (true 7.2e+04)"
};

struct PrecisionAudit {
    std::string precision;  ///< "float32", "float64", or "bfloat16 (computing in float32)", ...
    double unit_roundoff = 0;
    std::vector<NodeAudit> nodes;   ///< ranked: largest local error first
    std::vector<LeafAudit> leaves;  ///< in recorded order
    std::vector<AuditEvent> events;  ///< in the order met; at most one per node and run
    double seconds = 0;

    /// The ranked table (its first `rows` nodes) and the leaves, as text.
    std::string table(std::size_t rows = 20) const;
    /// Everything, as one JSON document (non-finite numbers as null).
    std::string json() const;
    /// The tape's picture (io/graphviz.hpp's layout) with each node filled by its local error:
    /// white (nothing lost) to red (every digit lost), the digits in its label.
    std::string dot() const;

    std::vector<std::vector<std::uint32_t>> inputs;  ///< by node index: the nodes it reads (for dot())

    const NodeAudit& worst() const;  ///< nodes.front(); usage_error when empty
};

PrecisionAudit audit_precision(const Tape<float>& tape, const Var<float>& J, const AuditOptions& options = {});
PrecisionAudit audit_precision(const Tape<double>& tape, const Var<double>& J, const AuditOptions& options = {});

/// Without 50 digits: an estimate of each leaf gradient's error from a few runs of the recording in
/// its own precision with random rounding (each node's stored results moved to a random neighbour
/// in the last place, as Monte Carlo arithmetic does per operation: Verificarlo's random rounding,
/// here at node granularity). The spread of the runs' gradients (normwise standard deviation over
/// the mean's norm) estimates the error without a 50-digit re-run, so it runs at any size. It
/// perturbs results, not the arithmetic inside an op, so it sees how the graph carries rounding,
/// not an op's own cancellation (E[x²] − E[x]²): that takes the audit. What an op reads in a 16-bit
/// format (its `input_format`, autodiff/op.hpp: matmul_bf16's bfloat16 inputs and upstream
/// gradient) is drawn the same way in that format: moved by up to half its last place before the
/// op rounds it, which makes the op's rounding stochastic (unbiased; √2 times round-to-nearest's
/// root-mean-square error), so the spread sees bfloat16 where the run reads bfloat16.
struct EstimateOptions {
    std::size_t runs = 8;
    std::uint64_t seed = 1;
};

struct LeafEstimate {
    std::uint32_t node = 0;
    std::string name;
    double normwise = 0;     ///< the runs' spread: ‖std‖₂ / ‖mean‖₂
    double digits_lost = 0;  ///< log10(normwise / u), clipped to [0, log10(1/u)]
};

struct PrecisionEstimate {
    std::string precision;
    double unit_roundoff = 0;
    std::size_t runs = 0;
    std::vector<LeafEstimate> leaves;
    double seconds = 0;

    std::string table() const;
};

PrecisionEstimate estimate_precision(const Tape<float>& tape, const Var<float>& J, const EstimateOptions& options = {});
PrecisionEstimate estimate_precision(const Tape<double>& tape, const Var<double>& J,
                                     const EstimateOptions& options = {});

/// The format named "recorded", "bfloat16" or "float16" (the programs' --storage words); nothing
/// for another name.
std::optional<Storage> storage_named(std::string_view name);

/// A value rounded to the storage format (exact for Storage::recorded): what the audit applies.
double round_to(Storage storage, double x);

}  // namespace tapegrad
