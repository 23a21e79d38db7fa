// Example user kernel for the device API: a ring shift. Every rank sends `bytes` of its source
// window to the next rank's receive window with one put carrying a signal, then waits for the
// previous rank's data and adds it into `out`. One block per launch; call it with any block size.
//
// Windows (registered on every rank, in this order): 0 receives, 1 is the source.
// Signal 0 counts arrivals: launch k (k = 0, 1, ...) waits until it reaches k + 1.
// status[0] gets the first non-OK accord::device::Status (0 when everything went well).
//
// Compile with NVRTC (accord_cuda::kernels::Module::compile_and_load_with_includes, include
// folder crates/accord-device/include) or nvcc (-I crates/accord-device/include); see README.md.
#include <accord/device.cuh>

namespace ad = accord::device;

extern "C" __global__ void ring_shift(const ad::DeviceTable* table, unsigned long long bytes,
                                      unsigned long long launch, float* out, int* status) {
  const unsigned next = (table->rank + 1) % table->world;
  // The block's threads wrote the source before this launch (or before this point); put_block
  // orders their writes before the proxy copies it.
  ad::Status s = ad::put_block(table, /*window=*/0, next, /*dst_offset=*/0, /*src_window=*/1,
                               /*src_offset=*/0, bytes, ad::SIGNAL_ADD, /*signal_id=*/0, 1);
  __shared__ int waited;
  if (threadIdx.x == 0) {
    if (s == ad::OK) s = ad::wait_signal(table, 0, launch + 1, /*timeout_ns=*/5000000000ull);
    waited = s;
    if (s != ad::OK) status[0] = s;
  }
  __syncthreads();
  if (waited != ad::OK) return;
  // The previous rank's bytes are visible now: the signal was applied after they landed.
  const float* received =
      reinterpret_cast<const float*>(reinterpret_cast<const ad::WindowEntry*>(table->windows)[0].local_base);
  for (unsigned long long i = threadIdx.x; i < bytes / sizeof(float); i += blockDim.x) out[i] += received[i];
  // Before the source is written again: every put of this rank has its source reusable.
  if (threadIdx.x == 0) {
    s = ad::flush(table, 5000000000ull);
    if (s != ad::OK) status[0] = s;
  }
}
