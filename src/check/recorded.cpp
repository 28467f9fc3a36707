// The check of a recorded tape (check/recorded.hpp), compiled once in the library: the tape re-run
// at double and at 50 digits (autodiff/rerun.hpp) becomes the two graph functions the checker's
// stages take (detail::GraphOnTapes), and its leaves that need a gradient become the checked leaves;
// a Tape<float>'s own gradients, where backward(J) left them, are compared with the 50-digit ones.
#include "check/recorded.hpp"
#include "check/second_order.hpp"

#include "autodiff/rerun.hpp"
#include "check/audit.hpp"
#include "check/gradcheck.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace tapegrad {

namespace {

// The recorded graph re-run on a tape of type U, as the checks' graph function.
template <Scalar U, Scalar S>
detail::GraphOn<U> rerun_on(const Tape<S>& tape, const Var<S>& output) {
    return [&tape, output](std::span<const Var<U>> in) { return rerun(tape, output, in); };
}

// The input tensors of a node of `tape`, as its op reads them.
template <Scalar T>
std::vector<const Tensor<T>*> inputs_of(const Tape<T>& tape, std::span<const std::uint32_t> inputs) {
    std::vector<const Tensor<T>*> values;
    for (const std::uint32_t k : inputs) values.push_back(&tape.recorded(k).value);
    return values;
}

// The recorded tape re-run once at 50 digits, for the branch report and the float gradients' check:
// its leaves (the recorded gradient leaves, in order), each recorded node's counterpart, its output.
struct PreciseRerun {
    Tape<mp50> tape;
    std::vector<Var<mp50>> leaves, nodes;
    Var<mp50> output;

    template <Scalar S>
    PreciseRerun(const Tape<S>& recorded, const Var<S>& J) {
        for (const std::uint32_t i : gradient_leaves(recorded, J))
            leaves.push_back(tape.leaf(detail::tensor_as<mp50>(recorded.recorded(i).value)));
        output = rerun(recorded, J, std::span<const Var<mp50>>(leaves), &nodes);
    }
};

// The nodes whose re-run at 50 digits takes another data-dependent branch than the recording
// (the ops' branch hooks, autodiff/op.hpp), each with its first such element: its first input
// there where the input is shaped like the output (relu, abs, clamp), else its output (max).
template <Scalar S>
std::vector<BranchChange> branch_changes(const Tape<S>& tape, const Var<S>& output, const PreciseRerun& precise) {
    std::vector<BranchChange> changes;
    for (std::uint32_t i = 0; i <= output.index(); ++i) {
        const auto node = tape.recorded(i);
        if (node.kind == nullptr || node.kind->branch == nullptr) continue;
        const auto again = precise.tape.recorded(precise.nodes[i].index());
        const std::vector<const Tensor<S>*> in = inputs_of(tape, node.inputs);
        const std::vector<const Tensor<mp50>*> in_precise = inputs_of(precise.tape, again.inputs);
        const bool elementwise = in[0]->shape() == node.value.shape();
        BranchChange change{i, std::string(node.kind->name), std::string(node.label), 0, node.value.size(), "", 0, 0};
        for (std::size_t k = 0; k < node.value.size(); ++k) {
            if (node.kind->branch(node.settings, in, k) == again.kind->branch(again.settings, in_precise, k)) continue;
            if (change.elements++ > 0) continue;
            change.first = index_string(node.value.shape(), k);
            change.recorded = to_double(elementwise ? (*in[0])[k] : node.value[k]);
            change.precise = to_double(elementwise ? (*in_precise[0])[k] : again.value[k]);
        }
        if (change.elements > 0) changes.push_back(std::move(change));
    }
    return changes;
}

// A Tape<float>'s own gradients, where backward(J) left them, against the 50-digit gradient of the
// recorded function (the precise re-run back-propagated), each within 100 times its random-rounding
// spread (check/report.hpp's FloatGradientCheck says why). The finite-difference stages check the
// op's VJP at double and 50 digits; a fault in an op's float path only shows here.
std::vector<FloatGradientCheck> float_gradient_checks(const Tape<float>& tape, const Var<float>& J,
                                                      const std::vector<NamedTensor>& names, PreciseRerun& precise,
                                                      std::uint64_t seed) {
    if (!tape.holds_gradients_of(J)) return {};
    precise.tape.backward(precise.output);
    const std::vector<std::uint32_t> indices = gradient_leaves(tape, J);
    const PrecisionEstimate spread = estimate_precision(tape, J, EstimateOptions{.runs = 8, .seed = seed});
    std::vector<FloatGradientCheck> checks;
    for (std::size_t l = 0; l < indices.size(); ++l) {
        const Tensor<float>* computed = tape.recorded(indices[l]).grad;
        const Tensor<mp50>& truth = precise.leaves[l].grad();
        mp50 difference2 = 0, truth2 = 0;
        for (std::size_t k = 0; k < truth.size(); ++k) {
            const mp50 d = (computed ? mp50((*computed)[k]) : mp50(0)) - truth[k];
            difference2 += d * d;
            truth2 += truth[k] * truth[k];
        }
        const double error = to_double(sqrt(truth2 > 0 ? difference2 / truth2 : difference2));
        const double threshold = 100 * std::max(spread.leaves[l].normwise, spread.unit_roundoff);
        // error <= threshold is false for a NaN error too
        checks.push_back({names[l].name, error, spread.leaves[l].normwise, threshold, error <= threshold});
    }
    return checks;
}

template <Scalar S>
CheckReport check_on_tapes(const Tape<S>& tape, const Var<S>& J, const CheckOptions& options, detail::WorkSplit* split) {
    const std::vector<NamedTensor> leaves = detail::recorded_leaves(tape, J, "check_gradients");
    const detail::GraphOnTapes graph{rerun_on<double>(tape, J), rerun_on<mp50>(tape, J)};
    CheckReport report = detail::run_check(graph, leaves, options, nullptr, split);
    PreciseRerun precise(tape, J);
    report.branch_changes = branch_changes(tape, J, precise);
    if constexpr (std::is_same_v<S, float>) {
        report.float_gradients = float_gradient_checks(tape, J, leaves, precise, options.seed);
        for (const FloatGradientCheck& f : report.float_gradients) report.passed = report.passed && f.passed;
    }
    return report;
}

template <Scalar S>
detail::SecondOrderGraphs second_order_reruns(const Tape<S>& tape, const Var<S>& output) {
    return {rerun_on<mp50>(tape, output), rerun_on<Dual<mp50>>(tape, output), rerun_on<Dual<double>>(tape, output)};
}

}  // namespace

CheckReport detail::check_recorded(const Tape<double>& tape, const Var<double>& J, const CheckOptions& options,
                                   WorkSplit* split) {
    return check_on_tapes(tape, J, options, split);
}

CheckReport detail::check_recorded(const Tape<float>& tape, const Var<float>& J, const CheckOptions& options,
                                   WorkSplit* split) {
    return check_on_tapes(tape, J, options, split);
}

CheckReport check_gradients(const Tape<double>& tape, const Var<double>& J, const CheckOptions& options) {
    return check_on_tapes(tape, J, options, nullptr);
}

CheckReport check_gradients(const Tape<float>& tape, const Var<float>& J, const CheckOptions& options) {
    return check_on_tapes(tape, J, options, nullptr);
}

SecondOrderReport check_jvp(const Tape<double>& tape, const Var<double>& Y, const CheckOptions& options) {
    return detail::run_jvp_check(second_order_reruns(tape, Y), detail::recorded_leaves(tape, Y, "check_jvp"), options);
}

SecondOrderReport check_jvp(const Tape<float>& tape, const Var<float>& Y, const CheckOptions& options) {
    return detail::run_jvp_check(second_order_reruns(tape, Y), detail::recorded_leaves(tape, Y, "check_jvp"), options);
}

SecondOrderReport check_hvp(const Tape<double>& tape, const Var<double>& J, const CheckOptions& options) {
    return detail::run_hvp_check(second_order_reruns(tape, J), detail::recorded_leaves(tape, J, "check_hvp"), options);
}

SecondOrderReport check_hvp(const Tape<float>& tape, const Var<float>& J, const CheckOptions& options) {
    return detail::run_hvp_check(second_order_reruns(tape, J), detail::recorded_leaves(tape, J, "check_hvp"), options);
}

}  // namespace tapegrad
