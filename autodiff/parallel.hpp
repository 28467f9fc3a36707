/// \file
/// The one way tapegrad spreads work over cores: `parallel_for(count, work)` and the one threads
/// setting it reads. The kernels (large products), the fused attention op and the gradient checker
/// all go through it, so `set_threads(1)` makes every part of the library single-threaded.
///
/// Work items are handed out dynamically (an atomic counter), so uneven items balance themselves.
/// The first exception thrown by any item stops the hand-out and is rethrown on the calling thread.
/// A parallel_for started from inside another one's item runs its items on the calling thread:
/// the outer loop already occupies the cores, and nesting would only oversubscribe them.
///
/// The threads are a pool inside the compiled library (src/autodiff/parallel.cpp): created at the first
/// call that needs them, grown when a call asks for more, and between calls watching for the next
/// one for 50 µs, then asleep: a call costs a wake-up at most rather than a thread start, and idle
/// workers take no core from other processes or tapes for longer than that. Several user threads
/// may call parallel_for at once (independent tapes): one call at a time has the pool, and a call
/// that finds it taken runs its items on its own thread.
/// This header stays light: the template only wraps `work` in a pointer and a callback (no copy,
/// no allocation) and hands it to the library.
#pragma once

#include <cstddef>
#include <memory>

namespace tapegrad {

/// Threads tapegrad may use; 0 (the default) means one per hardware thread. Results do not depend
/// on it (see each user's comment for why), only the time does.
void set_threads(unsigned threads);

/// The threads a parallel_for started now would use (at least 1).
unsigned thread_count();

namespace detail {

/// A borrowed reference to a caller's `work(item, thread)`: valid for the duration of one
/// parallel_for call, which is all the pool needs (it never keeps it past the call).
class WorkRef {
public:
    template <class Work>
    explicit WorkRef(const Work& work)
        : object_(std::addressof(work)), call_([](const void* object, std::size_t item, unsigned thread) {
              (*static_cast<const Work*>(object))(item, thread);
          }) {}
    void operator()(std::size_t item, unsigned thread) const { call_(object_, item, thread); }

private:
    const void* object_;
    void (*call_)(const void*, std::size_t, unsigned);
};

/// The threads a loop of `count` items started here would use: 1 inside another parallel_for's
/// item (nesting runs inline), else min(count, max_threads or the setting).
unsigned threads_for(std::size_t count, unsigned max_threads);

/// Runs every item on up to `threads` threads (the caller's among them) from the pool, or all on
/// the caller when another call holds the pool; rethrows the first item's exception.
void run_on_pool(std::size_t count, WorkRef work, unsigned threads);

}  // namespace detail

/// Runs work(item, thread) for every item in [0, count), on at most `max_threads` threads (0: the
/// setting above); `thread` in [0, threads) tells an item which per-thread scratch space is its own.
template <class Work>
void parallel_for(std::size_t count, const Work& work, unsigned max_threads = 0) {
    const unsigned threads = detail::threads_for(count, max_threads);
    if (threads <= 1) {
        for (std::size_t item = 0; item < count; ++item) work(item, 0u);
        return;
    }
    detail::run_on_pool(count, detail::WorkRef(work), threads);
}

/// Runs work(first, last) over [0, count) split into at most one chunk per thread, each of at least
/// `grain` items; on the calling thread alone when there are fewer than two chunks' worth (so a
/// small tensor pays nothing). For row-wise and elementwise loops over large tensors (softmax rows,
/// a mask, a scale), whose items each write only their own outputs: the result is the one a single
/// thread computes, bit for bit, whatever the threads.
template <class Work>
void parallel_chunks(std::size_t count, std::size_t grain, const Work& work) {
    if (grain == 0 || count < 2 * grain) {
        work(std::size_t{0}, count);
        return;
    }
    const std::size_t most = count / grain, threads = thread_count();
    const std::size_t chunks = most < threads ? most : threads;
    if (chunks <= 1) {
        work(std::size_t{0}, count);
        return;
    }
    parallel_for(chunks, [&](std::size_t chunk, unsigned) { work(chunk * count / chunks, (chunk + 1) * count / chunks); });
}

/// The grain of an elementwise loop: about 64K elements (tens of microseconds of memory traffic),
/// below which waking a second thread costs more than it saves.
inline constexpr std::size_t elementwise_grain = std::size_t{1} << 16;

}  // namespace tapegrad
