// Compiles every op's entry points for Dual<double>, once, into the library (autodiff/instances.hpp): the
// op headers declare these instances extern everywhere else.
#define TAPEGRAD_INSTANTIATE_FOR ::tapegrad::Dual<double>
#include "ops/instances/all_ops.hpp"
