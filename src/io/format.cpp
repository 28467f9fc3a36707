// Tensor formatting (io/format.hpp) compiled once for float, double and mp50: a program printing
// a tensor of one of these types calls these instead of compiling fmt's formatting code again.
#include "autodiff/mp50.hpp"
#include "io/format.hpp"

namespace tapegrad {

std::string tensor_text(const Tensor<float>& tensor, int precision) { return detail::tensor_text_of(tensor, precision); }
std::string tensor_text(const Tensor<double>& tensor, int precision) { return detail::tensor_text_of(tensor, precision); }
std::string tensor_text(const Tensor<mp50>& tensor, int precision) { return detail::tensor_text_of(tensor, precision); }

}  // namespace tapegrad
