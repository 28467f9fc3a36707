/// \file
/// Which ops a program compiles and which it takes from the library. Every op's entry point
/// (matmul, softmax, ...) is compiled once, in the library, for float, double, mp50 and the duals
/// over double and mp50 (forward mode, autodiff/dual.hpp): `src/instances/<type>.cpp`. Each op header
/// declares those instances `extern template` through the two macros below, so a program that
/// calls an op on one of these types neither turns its forward and VJP into code nor optimises
/// them again: it calls the library's copy. Any other scalar type and every user-written op are
/// compiled from the headers as before.
/// The extern declarations for mp50 and Dual<mp50> are those of the op headers included after
/// autodiff/mp50.hpp; an op header included before it, in a translation unit that then calls the op
/// at 50 digits, compiles that op there (correct, only slower).
/// (Macros, not templates: an explicit instantiation names a signature, and only the preprocessor
/// can write one signature for a list of types.)
#pragma once

#include "autodiff/scalar.hpp"

#ifdef TAPEGRAD_INSTANTIATE_FOR  // defined only by src/instances/<type>.cpp, inside the library
#define TAPEGRAD_INSTANCE template
#define TAPEGRAD_FOR_LIBRARY_SCALARS(instances) instances(TAPEGRAD_INSTANTIATE_FOR)
#else
// float, double and Dual<double> always; mp50 and Dual<mp50> once autodiff/mp50.hpp is included
// (it defines TAPEGRAD_FOR_MP50_SCALARS), so the light headers need no Boost.Multiprecision.
#define TAPEGRAD_INSTANCE extern template
#define TAPEGRAD_FOR_LIBRARY_SCALARS(instances) \
    instances(float) instances(double) instances(::tapegrad::Dual<double>) TAPEGRAD_FOR_MP50_SCALARS(instances)
#ifndef TAPEGRAD_FOR_MP50_SCALARS
#define TAPEGRAD_FOR_MP50_SCALARS(instances)
#endif
#endif
