// libFuzzer target for the .npy reader: any byte string must either parse or raise io_error;
// anything else (a crash, a sanitizer report, another exception, a huge allocation) is a bug.
// A file that parses must also survive a write/read round trip unchanged, bit for bit.
// Build and run: fuzz/run.sh [seconds]   (needs clang with libFuzzer; see fuzz/CMakeLists.txt)
#include "io/npy.hpp"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    try {
        const tapegrad::Tensor<double> tensor = tapegrad::parse_npy(bytes);
        const tapegrad::Tensor<double> again = tapegrad::parse_npy(tapegrad::npy_bytes(tensor));
        if (!(again.shape() == tensor.shape())) std::abort();
        for (std::size_t k = 0; k < tensor.size(); ++k) {
            if (std::bit_cast<std::uint64_t>(again[k]) != std::bit_cast<std::uint64_t>(tensor[k])) std::abort();
        }
    } catch (const tapegrad::io_error&) {
        // The expected outcome for malformed input.
    }
    return 0;
}
