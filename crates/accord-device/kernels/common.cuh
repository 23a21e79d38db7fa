// Helpers shared by the device API's test and bench kernels (not part of the public API).
// Every kernel here takes only 8-byte parameters (pointers and unsigned long long), the
// contract of accord_cuda::launch_u64_args. Result words (`out`) are device memory the host
// reads after the launch: out[0] is the first non-OK Status seen (sticky across launches and
// graph replays), out[1] counts wrong bytes, the rest is kernel-specific.
#pragma once
#include <accord/device.cuh>

namespace accord_kernels {
using namespace accord::device;

/// The byte a sender `src` writes at byte `i` for receiver `dst` in round `round`: every
/// (sender, receiver, round, position) gives a different sequence, so a misplaced or stale
/// byte is caught.
__device__ __forceinline__ u8 pattern(u64 src, u64 dst, u64 round, u64 i) {
  const u64 x = i * 131u + (i >> 8) * 7u + src * 17u + dst * 61u + round * 29u + 1u;
  return static_cast<u8>(x ^ (x >> 11));
}

/// Records `s` in out[0] if it is the first failure.
__device__ __forceinline__ void note(u64* out, Status s) {
  if (s != OK) atomicCAS(reinterpret_cast<unsigned long long*>(out), 0ull, static_cast<unsigned long long>(s));
}

__device__ __forceinline__ u8* window_base(const DeviceTable* t, u32 window) {
  return reinterpret_cast<u8*>(reinterpret_cast<const WindowEntry*>(t->windows)[window].local_base);
}
}  // namespace accord_kernels
