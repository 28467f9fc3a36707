// Compiles every op's entry points and the tape's out-of-class members (autodiff/tape.hpp) for mp50, once, into the library (autodiff/instances.hpp): the
// op headers declare these instances extern everywhere else.
#include "autodiff/mp50.hpp"
#define TAPEGRAD_INSTANTIATE_FOR ::tapegrad::mp50
#include "ops/all.hpp"
#include "models/attention.hpp"  // attention's compositions, compiled here as the ops are

template class tapegrad::Tape<TAPEGRAD_INSTANTIATE_FOR>;
