// Timing helpers shared by the benchmark programs: the calling thread's CPU clock and the median
// of a set of samples.
#pragma once

#include <time.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace tapegrad::timing {

// CPU time of the calling thread. The single-threaded timings use it rather than the wall clock:
// this machine is shared, and time spent descheduled would otherwise be charged to whichever
// contender happened to be running.
inline double thread_seconds() {
    timespec now{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

inline double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    const std::size_t n = values.size();
    return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace tapegrad::timing
