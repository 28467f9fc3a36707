// Timing helpers shared by the benchmark programs: the calling thread's CPU clock, the median of
// a set of samples, and contenders timed side by side in alternating batches.
#pragma once

#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace tapegrad::timing {

// The host's CPU model as /proc/cpuinfo names it ("unknown" elsewhere): every published figure
// names the machine it was measured on, since machines of one kind are not the same CPU.
inline std::string cpu_model() {
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line)) {
        if (line.rfind("model name", 0) == 0) {
            const std::size_t colon = line.find(':');
            if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
        }
    }
    return "unknown";
}

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

// Keeps the memory a contender frees inside the process: glibc then neither trims the top of its
// heap nor serves blocks under 32 MiB (its largest mmap threshold) with mmap, so freed memory is
// reused, not handed back to the kernel and faulted in again. Call at the start of main. Why:
// LibTorch's allocator frees its tensors after each step, and on the development VM (2026-12-02,
// "AMD EPYC", Firecracker with a virtio balloon that reports free pages to the host) this cost
// every contender, not just LibTorch: with `bench_charlm --per-round`, LibTorch's float64 rounds
// took 5,000-13,000 minor page faults each, and the float32 step that followed took 35-55 ms
// instead of 12 ms (its own faults: none), so medians sank to 0.3-0.6 of the best rounds while
// the best stayed put. With this call: no faults after the first round, every contender's median
// within 5% of its best round, and LibTorch's float64 median step 3.5 times faster (36 against
// 127 ms). A memory setting of the benchmark process, applied to both sides; the library's
// tapes reuse their buffers and take no faults either way.
inline void keep_freed_memory() {
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
}

// Wall-clock seconds, for the runs that use several threads.
inline double wall_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

using ClockFunction = double (*)();

// How many calls of `work` fill about `target_seconds`: batches that long make the clock's
// resolution and the loop around them negligible even for the 2-position graph (about 1 µs).
// One untimed call comes first, because a first call can cost far more than the others and must
// not set the batch size. Measured in bench_attention: the first fresh Tape<float> after
// LibTorch's steps took 30 ms, nearly all in glibc's malloc_consolidate (merging the small chunks
// LibTorch had freed, which glibc does on the next large request, whoever makes it). Without the
// warm-up call that one call set the batch to 1 call, and the line then timed single 1 µs calls,
// each with the clock's own overhead and caches cold from LibTorch's step: 13-22 µs.
inline std::size_t calibrate(const std::function<void()>& work, double target_seconds, ClockFunction now) {
    work();
    std::size_t iterations = 1;
    for (;;) {
        const double start = now();
        for (std::size_t i = 0; i < iterations; ++i) work();
        const double elapsed = now() - start;
        if (elapsed >= target_seconds / 4 || iterations >= (std::size_t{1} << 24)) {
            return std::max<std::size_t>(1, static_cast<std::size_t>(iterations * target_seconds / std::max(elapsed, 1e-9)));
        }
        iterations *= 4;
    }
}

// Time per call, in µs, of one contender: the best batch and the median batch.
struct Timing {
    double best_us, median_us;
};

// Each of `contenders` timed in alternating batches (round by round, so all see the same machine
// state), `rounds` batches of about `batch_seconds` each.
inline std::vector<Timing> alternate_timings(const std::vector<std::function<void()>>& contenders, std::size_t rounds,
                                             double batch_seconds, ClockFunction now = thread_seconds) {
    std::vector<std::size_t> iterations;
    for (const auto& work : contenders) iterations.push_back(calibrate(work, batch_seconds, now));
    std::vector<std::vector<double>> samples(contenders.size());
    for (std::size_t round = 0; round < rounds; ++round) {
        for (std::size_t c = 0; c < contenders.size(); ++c) {
            const double start = now();
            for (std::size_t i = 0; i < iterations[c]; ++i) contenders[c]();
            samples[c].push_back((now() - start) * 1e6 / static_cast<double>(iterations[c]));
        }
    }
    std::vector<Timing> timings;
    for (auto& s : samples) timings.push_back({*std::min_element(s.begin(), s.end()), median(std::move(s))});
    return timings;
}

// The median time per call, in µs, of each of `contenders`, measured in alternating batches.
inline std::vector<double> alternate(const std::vector<std::function<void()>>& contenders, std::size_t rounds,
                                     double batch_seconds, ClockFunction now = thread_seconds) {
    std::vector<double> medians;
    for (const Timing& t : alternate_timings(contenders, rounds, batch_seconds, now)) medians.push_back(t.median_us);
    return medians;
}

}  // namespace tapegrad::timing
