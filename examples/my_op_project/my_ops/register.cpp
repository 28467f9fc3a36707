// The shared library of this project's ops for tapegrad's tools: `tapegrad-check --tape FILE --ops
// libmy_ops.so` (and tapegrad-audit's --ops) loads it and calls its entry point, which registers
// each op (autodiff/registry.hpp), so a tape that holds them loads, checks and audits. It links
// tapegrad::tapegrad_shared, the library the tools use: one registry in the process.
#include "my_ops/softplus.hpp"

#include <tapegrad.hpp>

extern "C" void tapegrad_register_ops() { tapegrad::register_op<my_ops::Softplus>(); }
