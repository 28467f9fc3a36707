// README prelude (tests/readme/compile_blocks.py): the loss a float32 training step recorded.
#include "tapegrad_record.hpp"
#include <fstream>
using namespace tapegrad;
// ---- in main ----
Tape<float> step;
const Var<float> loss = sum(step.leaf(Tensor<float>(Shape{2, 2}, 0.5f), "W"));
