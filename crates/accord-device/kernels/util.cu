// Single-purpose kernels the harness strings together (one thread each): wait for a signal,
// flush, barrier, and a malformed put that the proxy must refuse.
#include "common.cuh"
using namespace accord_kernels;

extern "C" __global__ void accord_dev_wait(const DeviceTable* t, u64 signal_id, u64 at_least, u64 timeout_ns,
                                           u64* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  u64 reached = 0;
  note(out, wait_signal(t, static_cast<u32>(signal_id), at_least, timeout_ns, &reached));
  out[2] = reached;
}

extern "C" __global__ void accord_dev_flush(const DeviceTable* t, u64 timeout_ns, u64* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  note(out, flush(t, timeout_ns));
}

extern "C" __global__ void accord_dev_barrier(const DeviceTable* t, u64 rounds, u64 timeout_ns, u64* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (u64 r = 0; r < rounds; ++r) {
    const Status s = barrier(t, timeout_ns);
    if (s != OK) {
      note(out, s);
      return;
    }
  }
  out[2] += rounds;
}

/// The device API checks what it can before taking a ticket: each of these must come back
/// BAD_ARGUMENT without reaching the ring. out[2] counts the ones that did not.
extern "C" __global__ void accord_dev_refusals(const DeviceTable* t, u64* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const u64 wbytes = reinterpret_cast<const WindowEntry*>(t->windows)[0].bytes;
  const Status got[] = {
      put(t, 0, t->world, 0, 1, 0, 8),                      // peer out of range
      put(t, t->window_count, 0, 0, 1, 0, 8),               // window out of range
      put(t, 0, 0, wbytes - 4, 1, 0, 8),                    // past the window's end
      put(t, 0, 0, ~0ull - 2, 1, 0, 8),                     // offset + bytes overflows
      put(t, 0, 0, 0, 1, 0, 0),                             // zero bytes
      put_value(t, 0, 0, 0, 1, 9),                          // put_value of 9 bytes
      signal(t, 0, user_signal_count(t), SIGNAL_ADD, 1),    // the barrier's signal
      signal(t, 0, 0, 7, 1),                                // unknown signal op
      put(t, 0, 0, 0, 1, 0, 8, SIGNAL_NONE, 0, 0, t->counter_count),  // counter out of range
  };
  for (Status s : got) {
    if (s != BAD_ARGUMENT) atomicAdd(reinterpret_cast<unsigned long long*>(out + 2), 1ull);
  }
}

/// out[2] = 1 when `peer`'s window 0 and signal slots are mapped here (put_direct can run).
extern "C" __global__ void accord_dev_probe_direct(const DeviceTable* t, u64 peer, u64* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0 || peer >= t->world || t->window_count == 0) return;
  const WindowEntry* w = reinterpret_cast<const WindowEntry*>(t->windows);
  const bool window = w->peer_bases != 0 && reinterpret_cast<const u64*>(w->peer_bases)[peer] != 0;
  const bool signals = t->peer_signals != 0 && reinterpret_cast<const u64*>(t->peer_signals)[peer] != 0;
  out[2] = window && signals ? 1 : 0;
}

/// One put of 64 bytes with a signal to every rank, then return without waiting: the host waits
/// for the proxy to run them while no kernel spins, so the engine opens every peer mapping
/// (windows and signal slots) on an idle GPU before any timed kernel.
extern "C" __global__ void accord_dev_warm(const DeviceTable* t, u64 signal_id, u64* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (u32 p = 0; p < t->world; ++p) note(out, put(t, 0, p, 0, 1, 0, 64, SIGNAL_ADD, static_cast<u32>(signal_id), 1));
}
