// README prelude (tests/readme/compile_blocks.py): a recorded tape and its output J.
#include "tapegrad_record.hpp"
using namespace tapegrad;
// ---- in main ----
Tape<double> tape;
const Var<double> X = tape.leaf(Tensor<double>(Shape{3, 2}, 0.5), "X");
const Var<double> J = sum(mul(X, X));
