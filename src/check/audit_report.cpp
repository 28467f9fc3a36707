// The precision audit's presentation (check/audit.hpp), compiled once in the library: the ranked
// table, the JSON document (through nlohmann/json, which writes a non-finite number as null) and the
// DOT picture (through io/graphviz.hpp's one writer, each node filled by its error), and the
// estimate's table. What they present is computed in src/check/audit.cpp.
#include "check/audit.hpp"

#include "autodiff/error.hpp"
#include "io/graphviz.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tapegrad {

namespace {

using Json = nlohmann::json;

// A number for the table: "inf" where not finite.
std::string number(double x, std::string_view format = "{:.2g}") {
    return std::isfinite(x) ? fmt::format(fmt::runtime(format), x) : std::string("inf");
}

std::string digits(const AuditError& e) { return e.measured ? fmt::format("{:.1f}", e.digits_lost) : std::string("-"); }

std::string in_u(const AuditError& e) { return e.measured ? number(e.in_u, "{:.2g}") : std::string("-"); }

// One figure of an error, "-" where nothing was measured (as the JSON's null: not a measured 0).
std::string figure(const AuditError& e, double x, std::string_view format = "{:.2g}") {
    return e.measured ? number(x, format) : std::string("-");
}

Json json_of(const AuditError& e) {
    if (!e.measured) return nullptr;
    return {{"normwise", e.normwise}, {"worst_element", e.worst_element}, {"worst_at", e.worst_at},
            {"ulps", e.ulps},         {"in_u", e.in_u},                   {"digits_lost", e.digits_lost},
            {"finite", e.finite}};
}

Json json_of(const NodeAudit& n, std::size_t rank) {
    return {{"rank", rank},
            {"node", n.node},
            {"op", n.op},
            {"label", n.label},
            {"shape", n.shape},
            {"local_digits", n.local_digits},
            {"local_in_u", n.local_in_u},
            {"local_forward", json_of(n.local_forward)},
            {"local_vjp", json_of(n.local_vjp)},
            {"value", json_of(n.value)},
            {"adjoint", json_of(n.adjoint)}};
}

Json json_of(const LeafAudit& leaf) {
    Json branches = Json::array();
    for (const BranchAudit& b : leaf.branches)
        branches.push_back({{"consumer", b.consumer}, {"slot", b.slot}, {"op", b.op}, {"error", json_of(b.error)}});
    return {{"node", leaf.node},
            {"name", leaf.name},
            {"gradient", json_of(leaf.gradient)},
            {"top_contributor", leaf.top_contributor},
            {"top_contributor_op", leaf.top_contributor_op},
            {"top_contributor_share", leaf.top_contributor_share},
            {"predicted", leaf.predicted ? Json(*leaf.predicted) : Json()},
            {"branches", std::move(branches)}};
}

// "node 5 (mul), 100% alone" for a leaf's table line; for none, why: no gradient reaches the leaf,
// no node loses anything locally (no candidate), or no contributor run was asked for.
std::string top_contributor(const LeafAudit& leaf, bool any_node_loses) {
    if (leaf.top_contributor_op.empty()) {
        if (!leaf.gradient.measured) return "none (no gradient reaches it)";
        return any_node_loses ? "none (no contributor runs)" : "none (no node loses a digit)";
    }
    if (!std::isfinite(leaf.top_contributor_share)) {
        return fmt::format("node {} ({}), alone it makes the gradient inf or NaN", leaf.top_contributor,
                           leaf.top_contributor_op);
    }
    return fmt::format("node {} ({}), {:.0f}% alone", leaf.top_contributor, leaf.top_contributor_op,
                       100 * leaf.top_contributor_share);
}

}  // namespace

const NodeAudit& PrecisionAudit::worst() const {
    if (nodes.empty()) throw usage_error("PrecisionAudit::worst: the audit holds no node");
    return nodes.front();
}

std::string PrecisionAudit::table(std::size_t rows) const {
    std::string text = fmt::format("precision audit, {} (u = {:.3g}), {} nodes, {:.2f} s\n", precision, unit_roundoff,
                                   nodes.size(), seconds);
    text +=
        "ranked by the node's own error (local: the node alone on exact inputs and gradient); errors in units of u\n";
    text += fmt::format("{:>5} {:>6}  {:<14} {:<14} {:<14} {:>7} {:>9} {:>9} {:>9} {:>9}\n", "rank", "node", "op",
                        "label", "shape", "digits", "local f", "local b", "value", "adjoint");
    for (std::size_t r = 0; r < std::min(rows, nodes.size()); ++r) {
        const NodeAudit& n = nodes[r];
        text += fmt::format("{:>5} {:>6}  {:<14} {:<14} {:<14} {:>7.1f} {:>9} {:>9} {:>9} {:>9}{}\n", r + 1, n.node,
                            n.op, n.label, n.shape, n.local_digits, in_u(n.local_forward), in_u(n.local_vjp),
                            in_u(n.value), in_u(n.adjoint),
                            n.value.finite && n.local_forward.finite && n.local_vjp.finite ? "" : "  (inf/NaN)");
    }
    if (!events.empty()) {
        text += fmt::format("what the low precision made that an op refused, or that became inf or NaN ({}):\n",
                            events.size());
        for (const AuditEvent& e : events) text += fmt::format("  node {} ({}), in {}: {}\n", e.node, e.op, e.run, e.what);
    }
    text += "leaf gradients: normwise error (predicted: estimate_precision's spread), worst element (relative), "
            "ULPs, digits lost; the node contributing most\n";
    const bool any_node_loses =
        std::any_of(nodes.begin(), nodes.end(), [](const NodeAudit& n) { return n.local_in_u > 0; });
    for (const LeafAudit& leaf : leaves) {
        const AuditError& g = leaf.gradient;
        text += fmt::format("  {:<18} {:>9} {:<21} {:>9} at {:<12} {:>9} ULP {:>5} digits   top: {}\n", leaf.name,
                            figure(g, g.normwise),
                            leaf.predicted ? fmt::format("(predicted {})", number(*leaf.predicted)) : std::string(),
                            figure(g, g.worst_element), g.worst_at, figure(g, g.ulps, "{:.3g}"), digits(g),
                            top_contributor(leaf, any_node_loses));
        for (const BranchAudit& b : leaf.branches) {
            text += fmt::format("      branch via node {} ({}, input {}): normwise {}, {} digits\n", b.consumer, b.op,
                                b.slot, number(b.error.normwise), digits(b.error));
        }
    }
    return text;
}

std::string PrecisionAudit::json() const {
    Json document = {{"precision", precision}, {"unit_roundoff", unit_roundoff}, {"seconds", seconds}};
    Json& ranked = document["nodes"] = Json::array();
    for (std::size_t r = 0; r < nodes.size(); ++r) ranked.push_back(json_of(nodes[r], r + 1));
    Json& met = document["events"] = Json::array();
    for (const AuditEvent& e : events) met.push_back({{"node", e.node}, {"op", e.op}, {"run", e.run}, {"what", e.what}});
    Json& gradients = document["leaves"] = Json::array();
    for (const LeafAudit& leaf : leaves) gradients.push_back(json_of(leaf));
    return document.dump(1) + "\n";
}

std::string PrecisionAudit::dot() const {
    std::map<std::uint32_t, const NodeAudit*> by_index;
    for (const NodeAudit& n : nodes) by_index[n.node] = &n;
    const double most = std::log10(1 / unit_roundoff);
    std::vector<DotNode> picture;
    for (const auto& [i, n] : by_index) {
        // White to red as the share of the digits lost grows: green and blue fall together.
        const int shade = static_cast<int>(std::lround(255 * (1 - std::clamp(n->local_digits / most, 0.0, 1.0))));
        std::string label = n->op;
        if (!n->label.empty()) label += " " + n->label;
        label += fmt::format("\n{}\n{:.1f} digits", n->shape, n->local_digits);
        picture.push_back({i, std::move(label),
                           fmt::format("shape={}, fillcolor=\"#ff{:02x}{:02x}\"",
                                       n->op == "leaf" || n->op == "constant" ? "box" : "ellipse", shade, shade),
                           inputs[i]});
    }
    return dot_graph("precision audit", picture, "fontname=\"Helvetica\", style=filled",
                     {fmt::format("label=\"{}: local digits lost, white none, red all\"", dot_escape(precision))});
}

std::string PrecisionEstimate::table() const {
    std::string text =
        fmt::format("precision estimate, {} (u = {:.3g}), random rounding at each node, {} runs, {:.2f} s\n", precision,
                    unit_roundoff, runs, seconds);
    for (const LeafEstimate& leaf : leaves) {
        text += fmt::format("  {:<18} normwise spread {:>9}  {:.1f} digits lost\n", leaf.name, number(leaf.normwise),
                            leaf.digits_lost);
    }
    return text;
}

}  // namespace tapegrad
