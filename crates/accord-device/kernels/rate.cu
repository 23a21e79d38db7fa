// Descriptor rate: every thread of the grid issues `puts_per_thread` puts of `bytes` bytes
// (no signal) from window 1 to `peer`'s window 0, every put to a slot of its own: put k of
// thread i goes to slot k * threads + i, at slot * stride (modulo the window). stride == bytes
// makes neighbouring threads' puts contiguous (a proxy may merge them); stride > bytes leaves
// gaps, so none can merge. The host
// times this kernel followed by accord_dev_flush on the same stream: puts per second through
// one ring.
#include "common.cuh"
using namespace accord_kernels;

extern "C" __global__ void accord_dev_rate(const DeviceTable* t, u64 peer, u64 puts_per_thread, u64 bytes, u64 stride,
                                           u64* out) {
  const u64 thread = u64(blockIdx.x) * blockDim.x + threadIdx.x;
  const u64 window_bytes = reinterpret_cast<const WindowEntry*>(t->windows)[0].bytes;
  const u64 slots = (bytes == 0 || stride < bytes) ? 0 : window_bytes / stride;
  if (slots == 0) {
    note(out, BAD_ARGUMENT);
    return;
  }
  const u64 threads = u64(gridDim.x) * blockDim.x;
  for (u64 k = 0; k < puts_per_thread; ++k) {
    const u64 offset = ((k * threads + thread) % slots) * stride;
    const Status s = put(t, 0, static_cast<u32>(peer), offset, 1, offset, bytes);
    if (s != OK) {
      note(out, s);
      return;
    }
  }
  atomicAdd(reinterpret_cast<unsigned long long*>(out + 2), puts_per_thread);
}
