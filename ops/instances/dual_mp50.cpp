// Compiles every op's entry points for Dual<mp50>, once, into the library (autodiff/instances.hpp): the
// op headers declare these instances extern everywhere else.
#define TAPEGRAD_INSTANTIATE_FOR ::tapegrad::Dual<::tapegrad::mp50>
#include "ops/instances/all_ops.hpp"
