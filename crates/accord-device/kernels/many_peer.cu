// Every rank puts a distinct pattern of `bytes_per_peer` bytes into every rank (itself
// included) with a signal, then waits for all `world` arrivals of this round and checks every
// byte. One block: the threads fill the source, thread 0 issues the puts (put_block), the
// threads check what landed. Windows: 0 receives (sender s writes at s * bytes_per_peer), 1 is
// the source (the copy for peer p at p * bytes_per_peer); both hold world * bytes_per_peer.
// Signal `signal_id` counts arrivals; `round` (0, 1, ...) makes each launch's bytes new and
// its target (round + 1) * world.
#include "common.cuh"
using namespace accord_kernels;

extern "C" __global__ void accord_dev_many_peer(const DeviceTable* t, u64 bytes_per_peer, u64 round, u64 signal_id,
                                                u64 timeout_ns, u64* out) {
  if (blockIdx.x != 0) return;
  const u32 me = t->rank;
  const u32 sig = static_cast<u32>(signal_id);
  u8* src = window_base(t, 1);
  const u8* dst = window_base(t, 0);
  for (u32 p = 0; p < t->world; ++p) {
    for (u64 i = threadIdx.x; i < bytes_per_peer; i += blockDim.x) src[p * bytes_per_peer + i] = pattern(me, p, round, i);
  }
  for (u32 p = 0; p < t->world; ++p) {
    const Status s = put_block(t, 0, p, u64(me) * bytes_per_peer, 1, u64(p) * bytes_per_peer, bytes_per_peer,
                               SIGNAL_ADD, sig, 1);
    if (s != OK) {
      if (threadIdx.x == 0) note(out, s);
      return;
    }
  }
  __shared__ int waited;
  if (threadIdx.x == 0) {
    const Status s = wait_signal(t, sig, (round + 1) * t->world, timeout_ns);
    note(out, s);
    waited = s;
  }
  __syncthreads();
  if (waited != OK) return;
  unsigned long long bad = 0;
  for (u32 s = 0; s < t->world; ++s) {
    for (u64 i = threadIdx.x; i < bytes_per_peer; i += blockDim.x) {
      bad += dst[s * bytes_per_peer + i] != pattern(s, me, round, i);
    }
  }
  if (bad != 0) atomicAdd(reinterpret_cast<unsigned long long*>(out + 1), bad);
}
