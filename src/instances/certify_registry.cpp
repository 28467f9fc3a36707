// The registry of interval siblings (autodiff/interval_rerun.hpp), compiled once in
// tapegrad::certify: by op struct, its re-run at Interval and Dual<Interval>, for certified gradients
// of a recorded tape (check/certify.hpp). Every struct of LibraryOps (ops/all.hpp) is in it from the
// start, so a tape of library ops is certified with nothing registered by the program.
#include "autodiff/interval_rerun.hpp"
#include "ops/all.hpp"

#include <map>
#include <mutex>
#include <typeindex>

namespace tapegrad {

namespace detail {

namespace {

class CertifyRegistry {
public:
    CertifyRegistry() { add_library_ops(LibraryOps{}); }

    void add(const std::type_info& op, const CertifySiblings& siblings) {
        const std::lock_guard lock(mutex_);
        siblings_.insert_or_assign(std::type_index(op), siblings);
    }
    const CertifySiblings* find(const std::type_info& op) {
        const std::lock_guard lock(mutex_);
        const auto found = siblings_.find(std::type_index(op));
        return found == siblings_.end() ? nullptr : &found->second;  // map nodes stay where they are
    }

private:
    template <class... Ops>
    void add_library_ops(OpList<Ops...>) {
        (siblings_.emplace(std::type_index(typeid(Ops)), siblings_of<Ops, CertifySiblings>()), ...);
    }

    std::mutex mutex_;
    std::map<std::type_index, CertifySiblings> siblings_;
};

CertifyRegistry& registry() {
    static CertifyRegistry instance;
    return instance;
}

}  // namespace

void add_certify_siblings(const std::type_info& op, const CertifySiblings& siblings) { registry().add(op, siblings); }

const CertifySiblings* find_certify_siblings(const std::type_info& op) { return registry().find(op); }

}  // namespace detail

}  // namespace tapegrad
