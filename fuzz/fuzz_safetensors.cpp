// libFuzzer target for the safetensors reader: any byte string must either parse or raise
// io_error; anything else (a crash, a sanitizer report, another exception, a huge allocation) is a
// bug. A file that parses must survive a write (every tensor as F64, which holds each dtype's
// values exactly) and a read unchanged, name for name and bit for bit.
// Build and run: fuzz/run.sh [seconds]   (needs clang with libFuzzer; see fuzz/CMakeLists.txt)
#include "io/safetensors.hpp"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    try {
        std::vector<tapegrad::SafetensorsTensor> tensors = tapegrad::parse_safetensors(bytes);
        for (tapegrad::SafetensorsTensor& t : tensors) t.dtype = tapegrad::SafetensorsDtype::float64;
        const std::vector<tapegrad::SafetensorsTensor> again =
            tapegrad::parse_safetensors(tapegrad::safetensors_bytes(tensors));
        if (again.size() != tensors.size()) std::abort();
        for (std::size_t i = 0; i < tensors.size(); ++i) {
            if (again[i].name != tensors[i].name || !(again[i].value.shape() == tensors[i].value.shape())) std::abort();
            for (std::size_t k = 0; k < tensors[i].value.size(); ++k) {
                if (std::bit_cast<std::uint64_t>(again[i].value[k]) != std::bit_cast<std::uint64_t>(tensors[i].value[k]))
                    std::abort();
            }
        }
    } catch (const tapegrad::io_error&) {
        // The expected outcome for malformed input.
    }
    return 0;
}
