// Which ops a program compiles and which it takes from the library. Every op's entry point
// (matmul, softmax, ...) is compiled once, in the library, for float, double, mp50 and the duals
// over double and mp50 (forward mode, autodiff/dual.hpp): ops/instances/<type>.cpp. Each op header
// declares those instances `extern template` through the two macros below, so a program that
// calls an op on one of these types neither turns its forward and VJP into code nor optimises
// them again: it calls the library's copy. Any other scalar type and every user-written op are
// compiled from the headers as before.
// (Macros, not templates: an explicit instantiation names a signature, and only the preprocessor
// can write one signature for a list of types.)
#pragma once

#include "autodiff/scalar.hpp"

#ifdef TAPEGRAD_INSTANTIATE_FOR  // defined only by ops/instances/<type>.cpp, inside the library
#define TAPEGRAD_INSTANCE template
#define TAPEGRAD_FOR_LIBRARY_SCALARS(instances) instances(TAPEGRAD_INSTANTIATE_FOR)
#else
#define TAPEGRAD_INSTANCE extern template
#define TAPEGRAD_FOR_LIBRARY_SCALARS(instances)                                                     \
    instances(float) instances(double) instances(::tapegrad::mp50) instances(::tapegrad::Dual<double>) \
        instances(::tapegrad::Dual<::tapegrad::mp50>)
#endif
