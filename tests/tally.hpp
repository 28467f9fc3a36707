// Tally: comparisons made and the first few failures, for the kernel tests that compare every
// element at every level and remainder (test_kernel_remainders, test_bf16_kernels): a fault
// control counts the failures of a deliberately broken kernel without failing the test itself.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <string>
#include <vector>

namespace tapegrad::testing {

struct Tally {
    std::size_t comparisons = 0, failures = 0;
    std::vector<std::string> first;
    void expect(bool ok, const std::string& what) {
        ++comparisons;
        if (ok) return;
        ++failures;
        if (first.size() < 5) first.push_back(what);
    }
    std::string summary() const {
        std::string text = fmt::format("{} of {} comparisons failed", failures, comparisons);
        for (const std::string& f : first) text += "\n  " + f;
        return text;
    }
};

}  // namespace tapegrad::testing
