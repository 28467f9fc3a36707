/// \file
/// Tape<T>: the reverse-mode engine. Each op appends one node (inputs, output, VJP) in creation
/// order, so `backward` is a single reverse sweep with no topological sort (as in Stan and Adept).
/// The tape knows nothing about any particular op: an op is a struct that follows the contract in
/// autodiff/op.hpp, and the tape calls it through that contract's table of function pointers.
#pragma once

#include "autodiff/cpu.hpp"
#include "autodiff/error.hpp"
#include "autodiff/low_precision.hpp"
#include "autodiff/op.hpp"
#include "autodiff/parallel.hpp"
#include "autodiff/tensor.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace tapegrad {

template <Scalar T>
class Tape;

inline constexpr std::size_t max_arity = 4;

/// A handle to one value on a tape. Cheap to copy; only valid while its tape is alive and
/// not cleared (using it afterwards raises usage_error instead of reading stale memory).
template <Scalar T>
class Var {
public:
    using scalar_type = T;
    Var() = default;

    const Tensor<T>& value() const { return owner("value").value_of(*this); }
    const Tensor<T>& grad() const { return owner("grad").grad_of(*this); }
    const Shape& shape() const { return value().shape(); }
    Tape<T>& tape() const { return owner("tape"); }
    std::uint32_t index() const { return index_; }
    bool valid() const { return tape_ != nullptr; }

    /// Gives this value a name for reports and graph pictures ("Q", "scores"); returns itself.
    Var named(std::string_view label) const {
        owner("named").set_label(*this, label);
        return *this;
    }

private:
    friend class Tape<T>;
    Var(Tape<T>* tape, std::uint32_t index, std::uint64_t generation)
        : tape_(tape), index_(index), generation_(generation) {}
    Tape<T>& owner(std::string_view what) const {
        if (tape_ == nullptr) [[unlikely]] throw_no_tape(what);
        return *tape_;
    }
    [[noreturn]] static void throw_no_tape(std::string_view what) {
        throw usage_error(fmt::format("Var::{}: this Var does not belong to any tape", what));
    }

    Tape<T>* tape_ = nullptr;
    std::uint32_t index_ = 0;
    std::uint64_t generation_ = 0;
};

/// One gradient contribution that flowed along one edge (kept only when branch logging is on):
/// `consumer`'s VJP for its input `slot`, added into node `target`.
template <Scalar T>
struct Branch {
    std::uint32_t consumer;
    std::uint32_t slot;
    std::uint32_t target;
    Tensor<T> contribution;
};

/// What a graph picture or a cost report needs to know about one node.
struct NodeInfo {
    std::string_view op;  ///< "leaf" for inputs and parameters
    std::string_view label;
    Shape shape;
    std::span<const std::uint32_t> inputs;
    bool requires_grad;
    OpCost cost;
    std::size_t bytes;  ///< value, saved tensors and gradient held by the node
    std::string settings;  ///< the op's settings as text (`c=0.125`), empty for a leaf or an op without settings
};

/// Which node is computing, for a scalar type that wants to know: when `NodeContext<T>` is defined
/// with static `enter(node, in_vjp)` and `leave()`, the tape calls them around each op's forward and
/// each node's VJPs (an interval's ambiguous comparison is then named by its node, and one made
/// outside every op, an argument check, told apart: autodiff/interval.hpp). For every other type the
/// primary template stays undefined and the tape compiles no call.
template <class T>
struct NodeContext;

template <class T>
inline void enter_node(std::uint32_t node, bool in_vjp) {
    if constexpr (requires { NodeContext<T>::enter(node, in_vjp); }) NodeContext<T>::enter(node, in_vjp);
}
template <class T>
inline void leave_node() {
    if constexpr (requires { NodeContext<T>::leave(); }) NodeContext<T>::leave();
}

/// Scratch space for Tape::replay; one per thread.
template <Scalar T>
struct ReplayWorkspace {
    std::vector<Tensor<T>> values;
    std::vector<Tensor<T>> saved;
    std::vector<char> dirty;
};

template <Scalar T>
class Tape {
public:
    using scalar_type = T;

    /// A new tape takes the nodes and scratch buffers that the last tape to die on this thread
    /// left, if it left any: a fresh tape per training step, the common way to write one, then
    /// allocates no more than a cleared one. Otherwise it starts with room for a small graph.
    Tape();
    /// Leaves its buffers to the next tape made on this thread when they hold at most
    /// `pooled_bytes_limit` (a large graph's memory goes back to the allocator with its tape).
    ~Tape();
    /// Vars point at their tape, so a tape stays where it was made.
    Tape(const Tape&) = delete;
    Tape& operator=(const Tape&) = delete;

    /// An input or parameter. Gradients are computed for it when `requires_grad`. A tensor passed
    /// by reference is copied into the node's reused buffer (no allocation once the tape has held
    /// a graph of this size); a temporary is moved in.
    Var<T> leaf(const Tensor<T>& value, std::string_view label = {}, bool requires_grad = true);
    Var<T> leaf(Tensor<T>&& value, std::string_view label = {}, bool requires_grad = true);
    /// A value that never needs a gradient (masks, the probe G, targets).
    Var<T> constant(const Tensor<T>& value, std::string_view label = {}) { return leaf(value, label, false); }
    Var<T> constant(Tensor<T>&& value, std::string_view label = {}) { return leaf(std::move(value), label, false); }

    /// Appends a node for `Op` applied to `inputs`. The op's public function has checked shapes.
    /// `settings` are the op's own typed settings (autodiff/op.hpp), kept with the node for replays.
    template <class Op>
        requires TapeOp<Op, T>
    Var<T> record(std::initializer_list<Var<T>> inputs, SettingsOf<Op, T> settings = {}) {
        return record<Op>(std::span<const Var<T>>(inputs.begin(), inputs.size()), std::move(settings));
    }
    template <class Op>
        requires TapeOp<Op, T>
    Var<T> record(std::span<const Var<T>> inputs, SettingsOf<Op, T> settings = {}) {
        if (inputs.size() > max_arity) {
            throw usage_error(fmt::format("{}: {} inputs exceed the tape's maximum of {}", Op::name, inputs.size(),
                                          max_arity));
        }
        if constexpr (requires { Op::arity; }) {
            if (!Op::arity.admits(inputs.size())) {
                throw usage_error(fmt::format("{}: {} input{} given, it takes {}", Op::name, inputs.size(),
                                              inputs.size() == 1 ? "" : "s", Op::arity.text()));
            }
        }
        std::array<std::uint32_t, max_arity> ids{};
        bool requires_grad = false;
        std::size_t slot = 0;
        for (const Var<T>& input : inputs) {
            check_var(input, Op::name);
            ids[slot++] = input.index_;
            requires_grad = requires_grad || nodes_[input.index_].requires_grad;
        }
        Node& node = append();
        node.kind = &op_kind_of<Op, T>;
        node.inputs = ids;
        node.arity = static_cast<std::uint32_t>(inputs.size());
        node.requires_grad = requires_grad;
        node.settings.store(std::move(settings));
        node.label.clear();
        node.has_grad = false;
        const std::uint32_t index = static_cast<std::uint32_t>(used_ - 1);
        std::array<const Tensor<T>*, max_arity> values{};
        gather_inputs(nodes_[index], values);
        enter_node<T>(index, false);
        nodes_[index].kind->forward(nodes_[index].settings, std::span(values.data(), nodes_[index].arity),
                                    nodes_[index].value, nodes_[index].saved);
        leave_node<T>();
        check_no_nan(nodes_[index].value, Op::name, "its output");
        return handle(index);
    }

    /// Reverse sweep from a one-element output, seeded with 1.
    void backward(const Var<T>& output);

    /// Reverse sweep from `output`, seeded with the upstream gradient G (same shape as output).
    void backward(const Var<T>& output, const Tensor<T>& upstream);

    /// Forgets gradients, keeps values: backward may run again.
    void zero_grad() {
        for (std::size_t i = 0; i < used_; ++i) nodes_[i].has_grad = false;
        branches_.clear();
        backward_done_ = false;
        seeded_with_one_.reset();
    }

    /// Forgets every node; the nodes' buffers are kept and reused by the next graph. Vars made
    /// before are invalid afterwards.
    void clear() {
        used_ = 0;
        generation_ = next_generation();
        branches_.clear();
        backward_done_ = false;
        seeded_with_one_.reset();
    }

    /// What the matrix products recorded from now on read (autodiff/low_precision.hpp): under
    /// ProductPrecision::bfloat16 a float tape records matmul as matmul_bf16 (bfloat16 inputs,
    /// float32 accumulation: ops/matmul_bf16.hpp), the mixed precision of PyTorch's CPU autocast;
    /// everything else stays float32. Kept across clear(). Only a Tape<float> takes bfloat16 (a
    /// double or 50-digit tape is the precise side of the checks): another tape throws usage_error.
    void set_product_precision(ProductPrecision precision) {
        if (precision == ProductPrecision::bfloat16 && !std::is_same_v<T, float>) {
            throw usage_error("set_product_precision: bfloat16 products are a float32 tape's policy; this tape is "
                              "not a Tape<float>");
        }
        products_ = precision;
    }
    ProductPrecision product_precision() const { return products_; }

    std::size_t size() const { return used_; }
    /// Whether backward has run since the tape was made, cleared or zero_grad'ed (the gradients
    /// are then readable, and another backward refused until zero_grad).
    bool has_gradients() const { return backward_done_; }
    /// Whether the gradients on the tape are J's: backward(J) ran, seeded with one, and no
    /// zero_grad or clear since (a backward(Y, G) leaves the gradients of G·Y, not of J). The
    /// recorded-tape check of a Tape<float> compares them with the truth (check/recorded.hpp).
    bool holds_gradients_of(const Var<T>& J) const {
        return holds(J) && backward_done_ && seeded_with_one_ == J.index_;
    }

    /// Keep every VJP contribution separately (per edge) during backward, to attribute a summed
    /// gradient to its branches. Off by default: it copies every contribution.
    void log_branches(bool on) { log_branches_ = on; }
    const std::vector<Branch<T>>& branches() const { return branches_; }

    NodeInfo info(std::size_t index) const;

    /// An edge of the graph: input `slot` of node `consumer`.
    struct Edge {
        std::uint32_t consumer;
        std::uint32_t slot;
    };
    /// A leaf's value replaced for a replay: seen by all of the leaf's consumers, or only by one
    /// edge when `edge` is set (to take one branch of a summed gradient on its own).
    struct Replacement {
        Var<T> leaf;
        const Tensor<T>* value;
        std::optional<Edge> edge{};
    };

    /// The value of `output` with some leaves replaced. Only nodes downstream of a replaced leaf
    /// are recomputed; the tape itself is not modified, so several threads may replay one tape
    /// at once, each with its own workspace. This is how the checker's finite differences avoid
    /// re-running the whole graph for every perturbed coordinate.
    const Tensor<T>& replay(const Var<T>& output, std::span<const Replacement> replacements,
                            ReplayWorkspace<T>& work) const;

    /// One recorded node as code outside the tape reads it to re-run or save the tape
    /// (autodiff/rerun.hpp): its op (nullptr for a leaf) and the op's settings, its inputs, value
    /// and label, and whether it needs a gradient (false for a constant).
    struct RecordedNode {
        const OpKind<T>* kind;
        const SettingsSlot& settings;
        std::span<const std::uint32_t> inputs;
        const Tensor<T>& value;
        std::string_view label;
        bool requires_grad;
        const Tensor<T>* grad;  ///< the gradient backward left; nullptr before backward or where none flowed
    };
    RecordedNode recorded(std::size_t index) const {
        if (index >= used_) {
            throw usage_error(fmt::format("Tape::recorded: node {} does not exist (the tape holds {})", index, used_));
        }
        const Node& node = nodes_[index];
        return RecordedNode{node.kind, node.settings, std::span(node.inputs.data(), node.arity), node.value,
                            node.label, node.requires_grad, node.has_grad ? &node.grad : nullptr};
    }
    /// Whether `var` is a live value of this tape (not another tape's, nor one from before a clear()).
    bool holds(const Var<T>& var) const {
        return var.tape_ == this && var.generation_ == generation_ && var.index_ < used_;
    }

    /// Nodes that use `leaf` as an input, with the slot: the branches of its gradient.
    std::vector<Edge> consumers(const Var<T>& leaf) const;

private:
    friend class Var<T>;


    struct Node {
        const OpKind<T>* kind = nullptr;  ///< nullptr for a leaf
        std::array<std::uint32_t, max_arity> inputs{};
        std::uint32_t arity = 0;
        bool requires_grad = false;
        bool has_grad = false;
        Tensor<T> value;
        Tensor<T> saved;
        Tensor<T> grad;
        SettingsSlot settings;  ///< the op's own Settings (stale for a leaf, which has none)
        std::string label;
    };

    Node& append() {
        if (used_ == nodes_.size()) nodes_.emplace_back();
        Node& node = nodes_[used_++];
        node.has_grad = false;
        if (!node.saved.empty()) node.saved.resize(Shape{0});  // a reused node forgets what its last op saved
        return node;
    }

    [[noreturn]] static void throw_backward_done();

    /// The reverse sweep from node `output`, whose gradient (the seed) has been written.
    void sweep(std::size_t output);

    /// Node i's VJPs, one call for all its inputs, then one accumulate per input. An input's first
    /// contribution is written straight into its own gradient buffer (kept across clear(), so a
    /// reused tape allocates nothing); a later one, or a second slot fed by the same input, goes to
    /// that slot's scratch tensor and is added.
    void pass_gradient(std::uint32_t i);

    /// A scratch tensor for input `slot` of the node being differentiated, already of `shape`'s
    /// element count when one of that count exists: growing a buffer zero-fills it, so each buffer
    /// serves contributions of one size only (the same few sizes recur at every step). At most
    /// `scratch_sizes_kept` sizes are kept per slot; past that the first buffer is resized, so a
    /// tape fed ever-new shapes (sequences of every length) does not keep a buffer for each.
    Tensor<T>& scratch_for(std::uint32_t slot, const Shape& shape);

    static void zero_gradient_if_missing(Node& node) {
        if (node.requires_grad && !node.has_grad) {
            node.grad.resize(node.value.shape());
            node.grad.fill(T(0));
            node.has_grad = true;
        }
    }

    Node& append_leaf(std::string_view label, bool requires_grad) {
        Node& node = append();
        node.kind = nullptr;
        node.arity = 0;
        node.requires_grad = requires_grad;
        node.label.assign(label);
        return node;
    }

    Var<T> handle(std::size_t index) { return Var<T>(this, static_cast<std::uint32_t>(index), generation_); }

    void gather_inputs(const Node& node, std::array<const Tensor<T>*, max_arity>& values) const {
        for (std::uint32_t slot = 0; slot < node.arity; ++slot) values[slot] = &nodes_[node.inputs[slot]].value;
    }

    /// Called for every Var an op or accessor touches: the test is kept small enough to inline,
    /// the message is built out of line.
    void check_var(const Var<T>& var, std::string_view where) const {
        if (!holds(var)) [[unlikely]] throw_foreign_var(var, where);
    }
    [[noreturn]] void throw_foreign_var(const Var<T>& var, std::string_view where) const;

    const Tensor<T>& value_of(const Var<T>& var) const {
        check_var(var, "value");
        return nodes_[var.index_].value;
    }
    const Tensor<T>& grad_of(const Var<T>& var) const;
    void set_label(const Var<T>& var, std::string_view label);

    /// The one place gradients meet: contributions add, so a value used by several ops (X feeding
    /// Q, K and V) receives the sum of its branches.
    void accumulate(std::uint32_t target, std::uint32_t consumer, std::uint32_t slot, const Tensor<T>& contribution);
    /// Its message, out of line, so that accumulate stays small enough to inline.
    [[noreturn]] static void throw_vjp_shape(std::string_view op, std::uint32_t slot, const Shape& given,
                                             const Shape& input);

    /// `slot` >= 0 appends the input number to `what`; the message is only built when it is thrown.
    /// What a NaN message calls a leaf created without a label.
    static constexpr std::string_view unnamed_leaf = "an unnamed leaf";
    /// Tensors up to this size are scanned for NaN inline, larger ones by the compiled kernel.
    static constexpr std::size_t inline_scan_size = 16;

    /// A small float or double tensor (a scalar node) is scanned at the call, in the header: the
    /// call to the out-of-line scan cost more than its few compares (of the 609 instructions per node
    /// of a chain of scalar nodes, 62 were its two scans; callgrind, docs/performance.md). Anything
    /// else, or a NaN found, goes to scan_for_nan, which scans again and names the element.
    static void check_no_nan(const Tensor<T>& tensor, std::string_view op, std::string_view what, int slot = -1) {
        if constexpr (std::is_floating_point_v<T>) {
            const std::span<const T> data = tensor.data();
            if (data.size() <= inline_scan_size) {
                bool nan = false;
                for (const T x : data) nan = nan || x != x;
                if (!nan) return;
            }
        }
        scan_for_nan(tensor, op, what, slot);
    }
    static void scan_for_nan(const Tensor<T>& tensor, std::string_view op, std::string_view what, int slot);

    static constexpr std::size_t initial_nodes = 32;
    static constexpr std::size_t scratch_sizes_kept = 8;
    static constexpr std::size_t pooled_bytes_limit = std::size_t{16} << 20;

    /// Contributions that cannot go straight into a gradient: per slot, one buffer per element count.
    using Scratch = std::array<std::vector<Tensor<T>>, max_arity>;
    struct Buffers {
        std::vector<Node> nodes;
        Scratch scratch;
    };

    /// The buffers a dead tape left for the next one on its thread. `closed` is set when the
    /// thread's pool is destroyed (at thread exit, before static objects): a tape destroyed after
    /// that keeps its buffers to itself.
    class NodePool {
    public:
        static Buffers& buffers() {
            thread_local NodePool pool;
            return pool.buffers_;
        }
        static bool& closed() {
            thread_local bool is_closed = false;  // trivially destructible: readable until the thread ends
            return is_closed;
        }
        ~NodePool() { closed() = true; }

    private:
        Buffers buffers_;
    };

    /// Generations are unique over all tapes, so a Var of a dead tape never passes for one of a
    /// new tape made at the same address.
    static std::uint64_t next_generation() {
        static std::atomic<std::uint64_t> counter{0};
        return ++counter;
    }

    std::size_t held_bytes() const;

    std::vector<Node> nodes_;
    std::size_t used_ = 0;
    std::uint64_t generation_ = 0;
    bool backward_done_ = false;
    std::optional<std::uint32_t> seeded_with_one_;  ///< the output of the last backward(output), if seeded with one
    bool log_branches_ = false;
    ProductPrecision products_ = ProductPrecision::tape;
    std::vector<Branch<T>> branches_;
    Scratch scratch_;
};

// The tape's larger members, defined out of the class so that the library compiles them once for
// float, double and Dual<double> (src/instances/<type>.cpp, declared extern below; mp50 and
// Dual<mp50> in autodiff/mp50.hpp): a program recording on those tapes does not compile them again.

template <Scalar T>
Tape<T>::Tape() : generation_(next_generation()) {
    Buffers& pool = NodePool::buffers();
    if (!pool.nodes.empty()) {
        nodes_ = std::move(pool.nodes);
        scratch_ = std::move(pool.scratch);
        pool = Buffers{};
    } else {
        nodes_.reserve(initial_nodes);
    }
}

template <Scalar T>
Tape<T>::~Tape() {
    if (NodePool::closed() || held_bytes() > pooled_bytes_limit) return;
    Buffers& pool = NodePool::buffers();
    if (pool.nodes.empty()) pool = Buffers{std::move(nodes_), std::move(scratch_)};
}

template <Scalar T>
Var<T> Tape<T>::leaf(const Tensor<T>& value, std::string_view label, bool requires_grad) {
    check_no_nan(value, "leaf", label.empty() ? unnamed_leaf : label);
    Node& node = append_leaf(label, requires_grad);
    node.value = value;  // vector copy-assignment keeps the node's capacity
    return handle(used_ - 1);
}

template <Scalar T>
Var<T> Tape<T>::leaf(Tensor<T>&& value, std::string_view label, bool requires_grad) {
    check_no_nan(value, "leaf", label.empty() ? unnamed_leaf : label);
    Node& node = append_leaf(label, requires_grad);
    node.value = std::move(value);
    return handle(used_ - 1);
}

template <Scalar T>
void Tape<T>::backward(const Var<T>& output) {
    check_var(output, "backward");
    const Tensor<T>& value = nodes_[output.index_].value;
    if (value.size() != 1) {
        throw usage_error(fmt::format(
            "backward: output of shape {} is not a scalar; pass its upstream gradient G explicitly",
            value.shape().to_string()));
    }
    if (backward_done_) throw_backward_done();
    // Seeded in place: the node's gradient buffer is reused, no tensor is allocated.
    Node& seed = nodes_[output.index_];
    seed.grad.resize(value.shape());
    seed.grad.fill(T(1));
    sweep(output.index_);
    seeded_with_one_ = output.index_;
}

template <Scalar T>
void Tape<T>::backward(const Var<T>& output, const Tensor<T>& upstream) {
    check_var(output, "backward");
    Node& seed = nodes_[output.index_];
    if (!(upstream.shape() == seed.value.shape())) {
        throw shape_error(fmt::format("backward: upstream gradient of shape {} for an output of shape {}",
                                      upstream.shape().to_string(), seed.value.shape().to_string()));
    }
    if (backward_done_) throw_backward_done();
    check_no_nan(upstream, "backward", "the upstream gradient");
    seed.grad = upstream;  // copy-assignment reuses the node's buffer
    sweep(output.index_);
    seeded_with_one_.reset();
}

template <Scalar T>
NodeInfo Tape<T>::info(std::size_t index) const {
    if (index >= used_) {
        throw usage_error(fmt::format("Tape::info: node {} does not exist (the tape holds {})", index, used_));
    }
    const Node& node = nodes_[index];
    OpCost cost{};
    if (node.kind != nullptr) {
        std::array<const Tensor<T>*, max_arity> values{};
        gather_inputs(node, values);
        cost = node.kind->cost(node.settings, std::span(values.data(), node.arity));
    }
    const std::size_t bytes = (node.value.size() + node.saved.size() + (node.has_grad ? node.grad.size() : 0)) *
                              sizeof(T);
    return NodeInfo{node.kind ? node.kind->name : std::string_view("leaf"),
                    node.label,
                    node.value.shape(),
                    std::span(node.inputs.data(), node.arity),
                    node.requires_grad,
                    cost,
                    bytes,
                    node.kind ? node.kind->describe(node.settings) : std::string()};
}

template <Scalar T>
std::vector<typename Tape<T>::Edge> Tape<T>::consumers(const Var<T>& leaf) const {
    check_var(leaf, "consumers");
    std::vector<Edge> edges;
    for (std::size_t i = leaf.index_ + 1; i < used_; ++i) {
        for (std::uint32_t slot = 0; slot < nodes_[i].arity; ++slot) {
            if (nodes_[i].inputs[slot] == leaf.index_) edges.push_back({static_cast<std::uint32_t>(i), slot});
        }
    }
    return edges;
}

template <Scalar T>
void Tape<T>::sweep(std::size_t output) {
    branches_.clear();
    nodes_[output].has_grad = true;
    // A value the output does not depend on has gradient zero: nodes after the output, and
    // (found during the sweep, when all their consumers have been visited) nodes before it.
    for (std::size_t i = output + 1; i < used_; ++i) zero_gradient_if_missing(nodes_[i]);
    for (std::size_t i = output + 1; i-- > 0;) {
        Node& node = nodes_[i];
        if (!node.has_grad) {  // J does not depend on it: zero, and nothing to pass on
            zero_gradient_if_missing(node);
            continue;
        }
        if (node.kind != nullptr && node.requires_grad) pass_gradient(static_cast<std::uint32_t>(i));
    }
    backward_done_ = true;
}

template <Scalar T>
void Tape<T>::pass_gradient(std::uint32_t i) {
    const Node& node = nodes_[i];
    std::array<Tensor<T>*, max_arity> grads{};
    bool any = false;
    for (std::uint32_t slot = 0; slot < node.arity; ++slot) {
        Node& input = nodes_[node.inputs[slot]];
        if (!input.requires_grad) continue;  // nobody needs this VJP
        bool first = !input.has_grad;
        for (std::uint32_t earlier = 0; earlier < slot; ++earlier) {
            first = first && node.inputs[earlier] != node.inputs[slot];
        }
        Tensor<T>& din = first ? input.grad : scratch_for(slot, input.value.shape());
        din.resize(input.value.shape());
        grads[slot] = &din;
        any = true;
    }
    if (!any) return;
    std::array<const Tensor<T>*, max_arity> values{};
    gather_inputs(node, values);
    const VjpArgs<T> at{Inputs<T>(values.data(), node.arity), node.value, node.saved, node.grad};
    enter_node<T>(i, true);
    node.kind->vjp_all(node.settings, at, std::span<Tensor<T>* const>(grads.data(), node.arity));
    leave_node<T>();
    for (std::uint32_t slot = 0; slot < node.arity; ++slot) {
        if (grads[slot] != nullptr) accumulate(node.inputs[slot], i, slot, *grads[slot]);
    }
}

template <Scalar T>
Tensor<T>& Tape<T>::scratch_for(std::uint32_t slot, const Shape& shape) {
    std::vector<Tensor<T>>& pool = scratch_[slot];
    for (Tensor<T>& buffer : pool) {
        if (buffer.size() == shape.size()) return buffer;
    }
    if (pool.size() < scratch_sizes_kept) return pool.emplace_back(shape);
    return pool.front();
}

template <Scalar T>
void Tape<T>::throw_foreign_var(const Var<T>& var, std::string_view where) const {
    if (var.tape_ != this) {
        throw usage_error(fmt::format("{}: the value belongs to {} tape", where,
                                      var.tape_ == nullptr ? "no" : "another"));
    }
    throw usage_error(fmt::format("{}: the value belongs to a tape that has been cleared since", where));
}

template <Scalar T>
const Tensor<T>& Tape<T>::grad_of(const Var<T>& var) const {
    check_var(var, "grad");
    const Node& node = nodes_[var.index_];
    if (!node.requires_grad) {
        throw usage_error(fmt::format("grad: '{}' ({} {}) does not require a gradient",
                                      node.label.empty() ? "value" : node.label,
                                      node.kind ? node.kind->name : "leaf", node.value.shape().to_string()));
    }
    if (!node.has_grad) throw usage_error("grad: no gradient yet; call backward first");
    return node.grad;
}

template <Scalar T>
void Tape<T>::accumulate(std::uint32_t target, std::uint32_t consumer, std::uint32_t slot, const Tensor<T>& contribution) {
    Node& node = nodes_[target];
    const std::string_view op = nodes_[consumer].kind->name;
    if (!(contribution.shape() == node.value.shape())) [[unlikely]] {
        throw_vjp_shape(op, slot, contribution.shape(), node.value.shape());
    }
    check_no_nan(contribution, op, "the gradient of its input", static_cast<int>(slot));
    if (log_branches_) branches_.push_back(Branch<T>{consumer, slot, target, contribution});
    if (!node.has_grad) {  // the contribution was written into node.grad itself
        node.has_grad = true;
        return;
    }
    const std::span<T> sum = node.grad.data();
    const std::span<const T> part = contribution.data();
    for (std::size_t k = 0; k < sum.size(); ++k) sum[k] += part[k];
}

template <Scalar T>
void Tape<T>::throw_vjp_shape(std::string_view op, std::uint32_t slot, const Shape& given, const Shape& input) {
    throw error(fmt::format("{}: VJP for input {} has shape {}, the input has shape {}", op, slot, given.to_string(),
                            input.to_string()));
}

template <Scalar T>
void Tape<T>::scan_for_nan(const Tensor<T>& tensor, std::string_view op, std::string_view what, int slot) {
    const std::span<const T> data = tensor.data();
    using Stored = typename StoredAs<T>::type;
    if constexpr (has_compiled_kernels<Stored>) {
        // The compiled scan (vectorised at the CPU's level), over the numbers the elements are
        // stored as (a dual: its value and tangent, either NaN making it NaN); the index is
        // looked for only once a NaN is known. A small tensor is scanned by the loop below: the
        // call through the dispatch table would cost more than its few compares (a scalar node:
        // 52 against 48 ns per node). The element loop on duals was 12% of a T = 64 HVP.
        // A large tensor is scanned in chunks over the library's threads (the scan is memory-bound,
        // one pass over the tensor per recorded op: 8% of a T = 1024 float attention step).
        const Stored* numbers = reinterpret_cast<const Stored*>(data.data());
        if (data.size() > inline_scan_size) {
            std::atomic<bool> found{false};
            parallel_chunks(data.size() * StoredAs<T>::count, elementwise_grain, [&](std::size_t first, std::size_t last) {
                if (engine_kernels<Stored>().any_nan(numbers + first, last - first)) found.store(true, std::memory_order_relaxed);
            });
            if (!found.load(std::memory_order_relaxed)) return;
        }
    }
    for (std::size_t k = 0; k < data.size(); ++k) {
        if (is_nan(data[k])) {
            throw value_error(fmt::format("{}: NaN in {}{} at index {} (shape {})", op, what,
                                          slot >= 0 ? fmt::format(" {}", slot) : std::string(),
                                          index_string(tensor.shape(), k), tensor.shape().to_string()));
        }
    }
}

template <Scalar T>
std::size_t Tape<T>::held_bytes() const {
    std::size_t elements = 0;
    for (const Node& node : nodes_) elements += node.value.size() + node.saved.size() + node.grad.size();
    for (const std::vector<Tensor<T>>& slot : scratch_)
        for (const Tensor<T>& buffer : slot) elements += buffer.size();
    return elements * sizeof(T);
}

template <Scalar T>
void Tape<T>::throw_backward_done() {
    throw usage_error(
        "backward: this tape already holds gradients from an earlier backward; call zero_grad() first "
        "(gradients would otherwise add up)");
}

template <Scalar T>
const Tensor<T>& Tape<T>::replay(const Var<T>& output, std::span<const Replacement> replacements,
                                  ReplayWorkspace<T>& work) const {
    check_var(output, "replay");
    std::size_t first = output.index_;
    for (const Replacement& r : replacements) {
        check_var(r.leaf, "replay");
        const Shape& expected = nodes_[r.leaf.index_].value.shape();
        if (!(r.value->shape() == expected)) {
            throw shape_error(fmt::format("replay: replacement of shape {} for a leaf of shape {}",
                                          r.value->shape().to_string(), expected.to_string()));
        }
        if (r.leaf.index_ == output.index_) return *r.value;
        first = std::min<std::size_t>(first, r.leaf.index_);
    }
    if (work.values.size() < used_) {
        work.values.resize(used_);
        work.saved.resize(used_);
    }
    work.dirty.assign(used_, 0);
    for (std::size_t i = first + 1; i <= output.index_; ++i) {
        const Node& node = nodes_[i];
        if (node.kind == nullptr) continue;
        std::array<const Tensor<T>*, max_arity> values{};
        std::array<const Tensor<T>*, max_arity> recorded{};
        bool touched = false;
        for (std::uint32_t slot = 0; slot < node.arity; ++slot) {
            const std::uint32_t source = node.inputs[slot];
            recorded[slot] = &nodes_[source].value;
            values[slot] = work.dirty[source] ? &work.values[source] : &nodes_[source].value;
            touched = touched || work.dirty[source];
            for (const Replacement& r : replacements) {
                if (source == r.leaf.index_ && (!r.edge || (r.edge->consumer == i && r.edge->slot == slot))) {
                    values[slot] = r.value;
                    touched = true;
                }
            }
        }
        if (!touched) continue;
        work.dirty[i] = 1;
        // A perturbed coordinate usually changes few entries: let the op update its recorded
        // output instead of recomputing it (the checker's 50-digit replays are most of its time).
        if (node.kind->update != nullptr &&
            node.kind->update(node.settings, std::span(recorded.data(), node.arity),
                              std::span(values.data(), node.arity), node.value, work.values[i])) {
            continue;
        }
        node.kind->forward(node.settings, std::span(values.data(), node.arity), work.values[i], work.saved[i]);
    }
    return work.dirty[output.index_] ? work.values[output.index_] : nodes_[output.index_].value;
}

/// (Out of line also so that GCC 12 does not inline std::string::assign here, where it warns
/// -Wrestrict on libstdc++'s own code: GCC bug 105329.)
template <Scalar T>
void Tape<T>::set_label(const Var<T>& var, std::string_view label) {
    check_var(var, "named");
    nodes_[var.index_].label.assign(label);
}

#ifndef TAPEGRAD_INSTANTIATE_FOR
extern template class Tape<float>;
extern template class Tape<double>;
extern template class Tape<Dual<double>>;
#endif

}  // namespace tapegrad
