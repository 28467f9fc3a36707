// README prelude (tests/readme/compile_blocks.py): the data a checking block names.
#include "tapegrad_record.hpp"
using namespace tapegrad;
// ---- in main ----
const Tensor<double> x(Shape{3, 2}, 0.5), w(Shape{2, 2}, 0.25);
