// Compiles every op's entry points and the tape's out-of-class members (autodiff/tape.hpp) for double, once, into the library (autodiff/instances.hpp): the
// op headers declare these instances extern everywhere else.
#define TAPEGRAD_INSTANTIATE_FOR double
#include "ops/all.hpp"
#include "models/attention.hpp"  // attention's compositions, compiled here as the ops are

template class tapegrad::Tape<TAPEGRAD_INSTANTIATE_FOR>;
