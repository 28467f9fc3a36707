// README prelude (tests/readme/compile_blocks.py): file-scope code that names the library's types.
#include "tapegrad_record.hpp"
