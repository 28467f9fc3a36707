// Compiles every op's entry points for double, once, into the library (autodiff/instances.hpp): the
// op headers declare these instances extern everywhere else.
#define TAPEGRAD_INSTANTIATE_FOR double
#include "ops/instances/all_ops.hpp"
