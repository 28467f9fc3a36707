// README prelude (tests/readme/compile_blocks.py): the leaves and directions a forward-mode block names.
#include "tapegrad.hpp"
using namespace tapegrad;
// ---- in main ----
const Tensor<double> X(Shape{2, 2}, 0.5), W(Shape{2, 2}, 0.25), dX(Shape{2, 2}, 1.0), dW(Shape{2, 2}, -1.0);
