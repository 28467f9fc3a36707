// The thread pool behind tapegrad::parallel_for (autodiff/parallel.hpp) and the threads setting.
//
// Why a pool: starting threads for every call cost ~30-60 µs per parallel_for here, which is why
// the kernels and the fused op keep work under ~1e6 multiply-adds on one thread. The workers are
// created once, at the first call that needs them (grown when a later call asks for more: a
// larger set_threads or max_threads; never shrunk, a smaller setting only leaves some asleep),
// and sleep on a condition variable between calls, after a short spin: a worker that finishes a
// job watches for the next one for up to `spin_before_sleep` (50 µs) before it sleeps, and a
// caller watches for its helpers to finish as long before it sleeps. Why: a step's parallel calls
// follow each other within microseconds, and on the development VM (2 vCPUs, 2026-12-02) every
// sleep and wake-up went through the hypervisor: in a two-thread float32 attention step at
// T = 1024 (`perf`), 9% of the calling thread's time was the kernel's paravirtualised interrupt
// path of those wake-ups. Past the spin, idle workers sleep, so they take no core from other
// processes or other tapes for longer than that when more threads than cores are running.
//
// One call at a time has the pool (owner_). A call that finds it taken (another user thread's
// tape is using it) runs its items on its own thread: that thread is then busy anyway, the cores
// are already shared out, and it cannot deadlock or wait on work it does not own. Results do not
// depend on that choice, since they do not depend on the thread count.
//
// A call posts its job (on the caller's stack) with a number of seats, wakes that many workers,
// and takes items itself at once; workers that wake take a seat and items until none are left.
// The caller then closes the job (seats not yet taken lapse: a worker that wakes late goes back
// to sleep) and waits only for the workers that joined, so a small job the caller finishes alone
// never waits for a wake-up.
//
// Exit: the pool is a function-local static; its destructor waits for a running job, stops and
// joins the workers (nothing leaks, no thread outlives main's statics). A parallel_for from a
// static destructor that runs after it (an object built before the pool was first used) finds
// `pool_gone` set, a trivially destructible flag, and runs its items on the calling thread.
#include "autodiff/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace tapegrad {
namespace {

constinit std::atomic<unsigned> threads_setting{0};
constinit std::atomic<bool> pool_gone{false};
constinit thread_local bool inside_parallel_for = false;

// How long a worker watches for the next job, and a caller for its helpers, before sleeping.
constexpr auto spin_before_sleep = std::chrono::microseconds(50);

// Polls `done` until it holds or spin_before_sleep has passed (the caller then sleeps on its
// condition variable, whose predicate decides).
template <class Done>
void spin_until(const Done& done) {
    const auto give_up = std::chrono::steady_clock::now() + spin_before_sleep;
    while (!done() && std::chrono::steady_clock::now() <= give_up) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();  // tells the core this is a spin (frees resources for its sibling)
#endif
    }
}

// Marks the current thread as running parallel_for items for a scope (nested calls run inline),
// restoring what was there before.
class InsideScope {
public:
    InsideScope() : previous_(std::exchange(inside_parallel_for, true)) {}
    ~InsideScope() { inside_parallel_for = previous_; }
    InsideScope(const InsideScope&) = delete;
    InsideScope& operator=(const InsideScope&) = delete;

private:
    bool previous_;
};

// One parallel_for call's items, shared by its caller and the workers that join it.
class Job {
public:
    Job(std::size_t count, detail::WorkRef work) : count_(count), work_(work) {}

    // Takes items until none are left; the first exception stops the hand-out for every thread.
    void take_items(unsigned thread) noexcept {
        try {
            for (std::size_t item; (item = next_.fetch_add(1, std::memory_order_relaxed)) < count_;) work_(item, thread);
        } catch (...) {
            const std::lock_guard lock(failure_mutex_);
            if (!failure_) failure_ = std::current_exception();
            next_.store(count_, std::memory_order_relaxed);
        }
    }

    // Called once every thread has left the job.
    void rethrow_failure() const {
        if (failure_) std::rethrow_exception(failure_);
    }

private:
    const std::size_t count_;
    const detail::WorkRef work_;
    std::atomic<std::size_t> next_{0};
    std::mutex failure_mutex_;
    std::exception_ptr failure_;
};

class Pool {
public:
    Pool() = default;
    Pool(const Pool&) = delete;
    Pool& operator=(const Pool&) = delete;

    ~Pool() {
        const std::lock_guard owner(owner_);  // a job still running on another thread ends first
        pool_gone.store(true);
        {
            const std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        for (std::thread& worker : workers_) worker.join();
    }

    // The call that holds this mutex has the pool.
    std::mutex& owner() { return owner_; }

    // Runs `job` on the calling thread and up to `helpers` workers; returns once every worker
    // that joined has left it. The caller holds owner().
    void run(Job& job, unsigned helpers) {
        {
            const std::lock_guard lock(mutex_);
            helpers = grow_to(helpers);
            job_ = &job;
            seats_ = helpers;
            next_thread_ = 1;  // the caller is thread 0
        }
        // Told after the lock is released, so a spinning worker that sees it finds the lock free
        // (told under it, the worker would block on the lock: a sleep and a wake-up after all).
        posted_.fetch_add(1, std::memory_order_release);
        for (unsigned h = 0; h < helpers; ++h) wake_.notify_one();
        {
            const InsideScope inside;
            job.take_items(0);
        }
        std::unique_lock lock(mutex_);
        job_ = nullptr;
        seats_ = 0;
        if (active_.load(std::memory_order_relaxed) != 0) {
            lock.unlock();
            spin_until([this] { return active_.load(std::memory_order_acquire) == 0; });
            lock.lock();
        }
        finished_.wait(lock, [this] { return active_.load(std::memory_order_relaxed) == 0; });
    }

private:
    // Starts workers until there are `wanted`; returns how many there are, at most `wanted` (fewer
    // when the system refuses a thread: the job then runs on fewer, with the same results).
    unsigned grow_to(unsigned wanted) {
        try {
            while (workers_.size() < wanted) workers_.emplace_back([this] { serve(); });
        } catch (const std::system_error&) {
        }
        return static_cast<unsigned>(std::min<std::size_t>(wanted, workers_.size()));
    }

    // A worker's life: sleep until a job has a free seat, take it, take items, leave.
    void serve() {
        inside_parallel_for = true;  // a worker only ever runs items
        std::unique_lock lock(mutex_);
        for (;;) {
            if (!stopping_ && seats_ == 0) {  // no job now: watch for the next one a while
                const unsigned seen = posted_.load(std::memory_order_relaxed);
                lock.unlock();
                spin_until([&] { return posted_.load(std::memory_order_acquire) != seen; });
                lock.lock();
            }
            wake_.wait(lock, [this] { return stopping_ || seats_ > 0; });
            if (stopping_) return;
            --seats_;
            ++active_;
            Job& job = *job_;
            const unsigned thread = next_thread_++;
            lock.unlock();
            job.take_items(thread);
            lock.lock();
            if (active_.fetch_sub(1, std::memory_order_release) == 1) finished_.notify_one();
        }
    }

    std::mutex owner_;
    std::mutex mutex_;  // guards everything below
    std::condition_variable wake_;      // workers: a seat is free, or stop
    std::condition_variable finished_;  // the caller: the last worker left the job
    std::vector<std::thread> workers_;
    Job* job_ = nullptr;
    unsigned seats_ = 0;        // workers the current job may still take
    unsigned next_thread_ = 1;  // the thread index the next seat gets
    std::atomic<unsigned> active_{0};  // workers inside the current job (written under mutex_,
                                       // read without it while the caller spins)
    std::atomic<unsigned> posted_{0};  // jobs posted so far (written after a job is posted under
                                       // mutex_, read without it while a worker spins)
    bool stopping_ = false;
};

Pool& pool() {
    static Pool instance;
    return instance;
}

}  // namespace

void set_threads(unsigned threads) { threads_setting.store(threads, std::memory_order_relaxed); }

unsigned thread_count() {
    const unsigned setting = threads_setting.load(std::memory_order_relaxed);
    return setting != 0 ? setting : std::max(1u, std::thread::hardware_concurrency());
}

namespace detail {

unsigned threads_for(std::size_t count, unsigned max_threads) {
    if (inside_parallel_for) return 1;
    const unsigned wanted = max_threads != 0 ? max_threads : thread_count();
    return static_cast<unsigned>(std::min<std::size_t>(wanted, count));
}

void run_on_pool(std::size_t count, WorkRef work, unsigned threads) {
    Job job(count, work);
    const auto run_here = [&job] {
        const InsideScope inside;
        job.take_items(0);
    };
    if (pool_gone.load()) {
        run_here();
    } else {
        Pool& shared = pool();
        std::unique_lock owner(shared.owner(), std::try_to_lock);
        if (owner.owns_lock()) {
            shared.run(job, threads - 1);
        } else {
            run_here();  // another call has the pool
        }
    }
    job.rethrow_failure();
}

}  // namespace detail
}  // namespace tapegrad
