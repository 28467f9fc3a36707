// Fault control for the ThreadSanitizer build (.ci/run): a deliberately racy use of parallel_for
// (items adding into one plain int on the pool's threads). Built and registered only with
// TAPEGRAD_SANITIZE=thread, where the test passes only if TSan reports the data race, so a TSan
// step that cannot see into the pool's threads (uninstrumented library, a missing flag) fails.
#include "autodiff/parallel.hpp"

#include <chrono>
#include <cstdio>
#include <thread>

int main() {
    int total = 0;  // the fault: no atomic, no lock
    tapegrad::parallel_for(
        64,
        [&](std::size_t item, unsigned) {
            std::this_thread::sleep_for(std::chrono::microseconds(200));  // so both threads take items
            total += static_cast<int>(item);
        },
        2);
    std::printf("total %d\n", total);
}
