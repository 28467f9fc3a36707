// The precision audit of a recorded tape (check/audit.hpp), compiled once in the library. Its
// stages: the tape re-run at 50 digits (the truth: values and adjoints); the low-precision run (the
// recorded ops in the recorded precision, values and gradients kept in the storage format); each
// node evaluated alone in low precision on exact inputs (its local error); and, for the leaves'
// largest contributors, runs with one node in low precision and every other one exact. The
// computation only: its table, JSON and picture are src/check/audit_report.cpp.
#include "check/audit.hpp"
#include "autodiff/low_precision.hpp"

#include "autodiff/mp50.hpp"
#include "autodiff/rerun.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace tapegrad {

std::optional<Storage> storage_named(std::string_view name) {
    if (name == "recorded") return Storage::recorded;
    if (name == "bfloat16") return Storage::bfloat16;
    if (name == "float16") return Storage::float16;
    return std::nullopt;
}

double round_to(Storage storage, double x) {
    switch (storage) {  // once from double, ties to even, gradual underflow, ±inf past the largest
        case Storage::recorded:
            return x;
        case Storage::bfloat16:
            return round_to_half(bfloat16_format, x);
        case Storage::float16:
            return round_to_half(float16_format, x);
    }
    return x;
}

namespace {

// The arithmetic errors are measured in: significant bits, smallest normal exponent, unit roundoff.
struct Precision {
    std::string name;
    int bits;
    int min_exponent;
    double u;
};

template <Scalar S>
Precision precision_of(Storage storage) {
    const std::string computing = std::is_same_v<S, float> ? "float32" : "float64";
    switch (storage) {
        case Storage::bfloat16:
            return {"bfloat16 (computing in " + computing + ")", 8, -126, 0x1p-8};
        case Storage::float16:
            return {"float16 (computing in " + computing + ")", 11, -14, 0x1p-11};
        case Storage::recorded:
            break;
    }
    return {computing, std::numeric_limits<S>::digits, std::numeric_limits<S>::min_exponent - 1,
            std::ldexp(1.0, -std::numeric_limits<S>::digits)};
}

template <Scalar To, Scalar From>
Tensor<To> convert(const Tensor<From>& x) {
    if constexpr (std::is_same_v<To, From>) {
        return x;
    } else {
        Tensor<To> out(x.shape());
        for (std::size_t k = 0; k < x.size(); ++k) out[k] = static_cast<To>(x[k]);
        return out;
    }
}

// `x` (of the computing precision) as the storage format keeps it.
template <Scalar S>
void store(Tensor<S>& x, Storage storage) {
    if (storage == Storage::recorded) return;
    for (std::size_t k = 0; k < x.size(); ++k) x[k] = static_cast<S>(round_to(storage, static_cast<double>(x[k])));
}

template <Scalar S, Scalar From>
Tensor<S> lowered(const Tensor<From>& x, Storage storage) {
    Tensor<S> out = convert<S>(x);
    store(out, storage);
    return out;
}

template <Scalar T>
std::vector<const Tensor<T>*> pointers(const std::vector<Tensor<T>>& tensors) {
    std::vector<const Tensor<T>*> out;
    for (const Tensor<T>& t : tensors) out.push_back(&t);
    return out;
}

// The error of `low` against `truth`, in the given precision.
template <Scalar L>
AuditError measure(const Tensor<L>& low, const Tensor<mp50>& truth, const Precision& p) {
    AuditError e;
    e.measured = true;
    double difference2 = 0, truth2 = 0;
    for (std::size_t k = 0; k < low.size(); ++k) {
        if (!std::isfinite(to_double(low[k]))) {
            // An infinity the truth holds too (a mask's −inf) is exact; any other is a lost value.
            if (to_double(low[k]) != to_double(truth[k])) e.finite = false;
            continue;
        }
        const double d = std::fabs(to_double(mp50(low[k]) - truth[k]));
        const double t = std::fabs(to_double(truth[k]));
        difference2 += d * d;
        truth2 += t * t;
        const double relative = d == 0 ? 0 : t == 0 ? std::numeric_limits<double>::infinity() : d / t;
        if (relative > e.worst_element) {
            e.worst_element = relative;
            e.worst_at = index_string(low.shape(), k);
        }
        const int exponent = t == 0 ? p.min_exponent : std::max(std::ilogb(t), p.min_exponent);
        e.ulps = std::max(e.ulps, d / std::ldexp(1.0, exponent - p.bits + 1));
    }
    const double most = std::log10(1 / p.u);
    if (!e.finite) {
        e.normwise = e.in_u = e.worst_element = e.ulps = std::numeric_limits<double>::infinity();
        e.digits_lost = most;
        return e;
    }
    e.normwise = truth2 > 0 ? std::sqrt(difference2 / truth2) : std::sqrt(difference2);
    e.in_u = e.normwise / p.u;
    e.digits_lost = e.in_u <= 1 ? 0 : std::min(std::log10(e.in_u), most);
    return e;
}

// The worse of two errors (by digits lost, then by normwise error).
AuditError worse(const AuditError& a, const AuditError& b) {
    if (!a.measured) return b;
    if (!b.measured) return a;
    return std::pair(b.digits_lost, b.normwise) > std::pair(a.digits_lost, a.normwise) ? b : a;
}

template <Scalar T>
Tensor<T> not_a_number(const Shape& shape) {
    return Tensor<T>(shape, T(std::numeric_limits<double>::quiet_NaN()));
}

using EdgeKey = std::pair<std::uint32_t, std::uint32_t>;  // (consumer node, input slot)

// The audit's events (check/audit.hpp's AuditEvent): what the low precision made that an op refused
// or that became inf or NaN, at most one per node and run (the first: the cause).
class EventLog {
public:
    void add(std::uint32_t node, std::string_view op, std::string_view run, std::string what) {
        if (!seen_.insert({node, std::string(run)}).second) return;
        events_.push_back({node, std::string(op), std::string(run), std::move(what)});
    }
    std::vector<AuditEvent> take() { return std::move(events_); }

private:
    std::set<std::pair<std::uint32_t, std::string>> seen_;
    std::vector<AuditEvent> events_;
};

// Which non-finite values a node is the first to make: an infinity where its inputs were finite, a
// NaN where they held none (inf − inf).
struct Arising {
    bool inf = true, nan = true;
};

// The first element of `low` that arises as inf or NaN where the truth is finite, as text; empty if none.
template <Scalar L>
std::string lost_element(const Tensor<L>& low, const Tensor<mp50>& truth, std::string_view what, Arising arising) {
    for (std::size_t k = 0; k < low.size(); ++k) {
        const double x = to_double(low[k]), t = to_double(truth[k]);
        if (!std::isfinite(t) || !((std::isnan(x) && arising.nan) || (std::isinf(x) && arising.inf))) continue;
        return fmt::format("{} at {} is {} (true {:.6g})", what, index_string(low.shape(), k),
                           std::isnan(x) ? "NaN" : x > 0 ? "inf" : "-inf", t);
    }
    return {};
}

// One run over the recorded graph with values of type W: each node either exact (its op at W, from
// the exact tape, a re-run of the recording) or low (its op at the recorded type S, on its inputs
// and upstream gradient converted to S, its value and its VJP's results kept in the storage
// format). A node stores what it produces; what it reads was stored by its producers, so the
// rounding of a value to 16 bits is laid at the node that made the value.
template <Scalar W, Scalar S>
struct Run {
    Run(const Tape<S>& recorded_tape, const Tape<W>& exact_tape, const std::vector<std::uint32_t>& index,
        std::uint32_t output_node, Storage kept_as, std::function<bool(std::uint32_t)> is_low)
        : recorded(recorded_tape),
          exact(exact_tape),
          exact_index(index),
          output(output_node),
          storage(kept_as),
          low(std::move(is_low)) {}

    const Tape<S>& recorded;
    const Tape<W>& exact;
    const std::vector<std::uint32_t>& exact_index;  // node i of the recording is node exact_index[i] there
    std::uint32_t output;
    Storage storage;
    std::function<bool(std::uint32_t)> low;
    // Applied to every result a low node stores (values, VJP contributions, sums of them): the
    // Monte Carlo estimate's random rounding; empty for the audit.
    std::function<void(Tensor<S>&)> perturb{};
    // Applied to what a low node reads in a 16-bit format (its op's input_format: matmul_bf16's
    // inputs and upstream gradient), before the op rounds it: the estimate's random rounding of
    // that format; empty for the audit.
    std::function<void(Tensor<S>&, const HalfFormat&)> perturb_read{};
    // Where an op's refusal is noted (none: not noted), and the run's name in the note.
    EventLog* log = nullptr;
    std::string name{};
    // Every node low (the audit's low run, the estimate's runs): a sum of gradients is then kept in
    // the storage format. A run with one node low sums exact contributions, and keeps them exact
    // also where W is S (a double tape's contributor runs in 16 bits).
    bool all_low = false;

    std::vector<Tensor<W>> values, adjoints, saved_exact;
    std::vector<Tensor<S>> saved_low;
    std::vector<char> has_adjoint;
    std::map<EdgeKey, Tensor<W>> leaf_edges;  // contributions into gradient leaves, when kept

    void forward() {
        const std::size_t n = output + 1;
        values.assign(n, {});
        saved_exact.assign(n, {});
        saved_low.assign(n, {});
        for (std::uint32_t i = 0; i < n; ++i) {
            const auto node = recorded.recorded(i);
            const auto again = exact.recorded(exact_index[i]);
            if (node.kind == nullptr) {
                values[i] = low(i) ? convert<W>(lowered<S>(again.value, storage)) : again.value;
            } else if (low(i)) {
                std::vector<Tensor<S>> in = low_inputs(node.inputs);
                read_in_format(node.kind, in);
                Tensor<S> out;
                try {
                    node.kind->forward(node.settings, pointers(in), out, saved_low[i]);
                    store(out, storage);
                    if (perturb) perturb(out);
                    values[i] = convert<W>(out);
                } catch (const error& e) {  // an op refusing what the low precision made: its value is lost
                    values[i] = not_a_number<W>(again.value.shape());
                    note(i, e.what());
                }
            } else {
                try {
                    again.kind->forward(again.settings, inputs(node.inputs), values[i], saved_exact[i]);
                } catch (const error& e) {  // an exact node fed what a low node made
                    values[i] = not_a_number<W>(again.value.shape());
                    note(i, e.what());
                }
            }
        }
    }

    void backward(bool keep_leaf_edges) {
        adjoints.assign(output + 1, {});
        has_adjoint.assign(output + 1, 0);
        adjoints[output] = Tensor<W>(values[output].shape(), W(1));
        has_adjoint[output] = 1;
        for (std::uint32_t i = output + 1; i-- > 0;) {
            const auto node = recorded.recorded(i);
            if (node.kind == nullptr || !node.requires_grad || !has_adjoint[i]) continue;
            const std::vector<Tensor<W>> contributions = vjp(i);
            for (std::uint32_t slot = 0; slot < node.inputs.size(); ++slot) {
                if (!needs_gradient(node.inputs[slot])) continue;
                accumulate(node.inputs[slot], contributions[slot]);
                const auto input = recorded.recorded(node.inputs[slot]);
                if (keep_leaf_edges && input.kind == nullptr) leaf_edges[{i, slot}] = contributions[slot];
            }
        }
    }

private:
    bool needs_gradient(std::uint32_t i) const { return recorded.recorded(i).requires_grad; }

    void note(std::uint32_t i, std::string_view what) const {
        if (log != nullptr) log->add(i, recorded.recorded(i).kind->name, name, std::string(what));
    }

    std::vector<const Tensor<W>*> inputs(std::span<const std::uint32_t> indices) const {
        std::vector<const Tensor<W>*> in;
        for (const std::uint32_t k : indices) in.push_back(&values[k]);
        return in;
    }

    void read_in_format(const OpKind<S>* kind, std::vector<Tensor<S>>& read) const {
        if (!perturb_read || kind->input_format == nullptr) return;
        for (Tensor<S>& x : read) perturb_read(x, *kind->input_format);
    }

    std::vector<Tensor<S>> low_inputs(std::span<const std::uint32_t> indices) const {
        std::vector<Tensor<S>> in;
        for (const std::uint32_t k : indices) in.push_back(convert<S>(values[k]));
        return in;
    }

    // Node i's contribution to each of its inputs (an empty tensor where none is needed).
    std::vector<Tensor<W>> vjp(std::uint32_t i) {
        const auto node = recorded.recorded(i);
        std::vector<Tensor<W>> contributions(node.inputs.size());
        if (low(i)) {
            std::vector<Tensor<S>> in = low_inputs(node.inputs);
            in.push_back(convert<S>(adjoints[i]));  // G, read as the inputs are
            read_in_format(node.kind, in);
            const Tensor<S> G = std::move(in.back());
            in.pop_back();
            const Tensor<S> out = convert<S>(values[i]);
            std::vector<Tensor<S>> grads(node.inputs.size());
            std::vector<Tensor<S>*> slots(node.inputs.size(), nullptr);
            for (std::size_t s = 0; s < slots.size(); ++s) {
                if (!needs_gradient(node.inputs[s])) continue;
                grads[s].resize(in[s].shape());
                slots[s] = &grads[s];
            }
            const std::vector<const Tensor<S>*> in_pointers = pointers(in);
            try {
                node.kind->vjp_all(node.settings, VjpArgs<S>{in_pointers, out, saved_low[i], G}, slots);
            } catch (const error& e) {
                for (Tensor<S>& g : grads) g.fill(std::numeric_limits<S>::quiet_NaN());
                note(i, e.what());
            }
            for (std::size_t s = 0; s < slots.size(); ++s) {
                if (slots[s] == nullptr) continue;
                store(grads[s], storage);
                if (perturb) perturb(grads[s]);
                contributions[s] = convert<W>(grads[s]);
            }
        } else {
            const auto again = exact.recorded(exact_index[i]);
            std::vector<Tensor<W>*> slots(node.inputs.size(), nullptr);
            for (std::size_t s = 0; s < slots.size(); ++s) {
                if (!needs_gradient(node.inputs[s])) continue;
                contributions[s].resize(values[node.inputs[s]].shape());
                slots[s] = &contributions[s];
            }
            const std::vector<const Tensor<W>*> in = inputs(node.inputs);
            try {
                again.kind->vjp_all(again.settings, VjpArgs<W>{in, values[i], saved_exact[i], adjoints[i]}, slots);
            } catch (const error& e) {  // an exact node's VJP fed what a low node made
                for (Tensor<W>& g : contributions) g.fill(W(std::numeric_limits<double>::quiet_NaN()));
                note(i, e.what());
            }
        }
        return contributions;
    }

    void accumulate(std::uint32_t target, const Tensor<W>& contribution) {
        const bool has_sum = has_adjoint[target] != 0;  // a first contribution is stored as it came
        if (!has_sum) {
            adjoints[target] = contribution;
            has_adjoint[target] = 1;
        } else {
            Tensor<W>& sum = adjoints[target];
            for (std::size_t k = 0; k < sum.size(); ++k) sum[k] += contribution[k];
        }
        // The low run keeps every gradient in the storage format, as it keeps values.
        if constexpr (std::is_same_v<W, S>) {
            if (all_low && has_sum) {
                store(adjoints[target], storage);
                if (perturb) perturb(adjoints[target]);
            }
        }
    }
};

// The 50-digit truth: the recording re-run at mp50, its values and its adjoints (by recorded index).
struct Truth {
    Tape<mp50> tape;
    std::vector<Var<mp50>> nodes;
    std::vector<std::uint32_t> index;  // recorded node i is node index[i] of `tape`
};

template <Scalar S>
void take_truth(const Tape<S>& tape, const Var<S>& J, Truth& truth) {
    std::vector<Var<mp50>> leaves;
    for (const std::uint32_t i : gradient_leaves(tape, J)) {
        const auto node = tape.recorded(i);
        leaves.push_back(truth.tape.leaf(detail::tensor_as<mp50>(node.value), node.label));
    }
    const Var<mp50> J_precise = rerun(tape, J, std::span<const Var<mp50>>(leaves), &truth.nodes);
    truth.tape.backward(J_precise);
    for (const Var<mp50>& v : truth.nodes) truth.index.push_back(v.index());
}

// A node evaluated alone in low precision on its exact inputs and exact upstream gradient.
template <Scalar S>
struct LocalAudit {
    const Tape<S>& tape;
    const Truth& truth;
    const Precision& precision;
    Storage storage;
    std::map<EdgeKey, Tensor<mp50>> true_leaf_edges;  // the exact contributions into gradient leaves
    EventLog* log = nullptr;
    std::string name{};

    void run(std::uint32_t i, NodeAudit& audit) {
        const auto node = tape.recorded(i);
        const auto exact = truth.tape.recorded(truth.index[i]);
        if (node.kind == nullptr) {  // a leaf or constant: only the storage format's rounding
            audit.local_forward = measure(lowered<S>(exact.value, storage), exact.value, precision);
            return;
        }
        std::vector<Tensor<S>> in;
        std::vector<const Tensor<mp50>*> in_exact;
        for (const std::uint32_t k : node.inputs) {
            in_exact.push_back(&truth.tape.recorded(truth.index[k]).value);
            in.push_back(convert<S>(*in_exact.back()));
        }
        Tensor<S> out, saved;
        try {
            node.kind->forward(node.settings, pointers(in), out, saved);
        } catch (const error& e) {  // the op refused what its low-precision arithmetic made (an overflow)
            out = not_a_number<S>(exact.value.shape());
            log->add(i, node.kind->name, name, e.what());
        }
        store(out, storage);
        audit.local_forward = measure(out, exact.value, precision);
        if (!node.requires_grad) return;
        const Tensor<mp50>& G_exact = truth.nodes[i].grad();
        Tensor<mp50> out_exact, saved_exact;
        exact.kind->forward(exact.settings, in_exact, out_exact, saved_exact);
        std::vector<Tensor<mp50>> grads_exact(in.size());
        std::vector<Tensor<S>> grads(in.size());
        std::vector<Tensor<mp50>*> slots_exact(in.size(), nullptr);
        std::vector<Tensor<S>*> slots(in.size(), nullptr);
        for (std::size_t s = 0; s < in.size(); ++s) {
            if (!tape.recorded(node.inputs[s]).requires_grad) continue;
            grads_exact[s].resize(in[s].shape());
            grads[s].resize(in[s].shape());
            slots_exact[s] = &grads_exact[s];
            slots[s] = &grads[s];
        }
        exact.kind->vjp_all(exact.settings, VjpArgs<mp50>{in_exact, out_exact, saved_exact, G_exact}, slots_exact);
        const Tensor<S> G = convert<S>(G_exact);
        const std::vector<const Tensor<S>*> in_pointers = pointers(in);
        try {
            if (audit.local_forward.finite)
                node.kind->vjp_all(node.settings, VjpArgs<S>{in_pointers, out, saved, G}, slots);
            else
                for (Tensor<S>& g : grads) g.fill(std::numeric_limits<S>::quiet_NaN());
        } catch (const error& e) {
            for (Tensor<S>& g : grads) g.fill(std::numeric_limits<S>::quiet_NaN());
            log->add(i, node.kind->name, name, e.what());
        }
        for (std::size_t s = 0; s < in.size(); ++s) {
            if (slots[s] == nullptr) continue;
            store(grads[s], storage);
            audit.local_vjp = worse(audit.local_vjp, measure(grads[s], grads_exact[s], precision));
            if (tape.recorded(node.inputs[s]).kind == nullptr) true_leaf_edges[{i, s}] = std::move(grads_exact[s]);
        }
    }
};

// A value or gradient of the low run that is inf or NaN where the truth is finite, noted at the node
// where it arises (see Arising; a gradient, where the node's own value is finite).
template <Scalar S>
void note_lost_values(const Run<S, S>& low, const Truth& truth, std::uint32_t i, EventLog& log) {
    const auto node = low.recorded.recorded(i);
    const auto all = [](const Tensor<S>& t, auto predicate) {
        return std::all_of(t.data().begin(), t.data().end(), [&](const S& x) { return predicate(to_double(x)); });
    };
    const auto finite = [](double x) { return std::isfinite(x); };
    const auto not_nan = [](double x) { return !std::isnan(x); };
    Arising arising;
    for (const std::uint32_t k : node.inputs) {
        arising.inf = arising.inf && all(low.values[k], finite);
        arising.nan = arising.nan && all(low.values[k], not_nan);
    }
    std::string what = lost_element(low.values[i], truth.tape.recorded(truth.index[i]).value, "value", arising);
    if (what.empty() && node.requires_grad && low.has_adjoint[i] && all(low.values[i], finite))
        what = lost_element(low.adjoints[i], truth.nodes[i].grad(), "gradient", Arising{});
    const std::string op = node.kind != nullptr ? std::string(node.kind->name) : node.requires_grad ? "leaf" : "constant";
    if (!what.empty()) log.add(i, op, low.name, std::move(what));
}

// One line on stderr per stage when asked, with the seconds since the audit began: a large tape's
// 50-digit stages take minutes, and the lines say which.
struct Progress {
    bool on;
    std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

    void operator()(std::string_view stage) const {
        if (!on) return;
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        fmt::print(stderr, "audit_precision: {:8.1f} s  {}\n", seconds, stage);
    }
};

template <Scalar S>
NodeAudit describe(const Tape<S>& tape, std::uint32_t i) {
    const auto node = tape.recorded(i);
    NodeAudit audit;
    audit.node = i;
    audit.op = node.kind != nullptr ? std::string(node.kind->name) : node.requires_grad ? "leaf" : "constant";
    audit.label = std::string(node.label);
    audit.shape = node.value.shape().to_string();
    return audit;
}

// For each leaf, the candidate whose low precision alone moves its gradient most: one run per
// candidate at W (double when the audited precision is float32 or 16 bits, else long double), every
// other node exact.
template <Scalar W, Scalar S>
void find_contributors(const Tape<S>& tape, const Tape<W>& exact, const std::vector<std::uint32_t>& exact_index,
                       const Var<S>& J, Storage storage, const Truth& truth, const Precision& precision,
                       std::span<const std::uint32_t> candidates, std::vector<LeafAudit>& leaves, EventLog& log,
                       const Progress& progress) {
    std::vector<double> best(leaves.size(), -1);
    for (std::size_t run_number = 1; const std::uint32_t c : candidates) {
        progress(fmt::format("node {} ({}) alone in {}, run {} of {}", c, describe(tape, c).op, precision.name,
                             run_number++, candidates.size()));
        Run<W, S> run(tape, exact, exact_index, J.index(), storage, [c](std::uint32_t i) { return i == c; });
        run.log = &log;
        run.name = fmt::format("node {} alone in {}", c, precision.name);
        run.forward();
        run.backward(false);
        for (LeafAudit& leaf : leaves) {
            if (!run.has_adjoint[leaf.node]) continue;
            const double error = measure(run.adjoints[leaf.node], truth.nodes[leaf.node].grad(), precision).normwise;
            const std::size_t at = static_cast<std::size_t>(&leaf - leaves.data());
            if (error > best[at]) {
                best[at] = error;
                leaf.top_contributor = c;
                leaf.top_contributor_op = describe(tape, c).op;
                const double whole = leaf.gradient.normwise;  // inf when the gradient is lost: no share
                leaf.top_contributor_share = whole > 0 && std::isfinite(whole) ? error / whole : 0;
            }
        }
    }
}

// find_contributors with the exact part of each run at W: the tape re-run at W once, shared.
template <Scalar W, Scalar S>
void contributor_runs(const Tape<S>& tape, const Var<S>& J, Storage storage, const Truth& truth,
                      const Precision& precision, std::span<const std::uint32_t> candidates,
                      std::vector<LeafAudit>& leaves, EventLog& log, const Progress& progress) {
    Tape<W> exact;
    std::vector<Var<W>> exact_leaves, mapped;
    for (const std::uint32_t i : gradient_leaves(tape, J))
        exact_leaves.push_back(exact.leaf(detail::tensor_as<W>(tape.recorded(i).value)));
    (void)rerun(tape, J, std::span<const Var<W>>(exact_leaves), &mapped);
    std::vector<std::uint32_t> index;
    for (const Var<W>& v : mapped) index.push_back(v.index());
    find_contributors(tape, exact, index, J, storage, truth, precision, candidates, leaves, log, progress);
}

template <Scalar S>
PrecisionEstimate estimate(const Tape<S>& tape, const Var<S>& J, const EstimateOptions& options);

template <Scalar S>
PrecisionAudit audit(const Tape<S>& tape, const Var<S>& J, const AuditOptions& options) {
    const Progress progress{options.progress};
    if (!tape.holds(J)) {
        throw usage_error("audit_precision: J is not a value of this tape (another tape's, or from before a clear())");
    }
    if (J.value().size() != 1) {
        throw shape_error(
            fmt::format("audit_precision: J must hold one element (a loss); it is {}", J.shape().to_string()));
    }
    const Precision precision = precision_of<S>(options.storage);
    PrecisionAudit result;
    result.precision = precision.name;
    result.unit_roundoff = precision.u;

    progress("re-running the tape at 50 digits (values and adjoints)");
    Truth truth;
    take_truth(tape, J, truth);

    progress(fmt::format("the {} run", precision.name));
    std::vector<std::uint32_t> identity(J.index() + 1);
    for (std::uint32_t i = 0; i <= J.index(); ++i) identity[i] = i;
    EventLog log;
    Run<S, S> low(tape, tape, identity, J.index(), options.storage, [](std::uint32_t) { return true; });
    low.log = &log;
    low.name = fmt::format("the {} run", precision.name);
    low.all_low = true;
    low.forward();
    low.backward(true);

    progress("each node alone on exact inputs");
    LocalAudit<S> local{tape, truth, precision, options.storage, {}, &log,
                        fmt::format("the node alone on exact inputs in {}", precision.name)};
    std::vector<NodeAudit> nodes;
    result.inputs.resize(J.index() + 1);
    for (std::uint32_t i = 0; i <= J.index(); ++i) {
        const auto node = tape.recorded(i);
        result.inputs[i].assign(node.inputs.begin(), node.inputs.end());
        NodeAudit audit = describe(tape, i);
        audit.value = measure(low.values[i], truth.tape.recorded(truth.index[i]).value, precision);
        if (node.requires_grad && low.has_adjoint[i])
            audit.adjoint = measure(low.adjoints[i], truth.nodes[i].grad(), precision);
        note_lost_values(low, truth, i, log);
        local.run(i, audit);
        audit.local_digits = std::max(audit.local_forward.digits_lost, audit.local_vjp.digits_lost);
        audit.local_in_u = std::max(audit.local_forward.in_u, audit.local_vjp.in_u);
        nodes.push_back(std::move(audit));
    }

    for (const std::uint32_t i : gradient_leaves(tape, J)) {
        LeafAudit leaf;
        leaf.node = i;
        leaf.name = tape.recorded(i).label.empty() ? fmt::format("leaf {}", i) : std::string(tape.recorded(i).label);
        if (low.has_adjoint[i]) leaf.gradient = measure(low.adjoints[i], truth.nodes[i].grad(), precision);
        std::vector<BranchAudit> branches;
        for (const auto& [edge, contribution] : low.leaf_edges) {
            if (tape.recorded(edge.first).inputs[edge.second] != i) continue;
            const auto exact = local.true_leaf_edges.find(edge);
            if (exact == local.true_leaf_edges.end()) continue;
            branches.push_back({edge.first, edge.second, describe(tape, edge.first).op,
                                measure(contribution, exact->second, precision)});
        }
        if (branches.size() > 1) leaf.branches = std::move(branches);
        result.leaves.push_back(std::move(leaf));
    }
    if (options.storage == Storage::recorded) {
        progress("the prediction: estimate_precision's 8 runs with random rounding");
        const PrecisionEstimate predicted = estimate(tape, J, EstimateOptions{});
        for (std::size_t l = 0; l < result.leaves.size(); ++l) result.leaves[l].predicted = predicted.leaves[l].normwise;
    }

    // Ranked by the local error in units of u (the digits lost, not clipped at 0: below one u the
    // order still says where the rounding is, as for a constant kept in bfloat16).
    std::stable_sort(nodes.begin(), nodes.end(),
                     [](const NodeAudit& a, const NodeAudit& b) { return a.local_in_u > b.local_in_u; });
    std::vector<std::uint32_t> candidates;
    for (const NodeAudit& n : nodes) {
        if (candidates.size() == options.contributor_candidates || !(n.local_in_u > 0)) break;
        candidates.push_back(n.node);
    }
    progress(fmt::format("{} runs with one node in low precision", candidates.size()));
    if (precision.u >= 0x1p-30) {  // float32 or 16 bits: double is exact enough to hold the rest
        contributor_runs<double>(tape, J, options.storage, truth, precision, candidates, result.leaves, log, progress);
    } else if constexpr (std::numeric_limits<long double>::digits >= 64) {
        // float64: long double (x87's 64-bit significand) holds the rest 2^11 finer than the double
        // node whose rounding each run measures, so the run's own error stays near 1/2000 of it;
        // at mp50 these runs were most of a char-LM step's audit (docs/performance.md).
        contributor_runs<long double>(tape, J, options.storage, truth, precision, candidates, result.leaves, log,
                                      progress);
    } else {  // a long double no finer than double (some ABIs): at 50 digits
        find_contributors(tape, truth.tape, truth.index, J, options.storage, truth, precision, candidates,
                          result.leaves, log, progress);
    }
    result.nodes = std::move(nodes);
    result.events = log.take();
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - progress.started).count();
    progress("done");
    return result;
}

// Random rounding at node granularity: each stored result moved by ξ units in its last place,
// ξ uniform in (−1, 1), and rounded to S again (so it lands on one of its neighbours or stays).
template <Scalar S>
struct RandomRounding {
    std::mt19937_64 generator;

    void operator()(Tensor<S>& x) {
        std::uniform_real_distribution<double> xi(-1, 1);
        for (S& v : x.data()) {
            if (!std::isfinite(v) || v == 0) continue;
            const double ulp = std::ldexp(1.0, std::ilogb(v) - std::numeric_limits<S>::digits + 1);
            v = static_cast<S>(static_cast<double>(v) + xi(generator) * ulp);
        }
    }

    // What an op reads in `format`, moved by ξ/2 of that format's units in the last place: the
    // op's rounding to nearest then goes up with probability equal to the distance from the lower
    // neighbour (stochastic rounding), an unbiased draw of the rounding error whose spread is √2
    // times round-to-nearest's root mean square (variance ulp²/6 against ulp²/12).
    void read(Tensor<S>& x, const HalfFormat& format) {
        std::uniform_real_distribution<double> xi(-1, 1);
        for (S& v : x.data()) {
            if (!std::isfinite(v) || v == 0) continue;
            const int exponent = std::max(std::ilogb(v), format.min_exponent());
            const double ulp = std::ldexp(1.0, exponent - format.fraction_bits);
            v = static_cast<S>(static_cast<double>(v) + xi(generator) * ulp / 2);
        }
    }
};

template <Scalar S>
PrecisionEstimate estimate(const Tape<S>& tape, const Var<S>& J, const EstimateOptions& options) {
    const auto started = std::chrono::steady_clock::now();
    if (!tape.holds(J))
        throw usage_error(
            "estimate_precision: J is not a value of this tape (another tape's, or from before a clear())");
    if (J.value().size() != 1) {
        throw shape_error(
            fmt::format("estimate_precision: J must hold one element (a loss); it is {}", J.shape().to_string()));
    }
    if (options.runs < 2)
        throw value_error(fmt::format("estimate_precision: runs must be at least 2 (a spread), got {}", options.runs));
    const Precision precision = precision_of<S>(Storage::recorded);
    const std::vector<std::uint32_t> leaves = gradient_leaves(tape, J);
    std::vector<std::uint32_t> identity(J.index() + 1);
    for (std::uint32_t i = 0; i <= J.index(); ++i) identity[i] = i;
    std::vector<std::vector<Tensor<double>>> samples(leaves.size());  // by leaf, by run
    for (std::size_t r = 0; r < options.runs; ++r) {
        Run<S, S> run(tape, tape, identity, J.index(), Storage::recorded, [](std::uint32_t) { return true; });
        run.all_low = true;
        std::seed_seq seeds{options.seed, static_cast<std::uint64_t>(r)};
        auto rounding = std::make_shared<RandomRounding<S>>(RandomRounding<S>{std::mt19937_64(seeds)});
        run.perturb = [rounding](Tensor<S>& x) { (*rounding)(x); };
        run.perturb_read = [rounding](Tensor<S>& x, const HalfFormat& format) { rounding->read(x, format); };
        run.forward();
        run.backward(false);
        for (std::size_t l = 0; l < leaves.size(); ++l) {
            samples[l].push_back(run.has_adjoint[leaves[l]] ? convert<double>(run.adjoints[leaves[l]])
                                                            : Tensor<double>(tape.recorded(leaves[l]).value.shape()));
        }
    }
    PrecisionEstimate result;
    result.precision = precision.name;
    result.unit_roundoff = precision.u;
    result.runs = options.runs;
    for (std::size_t l = 0; l < leaves.size(); ++l) {
        const auto node = tape.recorded(leaves[l]);
        LeafEstimate leaf{leaves[l], node.label.empty() ? fmt::format("leaf {}", leaves[l]) : std::string(node.label),
                          0, 0};
        const std::size_t n = samples[l][0].size();
        double spread2 = 0, mean2 = 0;
        for (std::size_t k = 0; k < n; ++k) {
            double mean = 0;
            for (const Tensor<double>& g : samples[l]) mean += g[k];
            mean /= static_cast<double>(options.runs);
            for (const Tensor<double>& g : samples[l]) spread2 += (g[k] - mean) * (g[k] - mean);
            mean2 += mean * mean;
        }
        spread2 /= static_cast<double>(options.runs - 1);
        leaf.normwise = mean2 > 0 ? std::sqrt(spread2 / mean2) : std::sqrt(spread2);
        if (!std::isfinite(leaf.normwise)) leaf.normwise = std::numeric_limits<double>::infinity();
        const double in_u = leaf.normwise / precision.u;
        leaf.digits_lost = !std::isfinite(in_u) ? std::log10(1 / precision.u)
                           : in_u <= 1          ? 0
                                                : std::min(std::log10(in_u), std::log10(1 / precision.u));
        result.leaves.push_back(std::move(leaf));
    }
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return result;
}

}  // namespace

PrecisionEstimate estimate_precision(const Tape<float>& tape, const Var<float>& J, const EstimateOptions& options) {
    return estimate(tape, J, options);
}

PrecisionEstimate estimate_precision(const Tape<double>& tape, const Var<double>& J, const EstimateOptions& options) {
    return estimate(tape, J, options);
}

PrecisionAudit audit_precision(const Tape<float>& tape, const Var<float>& J, const AuditOptions& options) {
    return audit(tape, J, options);
}

PrecisionAudit audit_precision(const Tape<double>& tape, const Var<double>& J, const AuditOptions& options) {
    return audit(tape, J, options);
}

}  // namespace tapegrad
