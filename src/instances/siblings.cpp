// The registry of ops' siblings (autodiff/rerun.hpp), compiled once in the library, and the
// library's own ops in it: every op struct of ops/, so that a tape recorded from library ops
// re-runs at double, mp50 and their duals with nothing registered by the program: every struct of
// LibraryOps (ops/all.hpp; tests/test_rerun.cpp re-runs a graph of every op).
#include "autodiff/rerun.hpp"
#include "ops/all.hpp"

#include <map>
#include <mutex>
#include <typeindex>

namespace tapegrad::detail {

namespace {

class Registry {
public:
    Registry() { add_all(LibraryOps{}); }

    void add(const std::type_info& op, const OpSiblings& siblings) {
        const std::lock_guard lock(mutex_);
        by_op_.insert_or_assign(std::type_index(op), siblings);
    }
    const OpSiblings* find(const std::type_info& op) {
        const std::lock_guard lock(mutex_);
        const auto found = by_op_.find(std::type_index(op));
        return found == by_op_.end() ? nullptr : &found->second;  // map nodes stay where they are
    }

private:
    template <class... Ops>
    void add_all(OpList<Ops...>) {
        (by_op_.emplace(std::type_index(typeid(Ops)), siblings_of<Ops>()), ...);
    }

    std::mutex mutex_;
    std::map<std::type_index, OpSiblings> by_op_;
};

Registry& registry() {
    static Registry instance;
    return instance;
}

}  // namespace

void add_siblings(const std::type_info& op, const OpSiblings& siblings) { registry().add(op, siblings); }

const OpSiblings* find_siblings(const std::type_info& op) { return registry().find(op); }

}  // namespace tapegrad::detail
