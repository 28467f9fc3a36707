// Live heap accounting for the benchmarks that report memory (bench_fused, bench_window): this
// header defines the program's malloc family (malloc, free, calloc, realloc, memalign,
// aligned_alloc, posix_memalign) over glibc's own (__libc_*), counting the usable size of every
// live block in heap::live and its high-water mark in heap::peak. std::vector, Eigen's GEMM
// blocks, LibTorch's CPU allocator (posix_memalign) and everything else are counted; thread stacks
// (mmap by pthreads) are not. Include it in one translation unit of a program only (it defines the
// functions), and only in a benchmark: it replaces the allocator for the whole process.
#pragma once

#include <malloc.h>

#include <atomic>
#include <cstddef>

extern "C" {
void* __libc_malloc(std::size_t);
void __libc_free(void*);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
}

namespace heap {
std::atomic<long long> live{0};
std::atomic<long long> peak{0};
inline void grew(void* p) {
    if (p == nullptr) return;
    const long long now = live += static_cast<long long>(malloc_usable_size(p));
    long long seen = peak.load(std::memory_order_relaxed);
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
}
inline void shrinks(void* p) {
    if (p != nullptr) live -= static_cast<long long>(malloc_usable_size(p));
}
}  // namespace heap

extern "C" {
void* malloc(std::size_t size) {
    void* p = __libc_malloc(size);
    heap::grew(p);
    return p;
}
void free(void* p) {
    heap::shrinks(p);
    __libc_free(p);
}
void* calloc(std::size_t count, std::size_t size) {
    void* p = __libc_calloc(count, size);
    heap::grew(p);
    return p;
}
void* realloc(void* old, std::size_t size) {
    heap::shrinks(old);
    void* p = __libc_realloc(old, size);
    heap::grew(p != nullptr ? p : (size != 0 ? old : nullptr));  // a failed realloc keeps `old`
    return p;
}
void* memalign(std::size_t alignment, std::size_t size) {
    void* p = __libc_memalign(alignment, size);
    heap::grew(p);
    return p;
}
void* aligned_alloc(std::size_t alignment, std::size_t size) { return memalign(alignment, size); }
int posix_memalign(void** out, std::size_t alignment, std::size_t size) {
    void* p = memalign(alignment, size);
    if (p == nullptr) return 12;  // ENOMEM
    *out = p;
    return 0;
}
}
