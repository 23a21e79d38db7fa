// Large puts: one thread issues `count` puts of `bytes` bytes from window 1 offset 0 to
// `peer`'s window 0 offset 0, the last with SIGNAL_ADD 1 on `signal_id`, then flushes (every
// source reusable). No SM touches the bytes: the proxy hands each put to the engine, which
// copies with the copy engine (same host) or sends it (network). The host times the launch.
#include "common.cuh"
using namespace accord_kernels;

extern "C" __global__ void accord_dev_bandwidth(const DeviceTable* t, u64 peer, u64 bytes, u64 count, u64 signal_id,
                                                u64 timeout_ns, u64* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (u64 k = 0; k < count; ++k) {
    const bool last = k + 1 == count;
    const Status s = put(t, 0, static_cast<u32>(peer), 0, 1, 0, bytes, last ? SIGNAL_ADD : SIGNAL_NONE,
                         static_cast<u32>(signal_id), 1);
    if (s != OK) {
      note(out, s);
      return;
    }
  }
  note(out, flush(t, timeout_ns));
}
