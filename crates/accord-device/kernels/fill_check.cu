// Byte-for-byte verification of large transfers: fill a buffer with the pattern of
// (src, dst, round), and count the bytes of a buffer that differ from it. Grid-stride loops:
// launch any geometry.
#include "common.cuh"
using namespace accord_kernels;

extern "C" __global__ void accord_dev_fill(u64 ptr, u64 bytes, u64 src, u64 dst, u64 round) {
  u8* p = reinterpret_cast<u8*>(ptr);
  const u64 stride = u64(gridDim.x) * blockDim.x;
  for (u64 i = u64(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes; i += stride) p[i] = pattern(src, dst, round, i);
}

extern "C" __global__ void accord_dev_check(u64 ptr, u64 bytes, u64 src, u64 dst, u64 round, u64* out) {
  const u8* p = reinterpret_cast<const u8*>(ptr);
  const u64 stride = u64(gridDim.x) * blockDim.x;
  unsigned long long bad = 0;
  for (u64 i = u64(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes; i += stride) bad += p[i] != pattern(src, dst, round, i);
  if (bad != 0) atomicAdd(reinterpret_cast<unsigned long long*>(out + 1), bad);
}
