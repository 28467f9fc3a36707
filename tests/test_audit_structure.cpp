// The precision audit (check/audit.hpp) held by its structure, not by the examples its author had in
// mind (issue 49, items 2 and 4): every promise its doc comments make is asserted on inputs that make
// it bite, and its two outputs of one fact, the text table and the JSON document, are compared on
// every row, leaf and branch.
//
// The main property test computes what the audit must report from the definitions in the header,
// here and independently: the tape re-run at 50 digits (the truth), the low-precision run (each op
// in the recorded precision, every value and gradient kept in the storage format), each node alone
// on the exact inputs and gradient, the errors as ‖low − true‖₂ / ‖true‖₂ and so on, and the
// contributor runs (one node low, every other exact). It then requires the audit to agree, node by
// node and leaf by leaf, on several tapes: float and double, matmul, broadcasting and reductions
// beside elementwise ops, ties, a leaf with zero gradient, a node J does not read, a tape of one
// node, storage in bfloat16 and float16, bfloat16 products, and every library op.
// The targeted tests below it hold one promise each, on a graph made so that the promise decides
// the outcome; each says which promise and why its inputs bite.
#define BOOST_TEST_MODULE audit_structure
#include "op_rules.hpp"

#include "autodiff/mp50.hpp"
#include "autodiff/rerun.hpp"
#include "check/audit.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

using namespace tapegrad;
using Json = nlohmann::json;

namespace {

// ---- the reference: what check/audit.hpp defines, computed here from the tape ----

// A format's significant bits, smallest normal exponent and unit roundoff (2^-bits): IEEE 754's
// binary32, binary64 and binary16; bfloat16 is binary32's exponent with 8 bits.
struct Format {
    int bits;
    int min_exponent;
    double u;
};

template <Scalar S>
Format format_of(Storage storage) {
    if (storage == Storage::bfloat16) return {8, -126, 0x1p-8};
    if (storage == Storage::float16) return {11, -14, 0x1p-11};
    if constexpr (std::is_same_v<S, float>) return {24, -126, 0x1p-24};
    return {53, -1022, 0x1p-53};
}

// An AuditError by the header's definitions: normwise ‖low − true‖₂ / ‖true‖₂ (‖low − true‖₂ where the
// truth is zero), the worst element |low − true| / |true| (0/0 is 0, the first of equals named), ULPs
// of the true value in the format, in_u, digits lost clipped to [0, log10(1/u)]; an inf or NaN the
// truth does not hold makes the error not finite (every figure inf, every digit lost).
template <Scalar L>
AuditError reference_error(const Tensor<L>& low, const Tensor<mp50>& truth, const Format& f) {
    AuditError e;
    e.measured = true;
    long double lost2 = 0, true2 = 0;
    for (std::size_t k = 0; k < low.size(); ++k) {
        const double x = to_double(low[k]), t = to_double(truth[k]);
        if (!std::isfinite(x)) {
            if (x != t) e.finite = false;  // an infinity the truth holds too (a mask's −inf) is exact
            continue;
        }
        mp50 difference = mp50(low[k]) - truth[k];
        if (difference < 0) difference = -difference;
        const double d = to_double(difference), magnitude = std::fabs(t);
        lost2 += static_cast<long double>(d) * d;
        true2 += static_cast<long double>(magnitude) * magnitude;
        const double relative = d == 0 ? 0.0 : d / magnitude;  // d / 0 = inf
        if (relative > e.worst_element) {
            e.worst_element = relative;
            e.worst_at = index_string(low.shape(), k);
        }
        int exponent = 0;  // magnitude = m · 2^exponent, m in [1/2, 1): its last place is 2^(exponent − bits)
        std::frexp(magnitude, &exponent);
        const int leading = magnitude == 0 ? f.min_exponent : std::max(exponent - 1, f.min_exponent);
        e.ulps = std::max(e.ulps, d / std::ldexp(1.0, leading - f.bits + 1));
    }
    const double most = std::log10(1 / f.u);
    if (!e.finite) {
        e.normwise = e.worst_element = e.ulps = e.in_u = std::numeric_limits<double>::infinity();
        e.digits_lost = most;
        return e;
    }
    e.normwise = static_cast<double>(true2 > 0 ? std::sqrt(lost2 / true2) : std::sqrt(lost2));
    e.in_u = e.normwise / f.u;
    e.digits_lost = e.in_u > 0 ? std::clamp(std::log10(e.in_u), 0.0, most) : 0.0;
    return e;
}

// The error ranked worse: more digits lost, then (equal digits, as below u) the larger normwise;
// of equals the first.
const AuditError& reference_worse(const AuditError& a, const AuditError& b) {
    if (!a.measured) return b;
    if (!b.measured) return a;
    if (b.digits_lost != a.digits_lost) return b.digits_lost > a.digits_lost ? b : a;
    return b.normwise > a.normwise ? b : a;
}

template <Scalar To, Scalar From>
Tensor<To> as(const Tensor<From>& x) {
    Tensor<To> out(x.shape());
    for (std::size_t k = 0; k < x.size(); ++k) out[k] = static_cast<To>(x[k]);
    return out;
}

template <Scalar S>
void keep_in(Storage storage, Tensor<S>& x) {
    for (S& v : x.data()) v = static_cast<S>(round_to(storage, static_cast<double>(v)));
}

template <Scalar S>
std::vector<const Tensor<S>*> pointers_to(const std::vector<Tensor<S>>& tensors) {
    std::vector<const Tensor<S>*> out;
    for (const Tensor<S>& t : tensors) out.push_back(&t);
    return out;
}

// The truth: the recording re-run at 50 digits on the same leaves and constants, with its adjoints.
struct Truth {
    Tape<mp50> tape;
    std::vector<Var<mp50>> nodes;  // recorded node i is nodes[i]
    Tape<mp50>::RecordedNode node(std::uint32_t i) const { return tape.recorded(nodes[i].index()); }
};

template <Scalar S>
std::unique_ptr<Truth> truth_of(const Tape<S>& tape, const Var<S>& J) {
    auto truth = std::make_unique<Truth>();
    std::vector<Var<mp50>> leaves;
    for (const std::uint32_t i : gradient_leaves(tape, J))
        leaves.push_back(truth->tape.leaf(as<mp50>(tape.recorded(i).value), tape.recorded(i).label));
    truth->tape.backward(rerun(tape, J, std::span<const Var<mp50>>(leaves), &truth->nodes));
    return truth;
}

using Edge = std::pair<std::uint32_t, std::uint32_t>;  // (consumer, input slot)

// A run over the recording at W: the nodes `low` says in the recorded precision S on their inputs
// converted to S, each value they make and each VJP result kept in the storage format, and a sum of
// gradients into a low node kept so too; the others exact (the truth's op at W = mp50). W = S with
// every node low is the audit's low-precision run.
template <Scalar W, Scalar S>
struct Simulation {
    const Tape<S>& tape;
    const Truth* truth;  // for the exact nodes (W = mp50)
    std::uint32_t output;
    Storage storage;
    std::function<bool(std::uint32_t)> low;

    std::vector<Tensor<W>> values{}, adjoints{}, saved_exact{};
    std::vector<Tensor<S>> saved_low{};
    std::vector<char> has_adjoint{};
    std::map<Edge, Tensor<W>> leaf_edges{};

    void run() {
        const std::size_t n = output + 1;
        values.assign(n, {});
        saved_exact.assign(n, {});
        saved_low.assign(n, {});
        for (std::uint32_t i = 0; i < n; ++i) {
            const auto node = tape.recorded(i);
            if (node.kind == nullptr) {
                Tensor<S> v = node.value;
                if (low(i)) keep_in(storage, v);
                values[i] = as<W>(v);
            } else if (low(i)) {
                std::vector<Tensor<S>> in;
                for (const std::uint32_t k : node.inputs) in.push_back(as<S>(values[k]));
                Tensor<S> out;
                node.kind->forward(node.settings, pointers_to(in), out, saved_low[i]);
                keep_in(storage, out);
                values[i] = as<W>(out);
            } else {
                if constexpr (std::is_same_v<W, mp50>) {
                    const auto exact = truth->node(i);
                    std::vector<const Tensor<W>*> in;
                    for (const std::uint32_t k : node.inputs) in.push_back(&values[k]);
                    exact.kind->forward(exact.settings, in, values[i], saved_exact[i]);
                }
            }
        }
        adjoints.assign(n, {});
        has_adjoint.assign(n, 0);
        adjoints[output] = Tensor<W>(values[output].shape(), W(1));
        has_adjoint[output] = 1;
        for (std::uint32_t i = output + 1; i-- > 0;) {
            const auto node = tape.recorded(i);
            if (node.kind == nullptr || !node.requires_grad || !has_adjoint[i]) continue;
            std::vector<Tensor<W>> contributions(node.inputs.size());
            if (low(i)) {
                std::vector<Tensor<S>> in;
                for (const std::uint32_t k : node.inputs) in.push_back(as<S>(values[k]));
                const Tensor<S> G = as<S>(adjoints[i]), out = as<S>(values[i]);
                std::vector<Tensor<S>> grads(in.size());
                std::vector<Tensor<S>*> slots(in.size(), nullptr);
                for (std::size_t s = 0; s < in.size(); ++s) {
                    if (!tape.recorded(node.inputs[s]).requires_grad) continue;
                    grads[s].resize(in[s].shape());
                    slots[s] = &grads[s];
                }
                const std::vector<const Tensor<S>*> in_pointers = pointers_to(in);
                node.kind->vjp_all(node.settings, VjpArgs<S>{in_pointers, out, saved_low[i], G}, slots);
                for (std::size_t s = 0; s < in.size(); ++s) {
                    if (slots[s] == nullptr) continue;
                    keep_in(storage, grads[s]);
                    contributions[s] = as<W>(grads[s]);
                }
            } else {
                if constexpr (std::is_same_v<W, mp50>) {
                    const auto exact = truth->node(i);
                    std::vector<Tensor<W>*> slots(node.inputs.size(), nullptr);
                    for (std::size_t s = 0; s < slots.size(); ++s) {
                        if (!tape.recorded(node.inputs[s]).requires_grad) continue;
                        contributions[s].resize(values[node.inputs[s]].shape());
                        slots[s] = &contributions[s];
                    }
                    std::vector<const Tensor<W>*> in;
                    for (const std::uint32_t k : node.inputs) in.push_back(&values[k]);
                    exact.kind->vjp_all(exact.settings, VjpArgs<W>{in, values[i], saved_exact[i], adjoints[i]}, slots);
                }
            }
            for (std::uint32_t s = 0; s < node.inputs.size(); ++s) {
                const std::uint32_t target = node.inputs[s];
                if (!tape.recorded(target).requires_grad) continue;
                if (!has_adjoint[target]) {  // the first contribution as it came
                    adjoints[target] = contributions[s];
                    has_adjoint[target] = 1;
                } else {
                    for (std::size_t k = 0; k < adjoints[target].size(); ++k)
                        adjoints[target][k] += contributions[s][k];
                    if constexpr (std::is_same_v<W, S>) {
                        if (low(target)) keep_in(storage, adjoints[target]);  // a sum kept as values are
                    }
                }
                if (tape.recorded(target).kind == nullptr) leaf_edges[{i, s}] = contributions[s];
            }
        }
    }
};

// What the audit must report, by node index (nodes) and in recorded order (leaves).
struct Expected {
    std::vector<NodeAudit> nodes;
    std::vector<LeafAudit> leaves;
};

template <Scalar S>
std::string op_of(const Tape<S>& tape, std::uint32_t i) {
    const auto node = tape.recorded(i);
    return node.kind != nullptr ? std::string(node.kind->name) : node.requires_grad ? "leaf" : "constant";
}

// Node i alone in low precision: its op on the exact inputs (rounded to S), its VJP on them and the
// exact upstream gradient (rounded to S), what it makes kept in the storage format, against the op at
// 50 digits. The exact contributions into gradient leaves are kept for the branches.
template <Scalar S>
void expected_local(const Tape<S>& tape, const Truth& truth, Storage storage, std::uint32_t i, NodeAudit& audit,
                    std::map<Edge, Tensor<mp50>>& exact_edges) {
    const Format f = format_of<S>(storage);
    const auto node = tape.recorded(i);
    const auto exact = truth.node(i);
    if (node.kind == nullptr) {
        Tensor<S> v = as<S>(exact.value);
        keep_in(storage, v);
        audit.local_forward = reference_error(v, exact.value, f);
        return;
    }
    std::vector<Tensor<S>> in;
    std::vector<const Tensor<mp50>*> in_exact;
    for (const std::uint32_t k : node.inputs) {
        in_exact.push_back(&truth.nodes[k].value());
        in.push_back(as<S>(*in_exact.back()));
    }
    Tensor<S> out, saved;
    node.kind->forward(node.settings, pointers_to(in), out, saved);
    keep_in(storage, out);
    audit.local_forward = reference_error(out, exact.value, f);
    if (!node.requires_grad) return;
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
    const Tensor<mp50>& G_exact = truth.nodes[i].grad();
    exact.kind->vjp_all(exact.settings, VjpArgs<mp50>{in_exact, out_exact, saved_exact, G_exact}, slots_exact);
    const Tensor<S> G = as<S>(G_exact);
    const std::vector<const Tensor<S>*> in_pointers = pointers_to(in);
    node.kind->vjp_all(node.settings, VjpArgs<S>{in_pointers, out, saved, G}, slots);
    for (std::size_t s = 0; s < in.size(); ++s) {
        if (slots[s] == nullptr) continue;
        keep_in(storage, grads[s]);
        audit.local_vjp = reference_worse(audit.local_vjp, reference_error(grads[s], grads_exact[s], f));
        if (tape.recorded(node.inputs[s]).kind == nullptr)
            exact_edges[{i, static_cast<std::uint32_t>(s)}] = grads_exact[s];
    }
}

template <Scalar S>
Expected expected_audit(const Tape<S>& tape, const Var<S>& J, const Truth& truth, Storage storage) {
    const Format f = format_of<S>(storage);
    Simulation<S, S> low{tape, &truth, J.index(), storage, [](std::uint32_t) { return true; }};
    low.run();
    Expected expected;
    std::map<Edge, Tensor<mp50>> exact_edges;
    for (std::uint32_t i = 0; i <= J.index(); ++i) {
        const auto node = tape.recorded(i);
        NodeAudit n;
        n.node = i;
        n.op = op_of(tape, i);
        n.label = std::string(node.label);
        n.shape = node.value.shape().to_string();
        n.value = reference_error(low.values[i], truth.node(i).value, f);
        if (node.requires_grad && low.has_adjoint[i])
            n.adjoint = reference_error(low.adjoints[i], truth.nodes[i].grad(), f);
        expected_local(tape, truth, storage, i, n, exact_edges);
        n.local_digits = std::max(n.local_forward.digits_lost, n.local_vjp.digits_lost);
        n.local_in_u = std::max(n.local_forward.in_u, n.local_vjp.in_u);
        expected.nodes.push_back(std::move(n));
    }
    for (const std::uint32_t i : gradient_leaves(tape, J)) {
        LeafAudit leaf;
        leaf.node = i;
        leaf.name = tape.recorded(i).label.empty() ? fmt::format("leaf {}", i) : std::string(tape.recorded(i).label);
        if (low.has_adjoint[i]) leaf.gradient = reference_error(low.adjoints[i], truth.nodes[i].grad(), f);
        for (const auto& [edge, contribution] : low.leaf_edges) {
            if (tape.recorded(edge.first).inputs[edge.second] != i || !exact_edges.contains(edge)) continue;
            leaf.branches.push_back({edge.first, edge.second, op_of(tape, edge.first),
                                     reference_error(contribution, exact_edges.at(edge), f)});
        }
        if (leaf.branches.size() < 2) leaf.branches.clear();  // told by branch only when there are several
        expected.leaves.push_back(std::move(leaf));
    }
    return expected;
}

// Equal up to the order of double operations: the reference sums squares in long double, the audit
// in double, so for tensors of at most a few thousand elements the two differ by far less than 1e-12
// relative; everything else (the relative errors, the ULPs, the clipping) is the same double arithmetic.
bool agrees(double got, double want) {
    if (!std::isfinite(want) || !std::isfinite(got)) return got == want || (std::isnan(got) && std::isnan(want));
    return std::fabs(got - want) <= 1e-12 * std::max(std::fabs(got), std::fabs(want));
}

void expect_error(const AuditError& got, const AuditError& want, const std::string& what) {
    BOOST_TEST(got.measured == want.measured, what << ": measured " << got.measured);
    if (!want.measured) return;
    BOOST_TEST(got.finite == want.finite, what << ": finite " << got.finite);
    BOOST_TEST(agrees(got.normwise, want.normwise),
               what << ": normwise " << got.normwise << ", want " << want.normwise);
    BOOST_TEST(agrees(got.worst_element, want.worst_element),
               what << ": worst element " << got.worst_element << ", want " << want.worst_element);
    BOOST_TEST(got.worst_at == want.worst_at, what << ": worst at " << got.worst_at << ", want " << want.worst_at);
    BOOST_TEST(agrees(got.ulps, want.ulps), what << ": ULPs " << got.ulps << ", want " << want.ulps);
    BOOST_TEST(agrees(got.in_u, want.in_u), what << ": in u " << got.in_u << ", want " << want.in_u);
    BOOST_TEST(agrees(got.digits_lost, want.digits_lost),
               what << ": digits " << got.digits_lost << ", want " << want.digits_lost);
}

// The contributor runs by the header's definition: the candidates are the first
// `contributor_candidates` nodes of the ranking that lose anything locally; for each leaf, the one
// whose low precision alone (every other node exact, here at 50 digits) moves its gradient most,
// and its share, that error over the leaf's whole error. The audit holds the exact part of these
// runs at double (float and 16-bit audits) or long double (double audits), whose own rounding moves
// each error alone by up to `slack` of the whole error (see the constants below).
template <Scalar S>
void expect_contributors(const Tape<S>& tape, const Var<S>& J, const Truth& truth, const PrecisionAudit& audit,
                         std::size_t candidates_asked, Storage storage, double slack, const std::string& name) {
    std::vector<std::uint32_t> candidates;
    for (const NodeAudit& n : audit.nodes) {
        if (candidates.size() == candidates_asked || !(n.local_in_u > 0)) break;
        candidates.push_back(n.node);
    }
    const Format f = format_of<S>(storage);
    std::map<std::uint32_t, std::vector<std::optional<double>>> alone;  // by candidate, by leaf
    for (const std::uint32_t c : candidates) {
        Simulation<mp50, S> run{tape, &truth, J.index(), storage, [c](std::uint32_t i) { return i == c; }};
        run.run();
        for (const LeafAudit& leaf : audit.leaves) {
            alone[c].push_back(
                run.has_adjoint[leaf.node]
                    ? std::optional(reference_error(run.adjoints[leaf.node], truth.nodes[leaf.node].grad(), f).normwise)
                    : std::nullopt);
        }
    }
    for (std::size_t l = 0; l < audit.leaves.size(); ++l) {
        const LeafAudit& leaf = audit.leaves[l];
        std::optional<double> most;
        for (const std::uint32_t c : candidates)
            if (alone[c][l] && (!most || *alone[c][l] > *most)) most = alone[c][l];
        const std::string what = fmt::format("{}: leaf {}", name, leaf.name);
        if (!most) {  // no candidate, or none reaches this leaf: no contributor
            BOOST_TEST(leaf.top_contributor_op.empty(), what << ": top contributor " << leaf.top_contributor_op);
            BOOST_TEST(leaf.top_contributor == 0u, what);
            BOOST_TEST(leaf.top_contributor_share == 0.0, what);
            continue;
        }
        BOOST_TEST_REQUIRE(alone.contains(leaf.top_contributor),
                           what << ": node " << leaf.top_contributor << " is not a candidate");
        BOOST_TEST(leaf.top_contributor_op == op_of(tape, leaf.top_contributor), what);
        const double whole = leaf.gradient.normwise;
        if (!(whole > 0) || !std::isfinite(whole)) {  // no error, or a lost one: no share
            BOOST_TEST(leaf.top_contributor_share == 0.0, what << ": share of no or a lost error");
            continue;
        }
        const double chosen = alone[leaf.top_contributor][l].value_or(-1);
        BOOST_TEST(chosen >= *most - slack * whole, what << ": node " << leaf.top_contributor << " alone moves it "
                                                         << chosen << ", another candidate " << *most);
        BOOST_TEST(std::fabs(leaf.top_contributor_share - chosen / whole) <= slack,
                   what << ": share " << leaf.top_contributor_share << ", want " << chosen / whole);
    }
}

// The audit of `J` against the reference: every node once (0 to J), each with its op, label, shape,
// value and adjoint errors of the low run and its local errors; the ranking; every gradient leaf in
// recorded order with its error, branches and prediction; the inputs; the contributors.
template <Scalar S>
PrecisionAudit audited_against_the_reference(const Tape<S>& tape, const Var<S>& J, const AuditOptions& options,
                                             const std::string& name, double contributor_slack) {
    const PrecisionAudit audit = audit_precision(tape, J, options);
    const std::unique_ptr<Truth> truth = truth_of(tape, J);
    const Expected expected = expected_audit(tape, J, *truth, options.storage);
    const Format f = format_of<S>(options.storage);
    const std::string computing = std::is_same_v<S, float> ? "float32" : "float64";
    BOOST_TEST(audit.precision == (options.storage == Storage::bfloat16  ? "bfloat16 (computing in " + computing + ")"
                                   : options.storage == Storage::float16 ? "float16 (computing in " + computing + ")"
                                                                         : computing),
               name);
    BOOST_TEST(audit.unit_roundoff == f.u, name);
    BOOST_TEST(audit.events.empty(), name << ": " << audit.table(0));
    BOOST_TEST_REQUIRE(audit.nodes.size() == J.index() + 1, name);
    std::set<std::uint32_t> seen;
    for (std::size_t r = 0; r < audit.nodes.size(); ++r) {
        const NodeAudit& n = audit.nodes[r];
        BOOST_TEST_REQUIRE(n.node <= J.index(), name << ": node " << n.node);
        BOOST_TEST(seen.insert(n.node).second, name << ": node " << n.node << " ranked twice");
        const NodeAudit& want = expected.nodes[n.node];
        const std::string what = fmt::format("{}: node {} ({})", name, n.node, want.op);
        BOOST_TEST(n.op == want.op, what << ": op " << n.op);
        BOOST_TEST(n.label == want.label, what);
        BOOST_TEST(n.shape == want.shape, what);
        expect_error(n.value, want.value, what + ", value");
        expect_error(n.adjoint, want.adjoint, what + ", adjoint");
        expect_error(n.local_forward, want.local_forward, what + ", local forward");
        expect_error(n.local_vjp, want.local_vjp, what + ", local VJP");
        BOOST_TEST(agrees(n.local_digits, want.local_digits), what << ": local digits " << n.local_digits);
        BOOST_TEST(agrees(n.local_in_u, want.local_in_u), what << ": local in u " << n.local_in_u);
        // Ranked by local_in_u, largest first; equal keys in recorded order.
        if (r > 0) {
            const NodeAudit& before = audit.nodes[r - 1];
            BOOST_TEST(
                (before.local_in_u > n.local_in_u || (before.local_in_u == n.local_in_u && before.node < n.node)),
                name << ": rank " << r << " node " << before.node << " (" << before.local_in_u << " u) before node "
                     << n.node << " (" << n.local_in_u << " u)");
        }
    }
    BOOST_TEST_REQUIRE(audit.leaves.size() == expected.leaves.size(), name);
    const PrecisionEstimate predicted = estimate_precision(tape, J);
    for (std::size_t l = 0; l < audit.leaves.size(); ++l) {
        const LeafAudit& got = audit.leaves[l];
        const LeafAudit& want = expected.leaves[l];
        const std::string what = fmt::format("{}: leaf {} ({})", name, want.node, want.name);
        BOOST_TEST(got.node == want.node, what << ": node " << got.node);
        BOOST_TEST(got.name == want.name, what << ": name " << got.name);
        expect_error(got.gradient, want.gradient, what + ", gradient");
        BOOST_TEST_REQUIRE(got.branches.size() == want.branches.size(), what << ": branches");
        for (std::size_t b = 0; b < got.branches.size(); ++b) {
            const std::string via =
                fmt::format("{}, branch via node {} input {}", what, want.branches[b].consumer, want.branches[b].slot);
            BOOST_TEST(got.branches[b].consumer == want.branches[b].consumer, via << ": consumer");
            BOOST_TEST(got.branches[b].slot == want.branches[b].slot, via << ": slot");
            BOOST_TEST(got.branches[b].op == want.branches[b].op, via);
            expect_error(got.branches[b].error, want.branches[b].error, via);
        }
        // The prediction is estimate_precision's spread (default runs and seed), for the recorded run only.
        if (options.storage == Storage::recorded) {
            BOOST_TEST_REQUIRE(got.predicted.has_value(), what);
            BOOST_TEST(*got.predicted == predicted.leaves.at(l).normwise, what << ": predicted");
        } else {
            BOOST_TEST(!got.predicted.has_value(), what << ": predicted for a storage format");
        }
    }
    BOOST_TEST_REQUIRE(audit.inputs.size() == J.index() + 1, name);
    for (std::uint32_t i = 0; i <= J.index(); ++i) {
        const auto in = tape.recorded(i).inputs;
        BOOST_TEST((audit.inputs[i] == std::vector<std::uint32_t>(in.begin(), in.end())), name << ": inputs of " << i);
    }
    expect_contributors(tape, J, *truth, audit, options.contributor_candidates, options.storage, contributor_slack,
                        name);
    return audit;
}

template <Scalar S>
Tensor<S> uniform(const Shape& shape, std::mt19937_64& rng, double low, double high) {
    std::uniform_real_distribution<double> draw(low, high);
    Tensor<S> t(shape);
    for (S& x : t.data()) x = static_cast<S>(static_cast<float>(draw(rng)));  // float values: one graph at both types
    return t;
}

// A graph of the shapes the audit meets in a model: a product, a broadcast bias, a softmax, a
// reduction along an axis broadcast back, a leaf feeding three op inputs (both inputs of one mul),
// an unlabeled leaf recorded after ops whose gradient is exactly zero, a node J does not read,
// and two identical branches (equal local errors: a tie in the ranking and among the contributors).
template <Scalar S>
Var<S> mixed_graph(Tape<S>& tape, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    const Var<S> X = tape.leaf(uniform<S>(Shape{4, 6}, rng, -1, 1), "X");  // node 0
    const Var<S> W = tape.leaf(uniform<S>(Shape{6, 5}, rng, -1, 1), "W");
    const Var<S> b = tape.constant(uniform<S>(Shape{5}, rng, -0.5, 0.5), "b");
    const Var<S> P = softmax(add(matmul(X, W), b));                   // [4, 5] + [5]
    const Var<S> Z = tape.leaf(uniform<S>(Shape{4, 5}, rng, -1, 1));  // "leaf 6": its node, not its ordinal (2)
    const Var<S> zero = mul(Z, tape.constant(Tensor<S>(Shape{4, 5}, S(0)), "zeros"));
    (void)exp(W);                                 // recorded before J, not read by it: no adjoint
    const Var<S> rows = sum(mul(X, X), 1, true);  // [4, 1], broadcast into [4, 5] below
    const Var<S> C = tape.constant(uniform<S>(Shape{4, 5}, rng, 0.5, 1.5), "C");
    const Var<S> twice = add(mul(P, C), mul(P, C));  // two identical branches
    return sum(add(add(twice, zero), tanh(rows)));
}

// Scores with hidden positions (mask's −inf, which the truth holds too: exact, not lost) through a
// softmax, times a product of two leaves broadcast along rows.
template <Scalar S>
Var<S> masked_graph(Tape<S>& tape, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    const Var<S> Q = tape.leaf(uniform<S>(Shape{3, 4}, rng, -1, 1), "Q");
    const Var<S> K = tape.leaf(uniform<S>(Shape{4, 3}, rng, -1, 1), "K");
    const Var<S> M = tape.constant(Tensor<S>::matrix({{1, 0, 0}, {1, 1, 0}, {1, 1, 1}}), "causal");
    const Var<S> P = softmax(mask(matmul(Q, K), M));
    const Var<S> v = tape.leaf(uniform<S>(Shape{1, 3}, rng, 0.5, 1.5), "v");
    return sum(mul(P, v));
}

// Cancellation against the truth's zeros: x = (1, 1, 1), y = (3e-8, 0, 2.9e-8) in float. (x + y) − x
// is 0 in float (1 + y rounds to 1) where the truth is y: every digit lost (normwise exactly 1, at
// the clipping bound), the middle element 0/0 (counts as 0), the first and last equally bad (the
// first named). Minus w = (2.9e-8, 0, 2.9e-8) the truth is (1e-9, 0, 0): an error 40 times the
// truth, clipped to log10(1/u) digits, and one element d/0 = inf though the value is finite. Minus
// y the truth is exactly zero: the normwise error is then ‖low − true‖₂, 0.7 u, no digit lost.
struct Cancellation {
    Var<float> lost, beyond, against_zero, J;
};

Cancellation cancellation_graph(Tape<float>& tape) {
    const Var<float> x = tape.leaf(Tensor<float>(Shape{3}, 1.0f), "x");
    const Var<float> y = tape.constant(Tensor<float>({3}, {3e-8f, 0.0f, 2.9e-8f}), "y");
    const Var<float> w = tape.constant(Tensor<float>({3}, {2.9e-8f, 0.0f, 2.9e-8f}), "w");
    Cancellation c;
    c.lost = sub(add(x, y), x);
    c.beyond = sub(c.lost, w);
    c.against_zero = sub(c.lost, y);
    c.J = sum(add(add(c.beyond, c.against_zero), mul(x, x)));
    return c;
}

// The graph of every library op (tests/op_rules.hpp) recorded on a float tape, on the double
// graph's leaves rounded to float.
Var<float> every_op_graph_in_float(Tape<float>& tape) {
    const testing::rules::Recipe recipe = testing::rules::draw_every_rule(17);
    const auto values = testing::rules::leaves_of(recipe);
    std::array<Var<float>, testing::rules::leaf_count> leaves;
    for (std::size_t l = 0; l < leaves.size(); ++l)
        leaves[l] = tape.leaf(tensor_cast<float>(values[l].value), values[l].name);
    return testing::rules::Graph<>{&recipe}(leaves);
}

// A graph and how it is audited; the audit against the reference when asked (cases without events).
struct AuditCase {
    std::string name;
    std::function<PrecisionAudit(bool against_reference)> audit;
};

// The audit's contributor runs hold their exact part at double for float and 16-bit audits: each
// exact node rounds at 2^-53, 2^-29 of a float rounding, so over a graph of a hundred nodes an error
// alone moves by less than 1e-6 of the whole error. For double audits at long double: 2^-64, 2^-11
// (1/2000) of a double rounding per node; summed over the every-op graph's sixty nodes at most 3e-2
// of the whole error, typically (random signs) a few 1e-3: 1e-2.
constexpr double contributor_slack_double_run = 1e-6;
constexpr double contributor_slack_long_double_run = 1e-2;

template <Scalar S>
AuditCase audit_case(std::string name, std::function<Var<S>(Tape<S>&)> graph, AuditOptions options,
                     bool bfloat16_products = false) {
    const double slack = std::is_same_v<S, double> && options.storage == Storage::recorded
                             ? contributor_slack_long_double_run
                             : contributor_slack_double_run;
    return {name, [=](bool against_reference) {
                Tape<S> tape;
                if (bfloat16_products) tape.set_product_precision(ProductPrecision::bfloat16);
                const Var<S> J = graph(tape);
                return against_reference ? audited_against_the_reference(tape, J, options, name, slack)
                                         : audit_precision(tape, J, options);
            }};
}

std::vector<AuditCase> reference_cases() {
    const auto mixed_float = [](Tape<float>& t) { return mixed_graph(t, 5); };
    const auto mixed_double = [](Tape<double>& t) { return mixed_graph(t, 6); };
    return {
        audit_case<float>("mixed, float32", mixed_float, {}),
        audit_case<float>("mixed, float32 in bfloat16", mixed_float, {.storage = Storage::bfloat16}),
        audit_case<float>("mixed, float32 in float16", mixed_float, {.storage = Storage::float16}),
        audit_case<double>("mixed, float64", mixed_double, {}),
        audit_case<double>("mixed, float64 in bfloat16", mixed_double, {.storage = Storage::bfloat16}),
        audit_case<double>("mixed, float64 in float16", mixed_double, {.storage = Storage::float16}),
        audit_case<float>("mixed, bfloat16 products", mixed_float, {}, true),
        audit_case<float>("mixed, bfloat16 products in bfloat16", mixed_float, {.storage = Storage::bfloat16}, true),
        audit_case<float>("mixed, no contributor candidate", mixed_float, {.contributor_candidates = 0}),
        audit_case<float>("mixed, one contributor candidate", mixed_float, {.contributor_candidates = 1}),
        audit_case<float>("mixed, three contributor candidates in bfloat16", mixed_float,
                          {.storage = Storage::bfloat16, .contributor_candidates = 3}),
        audit_case<float>("masked scores, float32", [](Tape<float>& t) { return masked_graph(t, 7); }, {}),
        audit_case<double>("masked scores, float64 in float16", [](Tape<double>& t) { return masked_graph(t, 8); },
                           {.storage = Storage::float16}),
        audit_case<float>("cancellation, float32", [](Tape<float>& t) { return cancellation_graph(t).J; }, {}),
        // A tape of one node: J is the leaf itself (its gradient is the seed, 1, exact).
        audit_case<float>("one node, float32",
                          [](Tape<float>& t) { return t.leaf(Tensor<float>({1}, {0.1f}), "only"); }, {}),
        audit_case<double>("one node, float64 in bfloat16",
                           [](Tape<double>& t) { return t.leaf(Tensor<double>({1}, {0.1}), "only"); },
                           {.storage = Storage::bfloat16}),
        // Nodes recorded after J are not J's: the audit ends at J.
        audit_case<float>("nodes after J, float32",
                          [](Tape<float>& t) {
                              const Var<float> J = mixed_graph(t, 9);
                              (void)exp(J);
                              (void)mul(J, J);
                              return J;
                          },
                          {}),
        // A leaf recorded before J that J does not read: nothing reaches its gradient.
        audit_case<float>("unused leaf, float32",
                          [](Tape<float>& t) {
                              (void)t.leaf(Tensor<float>({2}, {0.25f, 0.5f}), "unused");
                              return mixed_graph(t, 10);
                          },
                          {}),
        audit_case<double>("every op, float64", [](Tape<double>& t) { return testing::every_op_graph(t); }, {}),
        audit_case<float>("every op, float32", every_op_graph_in_float, {}),
        audit_case<float>("every op, float32 in bfloat16", every_op_graph_in_float, {.storage = Storage::bfloat16}),
    };
}

}  // namespace

// Every number the audit reports, on every node and leaf of each case, against the reference above:
// the header's definitions computed here from the tape and its 50-digit re-run.
BOOST_AUTO_TEST_CASE(the_audit_is_its_definition_node_by_node) {
    for (const AuditCase& c : reference_cases()) {
        BOOST_TEST_CONTEXT(c.name) { (void)c.audit(true); }
    }
}

// ---- the contributors ----

// A node's low precision alone, every other node exact (check/audit.hpp): the same definition on a
// float tape and on a double tape. Here every value is exact in float (at most 22 significant bits),
// so the two tapes compute the same numbers and, kept in bfloat16, the audits must agree, the top
// contributor and its share included. c = x ∘ K has two consumers, so its gradient is a sum of two
// exact contributions, (1 + 2^-7) + 1 = 2 + 2^-7, which bfloat16 cannot hold (9 bits): a run with c
// alone in low precision that kept that sum in bfloat16 would lay a rounding made by no low node at
// c, and only where c has several consumers. It did so on a double tape in 16 bits, whose contributor
// runs compute at double, the tape's own type, so that the sum's rounding meant for the low run
// (where every node is low) applied: x's share was 1 there against 0.98 on the float tape (and on
// the mixed graph 1.19, the top contributor a different node from the one that moves it most).
namespace {

template <Scalar S>
PrecisionAudit audit_of_a_node_with_two_consumers() {
    Tape<S> tape;
    const S a = S(1 + 0x1p-7);  // bfloat16: 8 significant bits
    const Var<S> x = tape.leaf(Tensor<S>({2}, {a, S(1 + 0x1p-6)}), "x");
    const Var<S> c = mul(x, tape.constant(Tensor<S>({2}, {a, a}), "K"));
    const Var<S> J = add(sum(mul(c, tape.constant(Tensor<S>({2}, {S(1), S(1)}), "C1"))),
                         sum(mul(c, tape.constant(Tensor<S>({2}, {a, a}), "C2"))));
    return audit_precision(tape, J, {.storage = Storage::bfloat16});
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_double_tape_in_16_bits_attributes_as_a_float_tape_does) {
    const PrecisionAudit in_float = audit_of_a_node_with_two_consumers<float>();
    const PrecisionAudit in_double = audit_of_a_node_with_two_consumers<double>();
    BOOST_TEST_MESSAGE(in_float.table() << in_double.table());
    // The premise: both tapes compute the same numbers (every node's errors equal).
    BOOST_TEST_REQUIRE(in_float.nodes.size() == in_double.nodes.size());
    for (std::size_t r = 0; r < in_float.nodes.size(); ++r) {
        BOOST_TEST_REQUIRE(in_float.nodes[r].node == in_double.nodes[r].node);
        BOOST_TEST_REQUIRE(in_float.nodes[r].local_in_u == in_double.nodes[r].local_in_u);
        BOOST_TEST_REQUIRE(in_float.nodes[r].value.normwise == in_double.nodes[r].value.normwise);
    }
    const LeafAudit& f = in_float.leaves.at(0);
    const LeafAudit& d = in_double.leaves.at(0);
    BOOST_TEST_REQUIRE(f.gradient.normwise == d.gradient.normwise);
    BOOST_TEST(f.gradient.normwise > 0.0);
    BOOST_TEST(d.top_contributor == f.top_contributor);
    BOOST_TEST(d.top_contributor_share == f.top_contributor_share);
    BOOST_TEST(d.top_contributor_share <= 1.0);
}

// ---- the table against the JSON: two outputs of one fact ----

namespace {

// A test-only op: Y = 2A, whose VJP refuses in float (as a VJP dividing by a value float rounds to
// 0 would): its forward passes, so the audit's backward stages meet the refusal.
struct DoubleWhoseVjpRefusesInFloat {
    static constexpr std::string_view name = "twice_refusing";
    using Settings = NoSettings;
    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        Y.resize(in[0]->shape());
        for (std::size_t k = 0; k < Y.size(); ++k) Y[k] = T(2) * (*in[0])[k];
    }
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        if constexpr (std::is_same_v<T, float>) throw value_error("twice_refusing: refused in float");
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = T(2) * at.G[k];
    }
};

// A test-only op: Y = A, whose VJP reads a statistic its forward saves, 257 (9 significant bits:
// bfloat16 would hold it as 256), as dA = G · (257 − 256).
struct CopySavingAStatistic {
    static constexpr std::string_view name = "copy_saving";
    using Settings = NoSettings;
    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>& saved) {
        Y = *in[0];
        saved = Tensor<T>({1}, {T(257)});
    }
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] * (at.saved[0] - T(256));
    }
};

const bool test_ops_registered =
    register_siblings<DoubleWhoseVjpRefusesInFloat>() && register_siblings<CopySavingAStatistic>();

// Graphs whose audits hold events (inf, NaN, refusals), which the reference does not model.
std::vector<AuditCase> cases_with_events() {
    return {
        // e^11 to e^12 (6e4 to 1.6e5) kept in float16, whose largest value is 65504: inf.
        audit_case<float>("exp overflowing float16",
                          [](Tape<float>& t) {
                              const Var<float> A = t.leaf(Tensor<float>::matrix({{0.5f, 11.5f}, {-1, 12}}), "A");
                              return sum(mul(exp(A), t.constant(Tensor<float>::matrix({{1, 0.75f}, {1.5f, 1}}), "C")));
                          },
                          {.storage = Storage::float16}),
        // A variance E[x²] − E[x]² of rows of mean 100 and spread 0.02: negative in bfloat16 (sqrt refuses).
        audit_case<float>("negative variance in bfloat16",
                          [](Tape<float>& t) {
                              Tensor<float> x({1, 8});
                              for (std::size_t k = 0; k < 8; ++k) x[k] = 100.0f + 0.01f * float(k);
                              const Var<float> X = t.leaf(x, "X"), m = mean(X, 1, true);
                              const Var<float> variance = sub(mean(mul(X, X), 1, true), mul(m, m));
                              return sum(div(sub(X, m), sqrt(shift(variance, 1e-6f))));
                          },
                          {.storage = Storage::bfloat16}),
        audit_case<float>("a VJP refusing in float",
                          [](Tape<float>& t) {
                              const Var<float> x = t.leaf(Tensor<float>::matrix({{0.5f, -1.5f}, {2, 0.25f}}), "x");
                              const Var<float> Y = t.record<DoubleWhoseVjpRefusesInFloat>({x});
                              return sum(mul(Y, Y));
                          },
                          {}),
    };
}

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> lines;
    for (std::size_t begin = 0; begin < text.size();) {
        const std::size_t end = text.find('\n', begin);
        lines.push_back(text.substr(begin, end - begin));
        if (end == std::string::npos) break;
        begin = end + 1;
    }
    return lines;
}

std::vector<std::string> words_of(const std::string& line) {
    std::vector<std::string> words;
    std::istringstream in(line);
    for (std::string word; in >> word;) words.push_back(word);
    return words;
}

std::string trimmed(const std::string& text) {
    const std::size_t first = text.find_first_not_of(' ');
    return first == std::string::npos ? std::string() : text.substr(first, text.find_last_not_of(' ') - first + 1);
}

// The decimal exponent of a printed number's first significant digit ("0.0014": −3, "1.2e-05": −5,
// "10": 1); none for zero.
std::optional<int> leading_exponent(const std::string& text) {
    const std::size_t e = text.find_first_of("eE");
    const int scale = e == std::string::npos ? 0 : std::stoi(text.substr(e + 1));
    const std::string digits = text.substr(0, e);
    const std::size_t point = std::min(digits.find('.'), digits.size());
    for (std::size_t k = 0; k < digits.size(); ++k) {
        if (digits[k] < '1' || digits[k] > '9') continue;
        return scale + (k < point ? static_cast<int>(point - k) - 1 : -static_cast<int>(k - point));
    }
    return std::nullopt;
}

// The cell shows `value` to its printed precision: |value − shown| within half a unit in the cell's
// last place (`half_unit`; the 1e-9 only absorbs the decimal-to-binary reading of both); "inf" for a
// value the JSON writes as null (not finite).
void expect_shows(const std::string& cell, const Json& value, double half_unit, const std::string& what) {
    if (cell == "inf") {
        BOOST_TEST(value.is_null(), what << ": the table shows inf, the JSON " << value.dump());
        return;
    }
    BOOST_TEST_REQUIRE(value.is_number(), what << ": the table shows '" << cell << "', the JSON " << value.dump());
    const double shown = std::stod(cell), exact = value.get<double>();
    BOOST_TEST(std::fabs(exact - shown) <= half_unit * (1 + 1e-9),
               what << ": the table shows " << cell << ", the JSON " << fmt::format("{:.17g}", exact));
}

// {:.Ng}: N significant digits (fmt drops trailing zeros, so the unit is read from the first digit).
void expect_shows_significant(const std::string& cell, const Json& value, int significant, const std::string& what) {
    const std::optional<int> e = cell == "inf" ? std::nullopt : leading_exponent(cell);
    expect_shows(cell, value, e ? 0.5 * std::pow(10.0, *e - significant + 1) : 0.0, what);
}

// {:.Nf}: N decimals.
void expect_shows_decimals(const std::string& cell, const Json& value, int decimals, const std::string& what) {
    expect_shows(cell, value, 0.5 * std::pow(10.0, -decimals), what);
}

// A node row's error cell: the error's in_u (2 significant digits), "-" where nothing was measured.
void expect_error_cell(const std::string& cell, const Json& error, const std::string& what) {
    if (error.is_null()) {
        BOOST_TEST(cell == "-", what << ": not measured, the table shows " << cell);
        return;
    }
    BOOST_TEST_REQUIRE(cell != "-", what << ": measured, the table shows -");
    expect_shows_significant(cell, error.at("in_u"), 2, what);
}

bool finite_in(const Json& error) { return error.is_null() || error.at("finite").get<bool>(); }

// The JSON holds the struct: every field, non-finite numbers as null.
void expect_json_number(const Json& j, double x, const std::string& what) {
    if (std::isfinite(x)) {
        BOOST_TEST((j.is_number() && j.get<double>() == x), what << ": JSON " << j.dump() << ", struct " << x);
    } else {
        BOOST_TEST(j.is_null(), what << ": JSON " << j.dump() << " for " << x);
    }
}

void expect_json_error(const Json& j, const AuditError& e, const std::string& what) {
    if (!e.measured) {
        BOOST_TEST(j.is_null(), what << ": not measured, JSON " << j.dump());
        return;
    }
    BOOST_TEST_REQUIRE(j.is_object(), what << ": JSON " << j.dump());
    BOOST_TEST(j.size() == 7u, what << ": " << j.dump());
    expect_json_number(j.at("normwise"), e.normwise, what + " normwise");
    expect_json_number(j.at("worst_element"), e.worst_element, what + " worst element");
    BOOST_TEST(j.at("worst_at") == e.worst_at, what);
    expect_json_number(j.at("ulps"), e.ulps, what + " ULPs");
    expect_json_number(j.at("in_u"), e.in_u, what + " in u");
    expect_json_number(j.at("digits_lost"), e.digits_lost, what + " digits");
    BOOST_TEST(j.at("finite") == e.finite, what);
}

void expect_json_holds_the_audit(const Json& json, const PrecisionAudit& audit, const std::string& name) {
    BOOST_TEST(json.at("precision") == audit.precision, name);
    expect_json_number(json.at("unit_roundoff"), audit.unit_roundoff, name + ": u");
    expect_json_number(json.at("seconds"), audit.seconds, name + ": seconds");
    BOOST_TEST_REQUIRE(json.at("nodes").size() == audit.nodes.size(), name);
    for (std::size_t r = 0; r < audit.nodes.size(); ++r) {
        const Json& j = json["nodes"][r];
        const NodeAudit& n = audit.nodes[r];
        const std::string what = fmt::format("{}: JSON node at rank {}", name, r + 1);
        BOOST_TEST(j.at("rank") == r + 1, what);  // ranks count from 1, as the table's
        BOOST_TEST(j.at("node") == n.node, what);
        BOOST_TEST(j.at("op") == n.op, what);
        BOOST_TEST(j.at("label") == n.label, what);
        BOOST_TEST(j.at("shape") == n.shape, what);
        expect_json_number(j.at("local_digits"), n.local_digits, what + " local digits");
        expect_json_number(j.at("local_in_u"), n.local_in_u, what + " local in u");
        expect_json_error(j.at("local_forward"), n.local_forward, what + " local forward");
        expect_json_error(j.at("local_vjp"), n.local_vjp, what + " local VJP");
        expect_json_error(j.at("value"), n.value, what + " value");
        expect_json_error(j.at("adjoint"), n.adjoint, what + " adjoint");
    }
    BOOST_TEST_REQUIRE(json.at("events").size() == audit.events.size(), name);
    for (std::size_t e = 0; e < audit.events.size(); ++e) {
        const Json& j = json["events"][e];
        BOOST_TEST(j.at("node") == audit.events[e].node, name);
        BOOST_TEST(j.at("op") == audit.events[e].op, name);
        BOOST_TEST(j.at("run") == audit.events[e].run, name);
        BOOST_TEST(j.at("what") == audit.events[e].what, name);
    }
    BOOST_TEST_REQUIRE(json.at("leaves").size() == audit.leaves.size(), name);
    for (std::size_t l = 0; l < audit.leaves.size(); ++l) {
        const Json& j = json["leaves"][l];
        const LeafAudit& leaf = audit.leaves[l];
        const std::string what = fmt::format("{}: JSON leaf {}", name, leaf.name);
        BOOST_TEST(j.at("node") == leaf.node, what);
        BOOST_TEST(j.at("name") == leaf.name, what);
        expect_json_error(j.at("gradient"), leaf.gradient, what + " gradient");
        BOOST_TEST(j.at("top_contributor") == leaf.top_contributor, what);
        BOOST_TEST(j.at("top_contributor_op") == leaf.top_contributor_op, what);
        expect_json_number(j.at("top_contributor_share"), leaf.top_contributor_share, what + " share");
        if (leaf.predicted) {
            expect_json_number(j.at("predicted"), *leaf.predicted, what + " predicted");
        } else {
            BOOST_TEST(j.at("predicted").is_null(), what);
        }
        BOOST_TEST_REQUIRE(j.at("branches").size() == leaf.branches.size(), what);
        for (std::size_t b = 0; b < leaf.branches.size(); ++b) {
            const Json& jb = j["branches"][b];
            BOOST_TEST(jb.at("consumer") == leaf.branches[b].consumer, what);
            BOOST_TEST(jb.at("slot") == leaf.branches[b].slot, what);
            BOOST_TEST(jb.at("op") == leaf.branches[b].op, what);
            expect_json_error(jb.at("error"), leaf.branches[b].error, what + " branch");
        }
    }
}

// The table's parts, each against the JSON it shows (expect_table_shows_the_json puts them in order).

// The title and the column header.
void expect_table_header(const std::vector<std::string>& lines, const Json& json, const std::string& name) {
    std::smatch m;
    const std::string& title = lines[0];
    BOOST_TEST_REQUIRE(
        std::regex_match(title, m, std::regex(R"(precision audit, (.+) \(u = (\S+)\), (\d+) nodes, (\S+) s)")),
        name << ": " << title);
    BOOST_TEST(m.str(1) == json.at("precision").get<std::string>(), name);
    expect_shows_significant(m.str(2), json.at("unit_roundoff"), 3, name + ": u");
    BOOST_TEST(std::stoul(m.str(3)) == json.at("nodes").size(), name);
    expect_shows_decimals(m.str(4), json.at("seconds"), 2, name + ": seconds");
    BOOST_TEST(words_of(lines[2]) == (std::vector<std::string>{"rank", "node", "op", "label", "shape", "digits",
                                                               "local", "f", "local", "b", "value", "adjoint"}),
               name << ": " << lines[2]);
}

// The row of rank r + 1, each column against the node's field.
void expect_node_row(std::string line, const Json& n, std::size_t r, const std::string& name) {
    static const std::regex row_line(
        R"( *(\d+) +(\d+)  (\S+) +(.*?) +(\[[^\]]*\]) +(\S+) +(\S+) +(\S+) +(\S+) +(\S+))");
    const std::string what = fmt::format("{}: row {} (JSON node {})", name, r + 1, n.at("node").get<std::uint32_t>());
    const std::string mark = "  (inf/NaN)";
    const bool marked = line.ends_with(mark);
    if (marked) line.resize(line.size() - mark.size());
    // "{rank:>5} {node:>6}  {op:<14} {label:<14} {shape:<14} {digits:>7.1f} {f:>9} {b:>9} {value:>9} {adjoint:>9}":
    // ops and shapes are single words, a label may hold spaces (or be empty), the cells none.
    std::smatch c;
    BOOST_TEST_REQUIRE(std::regex_match(line, c, row_line), what << ": " << line);
    BOOST_TEST(c.str(1) == std::to_string(r + 1), what);
    BOOST_TEST(c.str(1) == std::to_string(n.at("rank").get<std::size_t>()), what);
    BOOST_TEST(c.str(2) == std::to_string(n.at("node").get<std::uint32_t>()), what);
    BOOST_TEST(c.str(3) == n.at("op").get<std::string>(), what);
    BOOST_TEST(c.str(4) == n.at("label").get<std::string>(), what);
    BOOST_TEST(c.str(5) == n.at("shape").get<std::string>(), what);
    expect_shows_decimals(c.str(6), n.at("local_digits"), 1, what + ", digits");
    expect_error_cell(c.str(7), n.at("local_forward"), what + ", local f");
    expect_error_cell(c.str(8), n.at("local_vjp"), what + ", local b");
    expect_error_cell(c.str(9), n.at("value"), what + ", value");
    expect_error_cell(c.str(10), n.at("adjoint"), what + ", adjoint");
    const bool lost = !finite_in(n.at("value")) || !finite_in(n.at("local_forward")) || !finite_in(n.at("local_vjp"));
    BOOST_TEST(marked == lost, what << ": marked (inf/NaN) " << marked);
}

// The events' heading and lines, from lines[at] on; `at` is left past them.
void expect_event_lines(const std::vector<std::string>& lines, std::size_t& at, const Json& events,
                        const std::string& name) {
    if (events.empty()) return;
    BOOST_TEST_REQUIRE(at < lines.size(), name);
    BOOST_TEST(lines[at++] == fmt::format("what the low precision made that an op refused, or that became inf or NaN "
                                          "({}):",
                                          events.size()),
               name);
    for (const Json& e : events) {
        BOOST_TEST_REQUIRE(at < lines.size(), name);
        BOOST_TEST(lines[at++] == fmt::format("  node {} ({}), in {}: {}", e.at("node").get<std::uint32_t>(),
                                              e.at("op").get<std::string>(), e.at("run").get<std::string>(),
                                              e.at("what").get<std::string>()),
                   name);
    }
}

// A leaf's error cells: "-" and an empty place when nothing was measured.
void expect_leaf_error_cells(const std::smatch& m, const Json& gradient, const std::string& what) {
    if (gradient.is_null()) {  // nothing measured: no figure
        BOOST_TEST(trimmed(m.str(2)) == "-", what << ": normwise " << m.str(2));
        BOOST_TEST(trimmed(m.str(4)) == "-", what << ": worst element " << m.str(4));
        BOOST_TEST(trimmed(m.str(5)).empty(), what << ": at " << m.str(5));
        BOOST_TEST(trimmed(m.str(6)) == "-", what << ": ULPs " << m.str(6));
        BOOST_TEST(trimmed(m.str(7)) == "-", what << ": digits " << m.str(7));
        return;
    }
    expect_shows_significant(trimmed(m.str(2)), gradient.at("normwise"), 2, what + ", normwise");
    expect_shows_significant(trimmed(m.str(4)), gradient.at("worst_element"), 2, what + ", worst element");
    BOOST_TEST(trimmed(m.str(5)) == gradient.at("worst_at").get<std::string>(), what);
    expect_shows_significant(trimmed(m.str(6)), gradient.at("ulps"), 3, what + ", ULPs");
    expect_shows_decimals(trimmed(m.str(7)), gradient.at("digits_lost"), 1, what + ", digits");
}

// A leaf's prediction cell: empty exactly when the JSON has none.
void expect_prediction_cell(const std::string& predicted, const Json& leaf, const std::string& what) {
    if (predicted.empty()) {
        BOOST_TEST(leaf.at("predicted").is_null(), what << ": no prediction shown, the JSON " << leaf.at("predicted"));
        return;
    }
    BOOST_TEST_REQUIRE((predicted.starts_with("(predicted ") && predicted.ends_with(")")), what << ": " << predicted);
    expect_shows_significant(predicted.substr(11, predicted.size() - 12), leaf.at("predicted"), 2,
                             what + ", predicted");
}

// A leaf's "top:" cell: its top contributor with its share, or the one that alone makes the gradient
// inf or NaN, or "none" and why.
void expect_top_cell(const std::string& top, const Json& leaf, const Json& nodes, const std::string& what) {
    static const std::regex top_share(R"(node (\d+) \((.+)\), (\d+)% alone)");
    static const std::regex top_lost(R"(node (\d+) \((.+)\), alone it makes the gradient inf or NaN)");
    std::smatch t;
    if (leaf.at("top_contributor_op").get<std::string>().empty()) {
        // No contributor, and why: no gradient reaches the leaf, or no node loses anything locally
        // (no candidate), or no contributor run was asked for (contributor_candidates = 0).
        const bool any_loses = std::any_of(nodes.begin(), nodes.end(), [](const Json& n) {
            return n.at("local_in_u").is_null() || n.at("local_in_u").get<double>() > 0;
        });
        const std::string why = leaf.at("gradient").is_null() ? "none (no gradient reaches it)"
                                : any_loses                   ? "none (no contributor runs)"
                                                              : "none (no node loses a digit)";
        BOOST_TEST(top == why, what << ": top " << top);
    } else if (std::regex_match(top, t, top_share)) {
        BOOST_TEST(t.str(1) == std::to_string(leaf.at("top_contributor").get<std::uint32_t>()), what);
        BOOST_TEST(t.str(2) == leaf.at("top_contributor_op").get<std::string>(), what);
        BOOST_TEST_REQUIRE(leaf.at("top_contributor_share").is_number(), what);
        expect_shows(t.str(3), Json(100 * leaf.at("top_contributor_share").get<double>()), 0.5, what + ", share");
    } else {
        BOOST_TEST_REQUIRE(std::regex_match(top, t, top_lost), what << ": top " << top);
        BOOST_TEST(t.str(1) == std::to_string(leaf.at("top_contributor").get<std::uint32_t>()), what);
        BOOST_TEST(t.str(2) == leaf.at("top_contributor_op").get<std::string>(), what);
        BOOST_TEST(leaf.at("top_contributor_share").is_null(), what);
    }
}

// A branch line under its leaf.
void expect_branch_line(const std::string& line, const Json& branch, const std::string& what) {
    static const std::regex branch_line(
        R"(      branch via node (\d+) \((\S+), input (\d+)\): normwise (\S+), (\S+) digits)");
    std::smatch m;
    BOOST_TEST_REQUIRE(std::regex_match(line, m, branch_line), what << ": " << line);
    BOOST_TEST(m.str(1) == std::to_string(branch.at("consumer").get<std::uint32_t>()), what);
    BOOST_TEST(m.str(2) == branch.at("op").get<std::string>(), what);
    BOOST_TEST(m.str(3) == std::to_string(branch.at("slot").get<std::uint32_t>()), what);
    expect_shows_significant(m.str(4), branch.at("error").at("normwise"), 2, what + ", branch normwise");
    expect_shows_decimals(m.str(5), branch.at("error").at("digits_lost"), 1, what + ", branch digits");
}

// A leaf's line and its branch lines, from lines[at] on; `at` is left past them.
void expect_leaf_lines(const std::vector<std::string>& lines, std::size_t& at, const Json& leaf, const Json& nodes,
                       const std::string& name) {
    // "  {name:<18} {normwise:>9} {(predicted p):<21} {worst:>9} at {where:<12} {ULPs:>9} ULP {digits:>5} digits
    //  top: …", each field padded to its width (the graphs here hold no longer names or numbers)
    static const std::regex leaf_line(
        R"(  (.{18}) (.{9}) (.{21}) (.{9}) at (.{12}) (.{9}) ULP (.{5}) digits   top: (.*))");
    const std::string what = fmt::format("{}: leaf {}", name, leaf.at("name").get<std::string>());
    BOOST_TEST_REQUIRE(at < lines.size(), what);
    const std::string& line = lines[at++];
    std::smatch m;
    BOOST_TEST_REQUIRE(std::regex_match(line, m, leaf_line), what << ": " << line);
    BOOST_TEST(trimmed(m.str(1)) == leaf.at("name").get<std::string>(), what);
    expect_leaf_error_cells(m, leaf.at("gradient"), what);
    expect_prediction_cell(trimmed(m.str(3)), leaf, what);
    expect_top_cell(m.str(8), leaf, nodes, what);
    for (const Json& branch : leaf.at("branches")) {
        BOOST_TEST_REQUIRE(at < lines.size(), what);
        expect_branch_line(lines[at++], branch, what);
    }
}

// The table, parsed, against the JSON, parsed: the header; the first `rows` nodes in rank order, each
// column against the field it shows; the events, in order; every leaf in order, each column; every
// branch; and nothing else.
void expect_table_shows_the_json(const PrecisionAudit& audit, std::size_t rows, const std::string& name) {
    const std::string table = audit.table(rows);
    const Json json = Json::parse(audit.json());
    const std::vector<std::string> lines = lines_of(table);
    BOOST_TEST_REQUIRE(lines.size() >= 4u, name << ":\n" << table);
    expect_table_header(lines, json, name);
    std::size_t at = 3;
    const Json& nodes = json.at("nodes");
    const std::size_t shown = std::min(rows, nodes.size());
    for (std::size_t r = 0; r < shown; ++r) {
        BOOST_TEST_REQUIRE(at < lines.size(), name);
        expect_node_row(lines[at++], nodes[r], r, name);
    }
    expect_event_lines(lines, at, json.at("events"), name);
    BOOST_TEST_REQUIRE(at < lines.size(), name);
    BOOST_TEST(lines[at].starts_with("leaf gradients: "), name << ": " << lines[at]);
    ++at;
    for (const Json& leaf : json.at("leaves")) expect_leaf_lines(lines, at, leaf, nodes, name);
    BOOST_TEST(at == lines.size(), name << ": lines past the last leaf: " << (at < lines.size() ? lines[at] : ""));
}

}  // namespace

// Issue 49 item 4: the table and the JSON are two outputs of one audit and must agree on every row,
// leaf and branch, whatever the graph, the precision, the storage and the number of rows asked
// (none, one, a few, one short of all, all, more than all). The JSON must also hold the audit
// itself, field by field (what the table does not show, as each node's worst element).
BOOST_AUTO_TEST_CASE(the_table_and_the_json_agree_on_every_row) {
    BOOST_TEST_REQUIRE(test_ops_registered);
    std::vector<AuditCase> cases = reference_cases();
    for (AuditCase& c : cases_with_events()) cases.push_back(std::move(c));
    std::size_t with_events = 0, with_lost = 0, with_branches = 0, unmeasured = 0;
    for (const AuditCase& c : cases) {
        const PrecisionAudit audit = c.audit(false);
        expect_json_holds_the_audit(Json::parse(audit.json()), audit, c.name);
        const std::size_t n = audit.nodes.size();
        for (const std::size_t rows : std::set<std::size_t>{0, 1, 3, 20, n - 1, n, n + 7})
            expect_table_shows_the_json(audit, rows, fmt::format("{}, {} rows", c.name, rows));
        with_events += !audit.events.empty();
        for (const NodeAudit& node : audit.nodes) with_lost += !node.value.finite;
        for (const LeafAudit& leaf : audit.leaves) {
            with_branches += !leaf.branches.empty();
            unmeasured += !leaf.gradient.measured;
        }
    }
    // The cases reach every kind of cell: events, inf/NaN rows, branch lines, a leaf with no gradient.
    BOOST_TEST(with_events >= 3u);
    BOOST_TEST(with_lost >= 3u);
    BOOST_TEST(with_branches >= 3u);
    BOOST_TEST(unmeasured >= 1u);
}

// ---- one promise each ----

namespace {

// σ' as Y(1 − Y) from the rounded output: at inputs 4 to 8, 1 − Y cancels (Y ≈ 0.98 to 0.9997), so
// the VJP loses 1 to 3 digits while the forward loses none: a node whose VJP is worse than its forward.
struct SigmoidFromOutput : Sigmoid {
    static constexpr std::string_view name = "sigmoid_1-y";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] * at.out[k] * (1 - at.out[k]);
    }
};

const bool sigmoid_registered = register_siblings<SigmoidFromOutput>();

const NodeAudit& node_at(const PrecisionAudit& audit, std::uint32_t index) {
    const auto found =
        std::find_if(audit.nodes.begin(), audit.nodes.end(), [&](const NodeAudit& n) { return n.node == index; });
    if (found == audit.nodes.end()) throw std::runtime_error(fmt::format("node {} is not in the audit", index));
    return *found;
}

std::size_t rank_of(const PrecisionAudit& audit, std::uint32_t index) {
    return static_cast<std::size_t>(&node_at(audit, index) - audit.nodes.data());
}

Tensor<float> random_floats(const Shape& shape, std::uint64_t seed, double low, double high) {
    std::mt19937_64 rng(seed);
    return uniform<float>(shape, rng, low, high);
}

}  // namespace

// "nodes: ranked: largest local error first"; "the table is ranked by it (in units of u, so that below
// one u the order still says where the rounding is)"; ties (not said, but what makes the order
// deterministic: a stable sort) keep recorded order. In bfloat16 every node here loses less than one
// u locally, so every node's digits are 0 and only in_u orders them; the recorded order is not that
// order; and two identical muls tie exactly. Breaks: ranking by local_digits (recorded order comes
// back), equal keys by node descending.
BOOST_AUTO_TEST_CASE(the_ranking_is_by_local_error_in_u_and_ties_keep_recorded_order) {
    Tape<float> tape;
    const Var<float> x = tape.leaf(random_floats(Shape{8}, 31, -1, 1), "x");
    const Var<float> C = tape.constant(random_floats(Shape{8}, 32, 0.5, 1.5), "C");
    const Var<float> a = mul(x, C), b = mul(x, C);
    const Var<float> J = sum(add(a, b));
    const PrecisionAudit audit = audit_precision(tape, J, {.storage = Storage::bfloat16});
    BOOST_TEST_MESSAGE(audit.table());
    bool recorded_order_is_in_u_order = true;
    for (std::uint32_t i = 0; i + 1 <= J.index(); ++i) {
        BOOST_TEST_REQUIRE(node_at(audit, i).local_digits == 0.0);  // the premise: digits cannot order them
        if (i > 0) recorded_order_is_in_u_order &= node_at(audit, i - 1).local_in_u >= node_at(audit, i).local_in_u;
    }
    BOOST_TEST_REQUIRE(!recorded_order_is_in_u_order);
    BOOST_TEST_REQUIRE(node_at(audit, a.index()).local_in_u == node_at(audit, b.index()).local_in_u);
    BOOST_TEST_REQUIRE(node_at(audit, a.index()).local_in_u > 0.0);
    for (std::size_t r = 1; r < audit.nodes.size(); ++r) {
        const NodeAudit &before = audit.nodes[r - 1], &after = audit.nodes[r];
        BOOST_TEST(before.local_in_u >= after.local_in_u, "rank " << r);
        if (before.local_in_u == after.local_in_u) BOOST_TEST(before.node < after.node, "rank " << r);
    }
    BOOST_TEST(rank_of(audit, b.index()) == rank_of(audit, a.index()) + 1);
    BOOST_TEST(&audit.worst() == &audit.nodes.front());
}

// "worst(): nodes.front(); usage_error when empty."
BOOST_AUTO_TEST_CASE(worst_is_refused_on_an_empty_audit) {
    BOOST_CHECK_THROW((void)PrecisionAudit{}.worst(), usage_error);
}

// "events: in the order met; at most one per node and run" and (src/check/audit.cpp's EventLog) "the
// first: the cause". Two nodes whose VJP refuses in float, b = twice(a), a = twice(x): the float run's
// backward meets b before a, then the stage per node meets x's lost gradient (NaN), a's and b's lost
// gradients (already noted for that run: the refusal is kept) and each refusal alone on exact
// inputs, then the contributor runs meet a, then b (tied first in the ranking, in recorded order).
// Breaks: no deduplication (two events at a in the float run), the last event kept instead of the
// first, events sorted by node.
BOOST_AUTO_TEST_CASE(events_are_in_the_order_met_one_per_node_and_run_the_first_kept) {
    BOOST_TEST_REQUIRE(test_ops_registered);
    Tape<float> tape;
    const Var<float> x = tape.leaf(Tensor<float>::matrix({{0.5f, -1.5f}, {2, 0.25f}}), "x");
    const Var<float> a = tape.record<DoubleWhoseVjpRefusesInFloat>({x});
    const Var<float> b = tape.record<DoubleWhoseVjpRefusesInFloat>({a});
    const PrecisionAudit audit = audit_precision(tape, sum(mul(b, b)));
    BOOST_TEST_MESSAGE(audit.table());
    const std::string low = "the float32 run", alone = "the node alone on exact inputs in float32";
    const std::string refused = "twice_refusing: refused in float";
    struct Met {
        std::uint32_t node;
        std::string run, what;
    };
    const std::vector<Met> expected{
        {b.index(), low, refused},
        {a.index(), low, refused},
        {x.index(), low, "gradient at (0, 0) is NaN (true 16)"},  // dJ/dx = 32x
        {a.index(), alone, refused},
        {b.index(), alone, refused},
        {a.index(), fmt::format("node {} alone in float32", a.index()), refused},
        {b.index(), fmt::format("node {} alone in float32", b.index()), refused},
    };
    BOOST_TEST_REQUIRE(audit.events.size() == expected.size(), audit.table());
    for (std::size_t e = 0; e < expected.size(); ++e) {
        BOOST_TEST(audit.events[e].node == expected[e].node, "event " << e);
        BOOST_TEST(audit.events[e].run == expected[e].run, "event " << e);
        BOOST_TEST(audit.events[e].what == expected[e].what, "event " << e);
        BOOST_TEST(audit.events[e].op == (expected[e].node == x.index() ? "leaf" : "twice_refusing"), "event " << e);
    }
    // And in every audit with events: no node twice in one run.
    for (const AuditCase& c : cases_with_events()) {
        const PrecisionAudit other = c.audit(false);
        std::set<std::pair<std::uint32_t, std::string>> seen;
        for (const AuditEvent& e : other.events)
            BOOST_TEST(seen.insert({e.node, e.run}).second, c.name << ": node " << e.node);
    }
}

// AuditEvent: "The audit goes on past each: the node's value is NaN from there, and the nodes
// downstream are audited with it." In the bfloat16 run the variance E[x²] − E[x]² of x = (98, 98, 98,
// 98.5 five times), truly 0.059, is 9664 − 9728 = −64 (x² rounded to 9600 and 9728, their mean 9680
// to 9664; the mean 98.3125 rounded to 98.5, its square to 9728): sqrt refuses it in the low run, so sqrt's
// value and every value computed from it are lost (not finite), every other value is finite, and
// every node is audited. Break: a refused value filled with zeros (finite) instead of NaN.
BOOST_AUTO_TEST_CASE(a_refused_value_is_nan_and_the_nodes_downstream_carry_it) {
    Tape<float> tape;
    const Var<float> X = tape.leaf(Tensor<float>({1, 8}, {98, 98, 98, 98.5f, 98.5f, 98.5f, 98.5f, 98.5f}), "X");
    const Var<float> m = mean(X, 1, true);
    const Var<float> variance = sub(mean(mul(X, X), 1, true), mul(m, m));
    const Var<float> root = sqrt(shift(variance, 1e-6f));
    const Var<float> J = sum(div(sub(X, m), root));
    const PrecisionAudit audit = audit_precision(tape, J, {.storage = Storage::bfloat16});
    BOOST_TEST_MESSAGE(audit.table());
    BOOST_TEST_REQUIRE(audit.nodes.size() == J.index() + 1);
    std::vector<char> downstream(J.index() + 1, 0);
    downstream[root.index()] = 1;
    for (std::uint32_t i = root.index() + 1; i <= J.index(); ++i)
        for (const std::uint32_t k : tape.recorded(i).inputs) downstream[i] |= downstream[k];
    for (std::uint32_t i = 0; i <= J.index(); ++i) {
        BOOST_TEST(node_at(audit, i).value.measured, "node " << i);
        BOOST_TEST(node_at(audit, i).value.finite == !downstream[i],
                   "node " << i << " (" << node_at(audit, i).op << ")");
    }
    const auto refusal = std::find_if(audit.events.begin(), audit.events.end(), [&](const AuditEvent& e) {
        return e.node == root.index() && e.run == "the bfloat16 (computing in float32) run";
    });
    BOOST_TEST_REQUIRE((refusal != audit.events.end()));
    BOOST_TEST(refusal->what.find("is negative") != std::string::npos, refusal->what);
}

// src/check/audit.cpp: a value that becomes inf or NaN where the truth is finite is noted "at the node
// where it arises" (an inf where its inputs were finite), naming "the first element", and a lost
// gradient only "where the node's own value is finite". e^11.5 and e^12 overflow float16 at (0, 1)
// and (1, 1); 2e^x and the products after it hold inf from their input and are not noted, though
// 2e^x's gradient (4·2e^x·C) is inf too; the leaf's gradient, inf at (0, 1), is noted at the leaf.
// Breaks: noting every non-finite value (the inputs not looked at), the last element named instead
// of the first, a lost gradient noted at a node whose value is lost already.
BOOST_AUTO_TEST_CASE(an_inf_is_noted_where_it_arises_at_its_first_element) {
    Tape<float> tape;
    const Var<float> A = tape.leaf(Tensor<float>::matrix({{0.5f, 11.5f}, {-1, 12}}), "A");
    const Var<float> E = exp(A);
    const Var<float> F = scale(E, 2.0f);
    const Var<float> J = sum(mul(mul(F, F), tape.constant(Tensor<float>::matrix({{1, 0.75f}, {1.5f, 1}}), "C")));
    const PrecisionAudit audit = audit_precision(tape, J, {.storage = Storage::float16});
    BOOST_TEST_MESSAGE(audit.table());
    BOOST_TEST_REQUIRE(!node_at(audit, F.index()).adjoint.finite);  // the premise: F's gradient is lost too
    std::vector<AuditEvent> in_the_low_run;
    for (const AuditEvent& e : audit.events)
        if (e.run == "the float16 (computing in float32) run") in_the_low_run.push_back(e);
    BOOST_TEST_REQUIRE(in_the_low_run.size() == 2u, audit.table());
    BOOST_TEST(in_the_low_run[0].node == A.index());
    BOOST_TEST(in_the_low_run[0].what.starts_with("gradient at (0, 1) is inf"), in_the_low_run[0].what);
    BOOST_TEST(in_the_low_run[1].node == E.index());
    BOOST_TEST(in_the_low_run[1].what.starts_with("value at (0, 1) is inf (true 98715.8)"), in_the_low_run[1].what);
    // The lost gradient: no share of an inf error ("inf when the gradient is lost: no share").
    BOOST_TEST(!audit.leaves.at(0).gradient.finite);
    BOOST_TEST(audit.leaves.at(0).top_contributor_share == 0.0);
    BOOST_TEST(audit.worst().node == E.index());
    BOOST_TEST(audit.worst().local_digits == std::log10(0x1p11));  // every digit of float16 lost
}

// The top contributor: "of the nodes that lose the most digits locally, the one whose low-precision
// evaluation alone ... moves that gradient most", and its share "its error alone over the whole
// error". J = Σ (x ∘ C) ∘ D twice, as two identical branches: x's gradient is r + r with r = C·D
// rounded to float by each inner mul's VJP, and nothing else rounds it (the outer muls' VJPs and the
// sums' are exact products by 1). The two inner muls move it equally, each by exactly half the whole
// error (its r beside an exact C·D): a tie, which the first in the ranking takes (they tie there too,
// so recorded order: the first branch). Breaks: the later of equals taken (≥ for >), the share
// inverted or taken over the node's own local error.
BOOST_AUTO_TEST_CASE(the_top_contributor_of_two_equal_branches_is_the_first_with_half_the_error) {
    Tape<float> tape;
    const Var<float> x = tape.leaf(random_floats(Shape{6}, 41, -1, 1), "x");
    const Var<float> C = tape.constant(random_floats(Shape{6}, 42, 0.5, 1.5), "C");
    const Var<float> D = tape.constant(random_floats(Shape{6}, 43, 0.5, 1.5), "D");
    const Var<float> first = mul(x, C);
    const Var<float> J1 = sum(mul(first, D));
    const Var<float> second = mul(x, C);
    const Var<float> J = add(J1, sum(mul(second, D)));
    const PrecisionAudit audit = audit_precision(tape, J);
    BOOST_TEST_MESSAGE(audit.table());
    const LeafAudit& leaf = audit.leaves.at(0);
    BOOST_TEST_REQUIRE(leaf.gradient.normwise > 0.0);  // C·D rounds in float
    BOOST_TEST_REQUIRE(node_at(audit, first.index()).local_in_u == node_at(audit, second.index()).local_in_u);
    BOOST_TEST(leaf.top_contributor == first.index());
    BOOST_TEST(leaf.top_contributor_op == "mul");
    // Half: the run's exact part is at double, 2^-29 of the float rounding it measures.
    BOOST_TEST(leaf.top_contributor_share == 0.5, boost::test_tools::tolerance(1e-6));
}

// No contributor where none exists: every value here is exact in float (small integers times 2, their
// sum), so no node loses anything locally, there is no candidate, and the table says why.
BOOST_AUTO_TEST_CASE(no_node_losing_anything_gives_no_contributor) {
    Tape<float> tape;
    const Var<float> x = tape.leaf(Tensor<float>({4}, {1, -2, 3, 5}), "x");
    const PrecisionAudit audit =
        audit_precision(tape, sum(mul(x, tape.constant(Tensor<float>(Shape{4}, 2.0f), "two"))));
    for (const NodeAudit& n : audit.nodes) BOOST_TEST_REQUIRE(n.local_in_u == 0.0, "node " << n.node);
    const LeafAudit& leaf = audit.leaves.at(0);
    BOOST_TEST(leaf.top_contributor_op.empty());
    BOOST_TEST(leaf.top_contributor == 0u);
    BOOST_TEST(leaf.top_contributor_share == 0.0);
    BOOST_TEST(audit.table().find("top: none (no node loses a digit)") != std::string::npos, audit.table());
}

// AuditError's definitions where they part from each other (see cancellation_graph): normwise
// exactly 1 is every digit lost, log10(1/u), the clipping bound; an error 40 times the truth is
// clipped there too (in_u is not); 0/0 counts as 0 (else the lost value's worst element would be
// inf); of equally bad elements the first is named; an error against an exact zero is d/0 = inf
// while the value stays finite; against a truth that is zero everywhere the normwise error is
// ‖low − true‖₂ itself, 0.7 u here, and no digit is lost (not a negative number of digits).
// Breaks: no upper clip, no lower clip, 0/0 as inf, normwise 0/0 where the truth is zero.
BOOST_AUTO_TEST_CASE(errors_are_relative_clipped_and_defined_at_zero) {
    Tape<float> tape;
    const Cancellation c = cancellation_graph(tape);
    const PrecisionAudit audit = audit_precision(tape, c.J);
    BOOST_TEST_MESSAGE(audit.table());
    const double most = std::log10(0x1p24);
    const AuditError& lost = node_at(audit, c.lost.index()).value;
    BOOST_TEST(lost.normwise == 1.0);
    BOOST_TEST(lost.in_u == 0x1p24);
    BOOST_TEST(lost.digits_lost == most);
    BOOST_TEST(lost.worst_element == 1.0);
    BOOST_TEST(lost.worst_at == "(0)");
    BOOST_TEST(lost.finite);
    const AuditError& beyond = node_at(audit, c.beyond.index()).value;
    // beyond is (0, 0, 0) − w = (−w0, 0, −w2) in float, (y0 − w0, 0, y2 − w2 = 0) in truth: off by (y0, 0, w2).
    const double y0 = 3e-8f, w0 = 2.9e-8f, y2 = 2.9e-8f, w2 = 2.9e-8f;
    BOOST_TEST(beyond.normwise == std::hypot(y0, w2) / (y0 - w0), boost::test_tools::tolerance(1e-12));
    BOOST_TEST(beyond.in_u > 0x1p24);
    BOOST_TEST(beyond.digits_lost == most);
    BOOST_TEST(beyond.worst_element == std::numeric_limits<double>::infinity());
    BOOST_TEST(beyond.worst_at == "(2)");
    BOOST_TEST(beyond.finite);
    const AuditError& against_zero = node_at(audit, c.against_zero.index()).value;
    BOOST_TEST(against_zero.normwise == std::hypot(y0, y2), boost::test_tools::tolerance(1e-12));
    BOOST_TEST(against_zero.in_u < 1.0);
    BOOST_TEST(against_zero.digits_lost == 0.0);
    BOOST_TEST(against_zero.worst_element == std::numeric_limits<double>::infinity());
}

// measure: "An infinity the truth holds too (a mask's −inf) is exact; any other is a lost value." The
// masked scores hold −inf at the hidden places in the float run and in the truth: the mask node's
// value and its local error stay finite, and so does every other node's. Break: every inf lost.
BOOST_AUTO_TEST_CASE(an_infinity_the_truth_holds_too_is_exact) {
    Tape<float> tape;
    const Var<float> J = masked_graph(tape, 7);
    const PrecisionAudit audit = audit_precision(tape, J);
    for (const NodeAudit& n : audit.nodes) {
        BOOST_TEST(n.value.finite, "node " << n.node << " (" << n.op << ")");
        BOOST_TEST(n.local_forward.finite, "node " << n.node << " (" << n.op << ")");
        if (n.op == "mask") BOOST_TEST(n.value.normwise < 1e-6, n.value.normwise);  // the scores' rounding, carried
    }
    BOOST_TEST(audit.events.empty());
}

// ulps: "in units in the last place of the true value, in the storage format": in float16 below its
// smallest normal number (2^-14 ≈ 6.1e-5) the last place is the subnormals' 2^-24, not 2^(e − 10).
// Values 2e-6 to 5e-6 kept in float16 round to multiples of 2^-24 ≈ 6e-8: at most half of one; of
// eight roundings the largest is above a quarter. Break: the exponent not held at the format's
// smallest (units of 2^-29 to 2^-28, 8 to 16 times smaller: up to 8 ULPs).
BOOST_AUTO_TEST_CASE(ulps_below_float16s_normal_range_are_its_subnormal_spacing) {
    Tape<float> tape;
    const Var<float> x = tape.leaf(random_floats(Shape{8}, 51, 2e-6, 5e-6), "x");
    const PrecisionAudit audit = audit_precision(
        tape, sum(mul(x, tape.constant(random_floats(Shape{8}, 52, 0.5, 1.5), "C"))), {.storage = Storage::float16});
    const AuditError& stored = node_at(audit, x.index()).local_forward;  // the leaf kept in float16
    BOOST_TEST(stored.ulps <= 0.5);
    BOOST_TEST(stored.ulps > 0.25);
}

// "What an op saves for its VJP (indices, statistics) stays in the computing precision." copy_saving
// saves 257 and its VJP reads 257 − 256 = 1; bfloat16 would hold 257 as 256 and make every gradient
// 0. Everything else here is exact in bfloat16 (x, the constant, the sums), so the local VJP error and
// x's gradient error are exactly 0. Breaks: the saved tensor kept in the storage format in the
// node-alone stage, or in the low run.
BOOST_AUTO_TEST_CASE(what_an_op_saves_stays_in_the_computing_precision) {
    BOOST_TEST_REQUIRE(test_ops_registered);
    Tape<float> tape;
    const Var<float> x = tape.leaf(Tensor<float>({4}, {1, 0.5f, 2, -1.5f}), "x");
    const Var<float> Y = tape.record<CopySavingAStatistic>({x});
    const PrecisionAudit audit = audit_precision(
        tape, sum(mul(Y, tape.constant(Tensor<float>({4}, {1, 2, 0.75f, 1.5f}), "C"))), {.storage = Storage::bfloat16});
    BOOST_TEST_MESSAGE(audit.table());
    BOOST_TEST(node_at(audit, Y.index()).local_vjp.measured);
    BOOST_TEST(node_at(audit, Y.index()).local_vjp.normwise == 0.0);
    BOOST_TEST(audit.leaves.at(0).gradient.normwise == 0.0);
}

// local_vjp: "the worst over the node's inputs that need a gradient". matmul(A, B) with A a leaf of
// random floats and B a constant of small integers: with G = ones, dA = G·Bᵀ holds B's row sums,
// exact, while dB = Aᵀ·G, which B does not need, would round A's column sums. Break: every input's
// VJP measured.
BOOST_AUTO_TEST_CASE(the_local_vjp_is_over_the_inputs_that_need_a_gradient) {
    Tape<float> tape;
    const Tensor<float> a = random_floats(Shape{3, 4}, 61, -1, 1);
    const Var<float> A = tape.leaf(a, "A");
    const Var<float> P = matmul(A, tape.constant(Tensor<float>::matrix({{1, 2}, {-3, 1}, {2, 2}, {0, -1}}), "B"));
    const PrecisionAudit audit = audit_precision(tape, sum(P));
    bool column_sum_rounds = false;  // the premise: Aᵀ·1 is not exact in float
    for (std::size_t j = 0; j < 4; ++j) {
        float in_float = 0;
        double exact = 0;
        for (std::size_t i = 0; i < 3; ++i) {
            in_float += a[i * 4 + j];
            exact += a[i * 4 + j];
        }
        column_sum_rounds |= static_cast<double>(in_float) != exact;
    }
    BOOST_TEST_REQUIRE(column_sum_rounds);
    BOOST_TEST(node_at(audit, P.index()).local_vjp.measured);
    BOOST_TEST(node_at(audit, P.index()).local_vjp.normwise == 0.0);
}

// The worse of two inputs' errors (src/check/audit.cpp's worse: "by digits lost, then by normwise
// error"): in mul(x, y) with upstream gradient D, dx = D·y and dy = D·x are each rounded once, both
// below one u (0 digits: a tie on the first key), and dy's error is the larger (a fixed draw, checked):
// local_vjp is dy's, the second input's. Break: the first input's kept on equal digits.
BOOST_AUTO_TEST_CASE(the_local_vjp_is_the_worse_input_by_normwise_on_equal_digits) {
    const Tensor<float> xs = random_floats(Shape{8}, 72, 0.5, 1.5), ys = random_floats(Shape{8}, 71, 0.5, 1.5),
                        ds = random_floats(Shape{8}, 73, 0.5, 1.5);
    const auto product_error = [](const Tensor<float>& a,
                                  const Tensor<float>& b) {  // float a ∘ b against double's, exact
        double lost2 = 0, true2 = 0;
        for (std::size_t k = 0; k < a.size(); ++k) {
            const double exact = static_cast<double>(a[k]) * b[k], low = static_cast<float>(a[k] * b[k]);
            lost2 += (low - exact) * (low - exact);
            true2 += exact * exact;
        }
        return std::sqrt(lost2 / true2);
    };
    const double dx_error = product_error(ds, ys), dy_error = product_error(ds, xs);
    BOOST_TEST_REQUIRE(dx_error < dy_error);
    BOOST_TEST_REQUIRE(dy_error < 0x1p-24);
    Tape<float> tape;
    const Var<float> x = tape.leaf(xs, "x"), y = tape.leaf(ys, "y");
    const Var<float> product = mul(x, y);
    const PrecisionAudit audit = audit_precision(tape, sum(mul(product, tape.constant(ds, "D"))));
    const AuditError& vjp = node_at(audit, product.index()).local_vjp;
    BOOST_TEST(vjp.digits_lost == 0.0);
    BOOST_TEST(vjp.normwise == dy_error, boost::test_tools::tolerance(1e-12));
}

// local_forward, local_vjp: "its op evaluated in the low precision on the exact inputs ..., and its VJP
// on the exact inputs and the exact upstream gradient (rounded)": "This lays an error at the node that
// makes it, not at every node that carries it". d = e^x − c with c = the float e^x less 1e-4 cancels:
// d's float value is wrong by e^x's rounding, 1e-3 of d; 2d carries that (its value error ≫ 100 u)
// but makes none (2 · the exact d rounded: at most one u); log d's gradient 1/d is wrong as much,
// which d's VJP (a copy of the gradient) carries into its adjoint but does not make. Breaks: the
// node-alone stage reading the float run's inputs, or its upstream gradient.
BOOST_AUTO_TEST_CASE(a_local_error_is_made_not_carried) {
    Tape<float> tape;
    const Var<float> x = tape.leaf(random_floats(Shape{6}, 81, 0.5, 1), "x");
    const Var<float> y = exp(x);
    Tensor<float> c = y.value();
    for (float& v : c.data()) v -= 1e-4f;
    const Var<float> d = sub(y, tape.constant(c, "c"));
    const Var<float> twice = scale(d, 2.0f);
    const PrecisionAudit audit = audit_precision(tape, sum(add(log(d), twice)));
    BOOST_TEST_MESSAGE(audit.table());
    BOOST_TEST(node_at(audit, twice.index()).value.in_u > 100.0);
    BOOST_TEST(node_at(audit, twice.index()).local_forward.in_u <= 1.0);
    BOOST_TEST(node_at(audit, d.index()).adjoint.in_u > 100.0);
    BOOST_TEST(node_at(audit, d.index()).local_vjp.in_u <= 1.0);
}

// Storage: "every value and every gradient the graph keeps is rounded to that format", a sum of
// gradients included (src/check/audit.cpp: "a first contribution is stored as it came", the sum kept
// in the format). x feeds two muls by C1 and C2 (floats bfloat16 cannot hold); each contribution is
// C rounded to bfloat16, exactly; their sum, exact in float, is rounded again: x's gradient error is
// ‖bf16(bf16(C1) + bf16(C2)) − (C1 + C2)‖ / ‖C1 + C2‖, computed here (and not the error without the
// second rounding, checked). Break: the sum not kept in the format.
BOOST_AUTO_TEST_CASE(a_sum_of_gradients_is_kept_in_the_storage_format) {
    const Tensor<float> c1 = random_floats(Shape{8}, 91, 0.5, 1.5), c2 = random_floats(Shape{8}, 92, 0.5, 1.5);
    const auto bf16 = [](double v) { return round_to(Storage::bfloat16, v); };
    double lost2 = 0, unrounded2 = 0, true2 = 0;
    for (std::size_t k = 0; k < 8; ++k) {
        const double exact = static_cast<double>(c1[k]) + c2[k], added = bf16(c1[k]) + bf16(c2[k]);
        lost2 += (bf16(added) - exact) * (bf16(added) - exact);
        unrounded2 += (added - exact) * (added - exact);
        true2 += exact * exact;
    }
    BOOST_TEST_REQUIRE(lost2 != unrounded2);
    Tape<float> tape;
    const Var<float> x = tape.leaf(Tensor<float>({8}, {0.5f, -1, 1.5f, 2, 0.25f, -0.75f, 1, 3}), "x");
    const Var<float> J = add(sum(mul(x, tape.constant(c1, "C1"))), sum(mul(x, tape.constant(c2, "C2"))));
    const PrecisionAudit audit = audit_precision(tape, J, {.storage = Storage::bfloat16});
    BOOST_TEST(audit.leaves.at(0).gradient.normwise == std::sqrt(lost2 / true2), boost::test_tools::tolerance(1e-12));
}

// "A node's local error then includes the rounding of what it produces to the storage format (its
// value; its VJP's contributions)". 3x with x = 1 + 2^-7 is 3 + 3·2^-7 (9 bits) and 3·C with
// C = 1 + 2^-10 is 3 + 3·2^-10 (12 bits): exact in float, rounded in bfloat16. Recorded: no local
// error; in bfloat16: both. Breaks: the node-alone stage not keeping its output, or its VJP's
// results, in the storage format.
BOOST_AUTO_TEST_CASE(a_local_error_includes_keeping_the_result_in_the_storage_format) {
    Tape<float> tape;
    const Var<float> x = tape.leaf(Tensor<float>(Shape{2}, 1 + 0x1p-7f), "x");
    const Var<float> tripled = scale(x, 3.0f);
    const Var<float> J = sum(mul(tripled, tape.constant(Tensor<float>(Shape{2}, 1 + 0x1p-10f), "C")));
    const NodeAudit recorded = node_at(audit_precision(tape, J), tripled.index());
    BOOST_TEST(recorded.local_forward.normwise == 0.0);
    BOOST_TEST(recorded.local_vjp.normwise == 0.0);
    const NodeAudit kept = node_at(audit_precision(tape, J, {.storage = Storage::bfloat16}), tripled.index());
    BOOST_TEST(kept.local_forward.normwise > 0.0);
    BOOST_TEST(kept.local_vjp.normwise > 0.0);
    BOOST_TEST(kept.local_forward.in_u <= 1.0);  // one rounding to nearest
    BOOST_TEST(kept.local_vjp.in_u <= 1.0);
}

// dot(): "The tape's picture (io/graphviz.hpp's layout) with each node filled by its local error: white
// (nothing lost) to red (every digit lost), the digits in its label"; inputs: "by node index: the
// nodes it reads". For every node of three audits: one node statement, in index order, labelled op,
// label, shape and local digits; a box for a leaf or constant, an ellipse for an op; its fill
// #ffGGBB with green = blue = 255·(1 − digits / log10(1/u)) to the nearest integer; one edge per
// input slot (numbered when there are several). The audits hold white nodes, a red one (float16's
// overflowed exp), and nodes in between whose VJP loses more than their forward (sigmoid_1-y: the
// fill follows local_digits, the max of both). Breaks: the fill from the forward's digits alone,
// white and red swapped, an input missed.
BOOST_AUTO_TEST_CASE(the_picture_fills_each_node_by_its_local_digits) {
    BOOST_TEST_REQUIRE(sigmoid_registered);
    std::vector<PrecisionAudit> audits;
    {
        Tape<float> tape;
        const Var<float> A = tape.leaf(random_floats(Shape{2, 4}, 101, 4, 8), "A");
        audits.push_back(
            audit_precision(tape, sum(mul(tape.record<SigmoidFromOutput>({A}),
                                          tape.constant(random_floats(Shape{2, 4}, 102, 0.5, 1.5), "C")))));
    }
    for (AuditCase& c : cases_with_events())
        if (c.name == "exp overflowing float16") audits.push_back(c.audit(false));
    audits.push_back(reference_cases().at(0).audit(false));  // the mixed graph: every kind of input
    std::size_t white = 0, red = 0, between = 0, vjp_worse = 0;
    const std::regex node_line(
        R"rx(  n(\d+) \[label="(.*)", shape=(box|ellipse), fillcolor="#ff([0-9a-f]{2})([0-9a-f]{2})"\];)rx");
    for (const PrecisionAudit& audit : audits) {
        const std::string dot = audit.dot();
        const double most = std::log10(1 / audit.unit_roundoff);
        BOOST_TEST(dot.find(fmt::format("  label=\"{}: local digits lost, white none, red all\";\n",
                                        audit.precision)) != std::string::npos);
        std::vector<std::uint32_t> drawn;
        std::set<std::string> edges;
        for (const std::string& line : lines_of(dot)) {
            std::smatch m;
            if (std::regex_match(line, m, node_line)) {
                drawn.push_back(static_cast<std::uint32_t>(std::stoul(m.str(1))));
                const NodeAudit& n = node_at(audit, drawn.back());
                const std::string what = fmt::format("{}: node {}", audit.precision, n.node);
                BOOST_TEST(m.str(2) == fmt::format("{}{}\\n{}\\n{:.1f} digits", n.op,
                                                   n.label.empty() ? "" : " " + n.label, n.shape, n.local_digits),
                           what);
                BOOST_TEST(m.str(3) == (n.op == "leaf" || n.op == "constant" ? "box" : "ellipse"), what);
                const int green = std::stoi(m.str(4), nullptr, 16), blue = std::stoi(m.str(5), nullptr, 16);
                BOOST_TEST(green == blue, what);
                BOOST_TEST(std::fabs(green - 255 * (1 - std::clamp(n.local_digits / most, 0.0, 1.0))) <= 0.5, what);
                white += green == 255;
                red += green == 0;
                between += green > 0 && green < 255;
                vjp_worse += n.local_vjp.digits_lost > n.local_forward.digits_lost && green < 255;
            } else if (line.find(" -> ") != std::string::npos) {
                edges.insert(line);
            }
        }
        std::vector<std::uint32_t> every(audit.nodes.size());
        std::iota(every.begin(), every.end(), 0u);
        BOOST_TEST(drawn == every, audit.precision << ": node statements not one per node in index order");
        std::set<std::string> expected;
        BOOST_TEST_REQUIRE(audit.inputs.size() == audit.nodes.size());
        for (std::uint32_t i = 0; i < audit.inputs.size(); ++i)
            for (std::size_t slot = 0; slot < audit.inputs[i].size(); ++slot)
                expected.insert(fmt::format("  n{} -> n{}{}", audit.inputs[i][slot], i,
                                            audit.inputs[i].size() > 1 ? fmt::format(" [label=\"{}\"];", slot) : ";"));
        BOOST_TEST((edges == expected), audit.precision);
    }
    BOOST_TEST(white >= 1u);
    BOOST_TEST(red >= 1u);
    BOOST_TEST(between >= 1u);
    BOOST_TEST(vjp_worse >= 1u);
}

// estimate_precision: each leaf that needs a gradient, in recorded order, named by its label or
// "leaf N" (N its node), its spread's digits "log10(normwise / u), clipped to [0, log10(1/u)]", the
// precision and u of the tape, the runs asked; a given seed draws the same spreads, another seed
// others; a leaf whose gradient is exactly zero (Z times zeros) has no spread and no digit lost.
// Breaks: digits not clipped at 0, leaves out of order, "leaf N" by the leaf's ordinal.
namespace {

template <Scalar S>
void expect_estimate_structure() {
    Tape<S> tape;
    const Var<S> J = mixed_graph(tape, 5);
    const PrecisionEstimate first = estimate_precision(tape, J, {.runs = 4, .seed = 3});
    const PrecisionEstimate again = estimate_precision(tape, J, {.runs = 4, .seed = 3});
    const PrecisionEstimate other = estimate_precision(tape, J, {.runs = 4, .seed = 4});
    const double u = std::is_same_v<S, double> ? 0x1p-53 : 0x1p-24;
    BOOST_TEST(first.precision == (std::is_same_v<S, double> ? "float64" : "float32"));
    BOOST_TEST(first.unit_roundoff == u);
    BOOST_TEST(first.runs == 4u);
    BOOST_TEST_REQUIRE(first.leaves.size() == 3u);
    const std::vector<std::pair<std::uint32_t, std::string>> leaves{{0, "X"}, {1, "W"}, {6, "leaf 6"}};
    bool differs = false;
    for (std::size_t l = 0; l < 3; ++l) {
        const LeafEstimate& e = first.leaves[l];
        BOOST_TEST(e.node == leaves[l].first);
        BOOST_TEST(e.name == leaves[l].second);
        const double in_u = e.normwise / u;
        BOOST_TEST(e.digits_lost == (in_u <= 1 ? 0.0 : std::min(std::log10(in_u), std::log10(1 / u))), e.name);
        BOOST_TEST(again.leaves[l].normwise == e.normwise, e.name);
        differs |= other.leaves[l].normwise != e.normwise;
    }
    BOOST_TEST(differs);
    BOOST_TEST(first.leaves[0].normwise > 0.0);
    BOOST_TEST(first.leaves[2].normwise == 0.0);  // Z's gradient: exactly zero in every run
    BOOST_TEST(first.leaves[2].digits_lost == 0.0);
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_estimate_lists_every_leaf_in_order_with_clipped_digits) {
    expect_estimate_structure<float>();
    expect_estimate_structure<double>();
}

// round_to (src/check/audit.cpp): "±inf past the largest": the sign kept when a value overflows the
// format, and below it, rounding symmetric in sign.
BOOST_AUTO_TEST_CASE(storage_rounding_keeps_the_sign) {
    BOOST_TEST(round_to(Storage::bfloat16, -3.5e38) == -std::numeric_limits<double>::infinity());
    BOOST_TEST(round_to(Storage::float16, -65520.0) == -std::numeric_limits<double>::infinity());
    BOOST_TEST(round_to(Storage::float16, -65519.0) == -65504.0);
    BOOST_TEST(round_to(Storage::bfloat16, -(1 + 3 * 0x1p-8)) == -(1 + 0x1p-6));
}
