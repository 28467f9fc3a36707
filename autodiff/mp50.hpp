/// \file
/// mp50, the checker's 50-digit reference type, and what comes with it: Boost.Multiprecision's
/// cpp_bin_float, the library's compiled op instances and tapes for mp50 and Dual<mp50> declared
/// extern (so a program computing at 50 digits calls the library's copies), and the compiled
/// printing of mp50 tensors. Only the headers that compute at 50 digits include it (the generic-lambda checker,
/// the re-run of a recorded tape, tapegrad.hpp); tapegrad_record.hpp leaves it out, as Boost.
/// Multiprecision is most of a translation unit's compile time. Include it (or tapegrad.hpp)
/// before the op headers in a translation unit that computes at 50 digits, so their mp50 entry
/// points are the library's (autodiff/instances.hpp); after them, they are compiled again there.
#pragma once

#include "autodiff/scalar.hpp"
#include "autodiff/tape.hpp"
#include "autodiff/tensor.hpp"

#include <boost/multiprecision/cpp_bin_float.hpp>

#include <string>

namespace tapegrad {

/// 50 significant decimal digits (about 168 bits). cpp_bin_float is header-only, stores its digits
/// inline (no heap allocation per element), and has expression templates off, so
/// `auto x = a * b;` holds a number, not an expression.
using mp50 = boost::multiprecision::cpp_bin_float_50;

/// An mp50 tensor as nested rows (io/format.hpp's tensor_text), compiled once in the library.
std::string tensor_text(const Tensor<mp50>& tensor, int precision = 0);

// The tape's out-of-class members for mp50 and Dual<mp50>, compiled in the library (autodiff/tape.hpp).
#ifndef TAPEGRAD_INSTANTIATE_FOR
extern template class Tape<mp50>;
extern template class Tape<Dual<mp50>>;
#endif

}  // namespace tapegrad

// The 50-digit scalar types whose op instances the library compiles (autodiff/instances.hpp).
#ifndef TAPEGRAD_INSTANTIATE_FOR
#undef TAPEGRAD_FOR_MP50_SCALARS
#define TAPEGRAD_FOR_MP50_SCALARS(instances) \
    instances(::tapegrad::mp50) instances(::tapegrad::Dual<::tapegrad::mp50>)
#endif
