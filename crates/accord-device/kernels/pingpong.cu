// Ping-pong between ranks 0 and 1 (other ranks return at once), one thread each.
// Windows: 0 receives, 1 is the source. Each iteration the sender stamps the iteration number
// into the first 8 bytes of its source (and a pattern in the rest, up to 64 bytes), sends
// `bytes` with a signal, and the receiver checks the stamp after its wait: a signal seen before
// its data would show as a wrong byte.
// mode 0: put through the proxy; 1: put_direct (load/store path); 2: put_value (bytes <= 8);
// 3: the floor under put_direct, no API: the sender stores the bytes into the peer's window as
// mapped here, fences at system scope and stores the iteration into its signal slot there with
// a volatile store; the receiver spins on that one slot with volatile loads (bytes % 8 == 0).
// 4: put_direct's sender with mode 3's receiver; 5: mode 3's sender with wait_signal as the
// receiver (the two halves of the gap between put_direct and the floor, measured apart);
// 6: mode 3 with the clock read every 64 polls; 7: mode 3 with the receiver summing every
// rank's slot and the signal's base (read_signal's loads) without a clock; 8: mode 3 with a
// system-scope acquire fence after the wait; 9: mode 3 with one acquire load at system scope
// after the wait: what of wait_signal costs the time. 10: put_direct through a DirectPeer
// resolved before the loop (no table read per put), wait_signal as receiver; 11: mode 3 with
// the sender's targets resolved once before the loop (the floor without table reads).
// out[2] holds the iterations done so far, across launches and graph replays (so a replayed
// graph continues where the last replay stopped); out[3 + i] the round trip of iteration i of
// this launch in ns (rank 0).
#include "common.cuh"
using namespace accord_kernels;

// Whether what landed in window 0 is not iteration n's message from `peer`: the stamp and the
// pattern up to 64 bytes. One load per whole 8-byte word (the window base is 8-byte aligned),
// and no early exit, so the loads do not wait on each other's compares: byte by byte, the check
// was eight or more dependent loads after every wait, time the floor's receiver (one load of its
// stamp) never spent.
__device__ bool wrong_after_wait(const u8* dst, u64 bytes, u64 n, u32 peer, u32 me) {
  const u64 checked = bytes < 64 ? bytes : 64;
  const u64 words = checked / 8;
  bool wrong = false;
  for (u64 w = 0; w < words; ++w) {
    u64 want = 0;
    for (u64 b = 0; b < 8; ++b) want |= u64(w == 0 ? u8(n >> (8 * b)) : pattern(peer, me, n, 8 * w + b)) << (8 * b);
    wrong |= reinterpret_cast<const volatile u64*>(dst)[w] != want;
  }
  for (u64 b = 8 * words; b < checked; ++b) {
    const u8 want = b < 8 ? u8(n >> (8 * b)) : pattern(peer, me, n, b);
    wrong |= reinterpret_cast<const volatile u8*>(dst)[b] != want;
  }
  return wrong;
}

extern "C" __global__ void accord_dev_pingpong(const DeviceTable* t, u64 iters, u64 bytes, u64 mode, u64 signal_id,
                                               u64 timeout_ns, u64* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0 || t->rank > 1 || t->world < 2) return;
  const u32 me = t->rank;
  const u32 peer = me ^ 1u;
  const u32 sig = static_cast<u32>(signal_id);
  u8* src = window_base(t, 1);
  const u8* dst = window_base(t, 0);
  const u64 done_before = out[2];
  const bool raw_sender = mode == 3 || (mode >= 5 && mode <= 9) || mode == 11;
  const bool raw_receiver = mode == 3 || mode == 4 || (mode >= 6 && mode <= 9) || mode == 11;
  DirectPeer resolved = {};
  u8* hoisted_dst = nullptr;
  u64* hoisted_slot = nullptr;
  if (mode == 10 || mode == 11) {
    Status s = direct_peer(t, 0, peer, &resolved);
    if (s == OK) s = detail::direct_targets_of(resolved, 0, bytes, SIGNAL_SET, sig, &hoisted_dst, &hoisted_slot);
    if (s != OK) {
      note(out, s);
      return;
    }
  }
  for (u64 i = 0; i < iters; ++i) {
    const u64 n = done_before + i;  // this iteration, counted over every launch
    const u64 start = detail::now_ns();
    for (u32 turn = 0; turn < 2; ++turn) {
      const bool sending = (turn == 0) == (me == 0);
      Status s;
      if (sending) {
        reinterpret_cast<volatile u64*>(src)[0] = n;
        for (u64 b = 8; b < bytes && b < 64; ++b) src[b] = pattern(me, peer, n, b);
        if (raw_sender) {
          u8* dst_remote = hoisted_dst;
          u64* slot = hoisted_slot;
          s = mode == 11 ? OK : detail::direct_targets(t, 0, peer, 0, bytes, SIGNAL_SET, sig, &dst_remote, &slot);
          if (s == OK) {
            for (u64 w = 0; w < bytes / 8; ++w) {
              reinterpret_cast<volatile u64*>(dst_remote)[w] = reinterpret_cast<const volatile u64*>(src)[w];
            }
            __threadfence_system();
            *reinterpret_cast<volatile u64*>(slot) = n + 1;
          }
        } else if (mode == 1 || mode == 4) {
          s = put_direct(t, 0, peer, 0, src, bytes, SIGNAL_ADD, sig, 1);
        } else if (mode == 10) {
          s = put_direct(resolved, 0, src, bytes, SIGNAL_ADD, sig, 1);
        } else if (mode == 2) {
          s = put_value(t, 0, peer, 0, n, static_cast<u32>(bytes), SIGNAL_ADD, sig, 1);
        } else {
          s = put(t, 0, peer, 0, 1, 0, bytes, SIGNAL_ADD, sig, 1);
        }
      } else if (raw_receiver) {
        const volatile u64* mine = reinterpret_cast<const volatile u64*>(t->signals) + u64(sig) * t->world + peer;
        const u32 clock_every = mode == 6 ? 63u : 1023u;
        s = OK;
        for (u32 polls = 0;; ++polls) {
          const u64 seen = mode == 7 ? detail::signal_sum_relaxed(t, sig) -
                                           detail::load_volatile(reinterpret_cast<const u64*>(t->signal_bases) + sig)
                                     : *mine;
          if (seen >= n + 1) break;
          if ((polls & clock_every) == clock_every && detail::now_ns() - start > timeout_ns) {
            s = TIMEOUT;
            break;
          }
        }
        if (s == OK && mode == 8) detail::fence_acquire_sys();
        if (s == OK && mode == 9) (void)detail::load_acquire_sys(const_cast<const u64*>(mine));
        if (s == OK) {
          u64 stamp = reinterpret_cast<const volatile u64*>(dst)[0];
          if (stamp != n) atomicAdd(reinterpret_cast<unsigned long long*>(out + 1), 1ull);
        }
      } else {
        s = wait_signal(t, sig, n + 1, timeout_ns);
        if (s == OK && wrong_after_wait(dst, bytes, n, peer, me)) {
          atomicAdd(reinterpret_cast<unsigned long long*>(out + 1), 1ull);
        }
      }
      if (s != OK) {
        note(out, s);
        return;
      }
    }
    if (me == 0) out[3 + i] = detail::now_ns() - start;
    out[2] = n + 1;
  }
}
