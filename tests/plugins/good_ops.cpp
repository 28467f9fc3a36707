// A shared library of a user's op, as tapegrad's tools load one (load_ops, autodiff/registry.hpp):
// linked with tapegrad::tapegrad_shared, its entry point registers user_ops::Affine.
#include "tests/plugins/user_ops.hpp"

extern "C" void tapegrad_register_ops() { tapegrad::register_op<user_ops::Affine>(); }
