// libFuzzer target for the saved-tape loader (io/tape_file.hpp): any byte string must either load
// or raise io_error (for a document of the other scalar type, usage_error never: the tape is
// fresh); anything else (a crash, a sanitizer report, another exception) is a bug. A document
// that loads must save to a text that loads again to the same text (the format is a fixed point).
// Build and run: fuzz/run.sh [seconds]   (needs clang with libFuzzer; see fuzz/CMakeLists.txt)
#include "io/tape_file.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace {

template <class T>
void load_and_resave(std::string_view text) {
    tapegrad::Tape<T> tape;
    const tapegrad::Var<T> out = tapegrad::parse_tape(text, "fuzz input", tape);
    const std::string saved = tapegrad::tape_file_text(tape, out);
    tapegrad::Tape<T> again;
    const tapegrad::Var<T> out_again = tapegrad::parse_tape(saved, "fuzz input saved again", again);
    if (tapegrad::tape_file_text(again, out_again) != saved) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        if (tapegrad::parse_tape_scalar(text, "fuzz input") == tapegrad::TapeFileScalar::float32) {
            load_and_resave<float>(text);
        } else {
            load_and_resave<double>(text);
        }
    } catch (const tapegrad::io_error&) {
        // The expected outcome for malformed input.
    }
    return 0;
}
