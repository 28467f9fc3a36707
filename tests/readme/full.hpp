// README prelude (tests/readme/compile_blocks.py): file-scope code that uses the whole library,
// the registration of a user's op included (autodiff/registry.hpp, through tapegrad.hpp).
#include "tapegrad.hpp"
