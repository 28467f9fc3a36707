// README prelude (tests/readme/compile_blocks.py): the tokens a transformer block names.
#include "tapegrad_record.hpp"
using namespace tapegrad;
// ---- in main ----
const std::vector<std::size_t> tokens(16, 1), targets(16, 2), next_tokens(2, 3);
const std::size_t B = 2;
