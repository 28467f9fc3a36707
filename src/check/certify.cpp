// Certified gradients of a recorded tape (check/certify.hpp), compiled once in tapegrad::certify:
// the tape re-run in intervals through the interval siblings (autodiff/interval_rerun.hpp) is the
// graph that detail::certify takes, and its leaves that need a gradient are the certified leaves.
#include "check/certify.hpp"

#include <span>
#include <vector>

namespace tapegrad {

namespace {

template <Scalar S>
CertificationReport certify_recorded(const Tape<S>& tape, const Var<S>& J, const CertifyOptions& options) {
    const std::vector<NamedTensor> leaves = detail::recorded_leaves(tape, J, "certify_gradients");
    return detail::certify(
        [&tape, &J]<Scalar U>(std::span<const Var<U>> vars) {
            return rerun<S, U>(tape, J, vars, nullptr, certify_siblings<S, U>());
        },
        std::span<const NamedTensor>(leaves), options);
}

}  // namespace

CertificationReport certify_gradients(const Tape<double>& tape, const Var<double>& J, const CertifyOptions& options) {
    return certify_recorded(tape, J, options);
}

CertificationReport certify_gradients(const Tape<float>& tape, const Var<float>& J, const CertifyOptions& options) {
    return certify_recorded(tape, J, options);
}

}  // namespace tapegrad
