// Host emulation of the CUDA builtins accord/device.cuh uses, for tests only: include this, then
// the header, and the header's device functions compile with a host C++ compiler and run on host
// threads (atomics as __atomic builtins, fences as seq_cst fences, %globaltimer as the steady
// clock, one thread per "block", warp and block barriers as no-ops). It emulates the logic of the
// producer protocol and the waits, not the GPU memory model. Used by
// crates/accord-device/tests/header_emulated.rs and crates/accord-bench/tests/device_emulated.rs.
#pragma once
#include <atomic>
#include <chrono>
#include <thread>
#define ACCORD_DEVICE_EMULATION 1
static unsigned long long accord_emulation_ring_wait_ns = 10000000000ull;
#define ACCORD_DEVICE_RING_WAIT_NS accord_emulation_ring_wait_ns
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __shared__ static
struct accord_dim3 { unsigned x, y, z; };
static thread_local accord_dim3 threadIdx = {0, 0, 0};
static thread_local accord_dim3 blockIdx = {0, 0, 0};
static thread_local accord_dim3 blockDim = {1, 1, 1};
struct alignas(16) ulonglong2 { unsigned long long x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline ulonglong2 make_ulonglong2(unsigned long long x, unsigned long long y) { return ulonglong2{x, y}; }
inline unsigned long long accord_emulation_now_ns() {
  return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count();
}
inline void accord_emulation_pause() { std::this_thread::yield(); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline unsigned long long atomicAdd_system(unsigned long long* p, unsigned long long v) { return atomicAdd(p, v); }
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long expected, unsigned long long v) {
  __atomic_compare_exchange_n(p, &expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;
}
inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
  unsigned long long old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}
inline void __syncwarp(unsigned = 0xffffffffu) {}
inline void __syncthreads() {}
inline int __shfl_sync(unsigned, int v, int) { return v; }
