// The one way tapegrad spreads work over cores: `parallel_for(count, work)` and the one threads
// setting it reads. The kernels (large products), the fused attention op and the gradient checker
// all go through it, so `set_threads(1)` makes every part of the library single-threaded.
//
// Work items are handed out dynamically (an atomic counter), so uneven items balance themselves.
// The first exception thrown by any item stops the hand-out and is rethrown on the calling thread.
// A parallel_for started from inside another one's item runs its items on the calling thread:
// the outer loop already occupies the cores, and nesting would only oversubscribe them.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace tapegrad {

namespace detail {
inline std::atomic<unsigned>& threads_setting() {
    static std::atomic<unsigned> threads{0};
    return threads;
}
inline bool& inside_parallel_for() {
    thread_local bool inside = false;
    return inside;
}
}  // namespace detail

// Threads tapegrad may use; 0 (the default) means one per hardware thread. Results do not depend
// on it (see each user's comment for why), only the time does.
inline void set_threads(unsigned threads) { detail::threads_setting() = threads; }

// The threads a parallel_for started now would use (at least 1).
inline unsigned thread_count() {
    const unsigned setting = detail::threads_setting().load();
    return setting != 0 ? setting : std::max(1u, std::thread::hardware_concurrency());
}

// Runs work(item, thread) for every item in [0, count), on at most `max_threads` threads (0: the
// setting above); `thread` in [0, threads) tells an item which per-thread scratch space is its own.
template <class Work>
void parallel_for(std::size_t count, const Work& work, unsigned max_threads = 0) {
    unsigned threads = max_threads != 0 ? max_threads : thread_count();
    threads = static_cast<unsigned>(std::min<std::size_t>(threads, count));
    if (threads <= 1 || detail::inside_parallel_for()) {
        for (std::size_t item = 0; item < count; ++item) work(item, 0u);
        return;
    }
    std::atomic<std::size_t> next{0};
    std::exception_ptr failure;
    std::mutex failure_mutex;
    const auto run = [&](unsigned thread) {
        detail::inside_parallel_for() = true;
        try {
            for (std::size_t item; (item = next++) < count;) work(item, thread);
        } catch (...) {
            const std::lock_guard lock(failure_mutex);
            if (!failure) failure = std::current_exception();
            next = count;
        }
        detail::inside_parallel_for() = false;
    };
    {
        std::vector<std::jthread> pool;
        for (unsigned t = 1; t < threads; ++t) pool.emplace_back(run, t);
        run(0);
    }
    if (failure) std::rethrow_exception(failure);
}

}  // namespace tapegrad
