/// \file
/// Re-running a recorded tape in intervals, for certified gradients of a recorded tape
/// (check/certify.hpp's certify_gradients(tape, J)): each op's interval siblings, its entries at
/// Interval and Dual<Interval> for tapes recorded at float or double (autodiff/rerun.hpp's Sibling),
/// in a registry of their own. The library registry (autodiff/rerun.hpp) stays free of interval
/// code, so that a program that never certifies compiles and links none; this one is compiled in
/// tapegrad::certify (src/instances/certify_registry.cpp), holding every op of LibraryOps from the
/// start. A user's op certified on a recorded tape registers its interval siblings with one line
/// beside its register_op:
///
///     inline const bool my_op_certifiable = tapegrad::register_certify_siblings<MyOp>();
///
/// Include this header only where you certify, and link tapegrad::certify.
#pragma once

#include "autodiff/dual.hpp"
#include "autodiff/interval.hpp"
#include "autodiff/rerun.hpp"

#include <tuple>
#include <typeinfo>

namespace tapegrad {

/// The interval siblings of an op recorded at S.
template <Scalar S>
using CertifySiblingsFrom = std::tuple<Sibling<S, Interval>, Sibling<S, Dual<Interval>>>;

/// An op's interval siblings: one per (recorded type, interval type), for tapes recorded at float or
/// double.
struct CertifySiblings {
    decltype(std::tuple_cat(CertifySiblingsFrom<float>{}, CertifySiblingsFrom<double>{})) entries;

    template <Scalar S, Scalar U>
    const Sibling<S, U>& get() const {
        return std::get<Sibling<S, U>>(entries);
    }
};

namespace detail {

/// The registry of interval siblings, by op struct (compiled in tapegrad::certify:
/// src/instances/certify_registry.cpp, which holds the library's ops from the start).
void add_certify_siblings(const std::type_info& op, const CertifySiblings& siblings);
const CertifySiblings* find_certify_siblings(const std::type_info& op);

}  // namespace detail

/// Registers Op's interval siblings (again: replaces them). Returns true, so that a namespace-scope
/// `inline const bool` can do it.
template <class Op>
bool register_certify_siblings() {
    detail::add_certify_siblings(typeid(Op), siblings_of<Op, CertifySiblings>());
    return true;
}

/// The interval siblings as a re-run's source (autodiff/rerun.hpp's rerun).
template <Scalar S, Scalar U>
SiblingSource<S, U> certify_siblings() {
    return {[](const std::type_info& op) -> const Sibling<S, U>* {
                const CertifySiblings* siblings = detail::find_certify_siblings(op);
                return siblings == nullptr ? nullptr : &siblings->template get<S, U>();
            },
            std::is_same_v<U, Interval> ? "Interval" : "Dual<Interval>",
            "tapegrad::register_certify_siblings<its struct>() (autodiff/interval_rerun.hpp)"};
}

}  // namespace tapegrad
