// The registry of ops (autodiff/registry.hpp, autodiff/rerun.hpp), compiled once in the library:
// by op struct, its siblings (the re-run at other scalar types) and, for ops registered whole, its
// saved form (io/tape_file.hpp). Every struct of LibraryOps (ops/all.hpp) is in it from the start,
// so a tape of library ops re-runs, saves and loads with nothing registered by the program. Also
// load_ops: a user's ops from a shared library (dlopen, then its entry point).
#include "autodiff/registry.hpp"
#include "ops/all.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <typeindex>

namespace tapegrad {

namespace detail {

namespace {

class Registry {
public:
    Registry() { add_library_ops(LibraryOps{}); }

    void add(const std::type_info& op, const OpSiblings& siblings) {
        const std::lock_guard lock(mutex_);
        siblings_.insert_or_assign(std::type_index(op), siblings);
    }
    const OpSiblings* find(const std::type_info& op) {
        const std::lock_guard lock(mutex_);
        const auto found = siblings_.find(std::type_index(op));
        return found == siblings_.end() ? nullptr : &found->second;  // map nodes stay where they are
    }

    /// A user's op (register_op; the library's are in from the start, add_library_ops).
    void add(SavedOp op) {
        const std::lock_guard lock(mutex_);
        for (const auto& [type, other] : saved_) {
            if (other.file_name == op.file_name && type != std::type_index(*op.op)) {
                throw usage_error(fmt::format("register_op: the op name '{}' is already registered by another struct "
                                              "({}; this one is {})", op.file_name, other.op->name(), op.op->name()));
            }
        }
        user_registrations_.push_back(op.file_name);
        saved_.insert_or_assign(std::type_index(*op.op), std::move(op));
    }
    const SavedOp* find_saved(const std::type_info& op) {
        const std::lock_guard lock(mutex_);
        const auto found = saved_.find(std::type_index(op));
        return found == saved_.end() ? nullptr : &found->second;
    }
    const SavedOp* find_saved(std::string_view file_name) {
        const std::lock_guard lock(mutex_);
        const auto found = std::find_if(saved_.begin(), saved_.end(),
                                        [&](const auto& entry) { return entry.second.file_name == file_name; });
        return found == saved_.end() ? nullptr : &found->second;
    }
    /// How many registrations of a user's op there have been (a struct registered twice counts twice).
    std::size_t user_registration_count() {
        const std::lock_guard lock(mutex_);
        return user_registrations_.size();
    }
    /// The file names of the user's ops registered since the count was `first`, in order.
    std::vector<std::string> user_registrations_since(std::size_t first) {
        const std::lock_guard lock(mutex_);
        return {user_registrations_.begin() + std::ptrdiff_t(first), user_registrations_.end()};
    }

private:
    template <class... Ops>
    void add_library_ops(OpList<Ops...>) {
        static_assert((RegistrableOp<Ops> && ...),
                      "every op of LibraryOps (ops/all.hpp) declares arity, record and (when its settings hold data) "
                      "fields: autodiff/op.hpp");
        (siblings_.emplace(std::type_index(typeid(Ops)), siblings_of<Ops>()), ...);
        (saved_.emplace(std::type_index(typeid(Ops)), saved_op_of<Ops>(OpOrigin::library)), ...);
    }

    std::mutex mutex_;
    std::map<std::type_index, OpSiblings> siblings_;
    std::map<std::type_index, SavedOp> saved_;
    std::vector<std::string> user_registrations_;
};

Registry& registry() {
    static Registry instance;
    return instance;
}

}  // namespace

void add_siblings(const std::type_info& op, const OpSiblings& siblings) { registry().add(op, siblings); }
const OpSiblings* find_siblings(const std::type_info& op) { return registry().find(op); }

void add_saved_op(SavedOp op) { registry().add(std::move(op)); }
const SavedOp* find_saved_op(const std::type_info& op) { return registry().find_saved(op); }
const SavedOp* find_saved_op(std::string_view file_name) { return registry().find_saved(file_name); }

}  // namespace detail

std::vector<std::string> load_ops(const std::string& shared_library) {
    // RTLD_NOW: an unresolved symbol is reported here, not at the op's first use.
    void* handle = ::dlopen(shared_library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
        const char* why = ::dlerror();
        throw io_error(fmt::format("load_ops: cannot load '{}': {}", shared_library, why ? why : "unknown error"));
    }
    using EntryPoint = void (*)();
    const auto entry = reinterpret_cast<EntryPoint>(::dlsym(handle, "tapegrad_register_ops"));
    if (entry == nullptr) {
        throw usage_error(fmt::format("load_ops: '{}' has no entry point: define extern \"C\" void "
                                      "tapegrad_register_ops() that calls tapegrad::register_op<...>() for each op",
                                      shared_library));
    }
    const std::size_t before = detail::registry().user_registration_count();
    entry();
    std::vector<std::string> added = detail::registry().user_registrations_since(before);
    if (added.empty()) {
        throw usage_error(fmt::format("load_ops: '{}' registered no op: its tapegrad_register_ops must call "
                                      "tapegrad::register_op<...>(), and the program and the library must share one "
                                      "libtapegrad.so (link both with tapegrad::tapegrad_shared; a program linked "
                                      "with the static tapegrad keeps a registry of its own)", shared_library));
    }
    return added;  // the handle stays open: the ops' code lives in it
}

}  // namespace tapegrad
