// README prelude (tests/readme/compile_blocks.py): the graph, leaves and options the MPI block names.
#include "tapegrad.hpp"
namespace {
const auto graph = [](auto in) { return tapegrad::sum(tapegrad::mul(in[0], in[0])); };
const tapegrad::NamedTensor leaves[] = {{"X", tapegrad::Tensor<double>(tapegrad::Shape{2, 2}, 0.5)}};
const tapegrad::CheckOptions options;
}  // namespace
