// accord/device.cuh: Accord's device API. A CUDA kernel puts bytes into a peer's window, signals
// the peer and waits for signals, without returning to the host. GPU threads write 64-byte
// descriptors into a bounded ring in mapped host memory; a CPU proxy thread per ring runs them:
// on one host, as copy-engine copies and stream stores straight into the peer's window mapped
// through CUDA IPC; elsewhere as ordinary engine writes, so the bytes take whatever route the
// engine has to that peer (shared memory, UDP across hosts). No RDMA NIC and no NVSHMEM are
// needed.
//
// Compilers: nvcc, and NVRTC (Accord's NVRTC options define ACCORD_NVRTC; NVRTC itself defines
// __CUDACC_RTC__): under NVRTC no host header is included. A plain host C++ compiler (neither
// __CUDACC__ nor __CUDACC_RTC__) sees only the types and constants, so host code and tests can
// check the layout. Every name lives in the C++ namespace `accord::device`; the only macros are
// the ACCORD_* ones defined below.
//
// The layout mirrors crates/accord-device/src/layout.rs field for field (a test compiles this
// header with the host compiler and compares every offset with Rust's). A table built by one
// layout version is for the same version only: compare `table->layout_version` with
// ACCORD_DEVICE_LAYOUT_VERSION (`accord::device::table_ok`).
//
// Example: rank 0 puts `n` bytes to rank 1 and signals it; rank 1 waits and replies.
//
//     #include <accord/device.cuh>
//     namespace ad = accord::device;
//     // window 0 is the destination on every rank, window 1 the source; signal 0 counts arrivals.
//     extern "C" __global__ void ping(const ad::DeviceTable* table, unsigned long long n,
//                                     int* status) {
//       if (threadIdx.x != 0) return;
//       unsigned peer = table->rank ^ 1u;
//       ad::Status s = ad::OK;
//       if (table->rank == 0) {
//         s = ad::put(table, 0, peer, 0, 1, 0, n, ad::SIGNAL_ADD, 0, 1);
//         if (s == ad::OK) s = ad::wait_signal(table, 0, 1, 1000000000ull);   // the reply
//       } else {
//         s = ad::wait_signal(table, 0, 1, 1000000000ull);                     // the data landed
//         if (s == ad::OK) s = ad::signal(table, peer, 0, ad::SIGNAL_ADD, 1);
//       }
//       *status = s;
//     }
//
// Memory each piece lives in (the host side places it; layout.rs documents each field):
//   descriptor slots, ring control words, counters ... mapped host memory (the proxy reads and
//                                                       writes them with CPU loads and stores);
//   `reserved`, `cached_consumed`, the barrier epoch .. device memory (GPU atomics only);
//   signal slots and bases ............................ wherever accord-device's placement puts
//                                                       them (device memory on a GPU: peers'
//                                                       proxies write the slots, kernels poll).
//
// Ordering rules every function below relies on:
//   * A put's signal becomes visible at the peer only after every byte of that put landed (the
//     proxy stores the signal after the put's copy on the same stream, with a memory barrier,
//     or issues the signal write once the put's engine write completed).
//   * A descriptor is published by a release store at system scope of its `seq`, so the calling
//     thread's earlier writes (to the put's source, say) are visible to the proxy and the copy
//     engine before the proxy can take it.
//   * A signal is driven either through the proxy (put/put_value/signal) or directly
//     (put_direct's signal), never both: the proxy keeps the running value of the slots it
//     writes, and a direct atomic in the same slot would be overwritten by its next write.
//   * Every wait is bounded (a timeout in nanoseconds of %globaltimer) and returns a Status.
//   * Errors are sticky: once the proxy refused or failed a descriptor of any ring
//     (`RingControl::error != 0`), waits and flushes return PROXY_ERROR; the host reads the
//     details (which descriptor, which field) from the proxy's error list.
#ifndef ACCORD_DEVICE_CUH
#define ACCORD_DEVICE_CUH

/// Version of the shared memory layout; equal to `accord_device::layout::LAYOUT_VERSION`.
#define ACCORD_DEVICE_LAYOUT_VERSION 1
/// The Accord release this header ships with (the workspace version).
#define ACCORD_VERSION_MAJOR 0
#define ACCORD_VERSION_MINOR 1
#define ACCORD_VERSION_PATCH 0
#define ACCORD_VERSION_STRING "0.1.0"

/// How long a put waits for a free slot in a full ring before it gives up with TIMEOUT (ns).
/// Define it before including the header to change it.
#ifndef ACCORD_DEVICE_RING_WAIT_NS
#define ACCORD_DEVICE_RING_WAIT_NS 10000000000ull
#endif

/// How many of the threads waiting on a full ring read the proxy's consumer index in host
/// memory (the ones holding the next tickets to be freed); the rest watch a device-local copy.
/// Define it before including the header to change it.
#ifndef ACCORD_DEVICE_RING_READERS
#define ACCORD_DEVICE_RING_READERS 32ull
#endif

/// 1: an 8-byte put whose source and destination offsets are 8-byte aligned, from a window in
/// this GPU's own memory (`DeviceTable::readable_windows`), reads its source word at the call and
/// travels inside its descriptor as a put_value: the proxy stores a batch's lone value with a
/// stream write, and copies several from host cells, merged where their destinations are
/// contiguous (the proxy's `values_as_copies`). 0: every put is a copy from its window. Define
/// it before including the header to change it.
#ifndef ACCORD_DEVICE_PUT_INLINE
#define ACCORD_DEVICE_PUT_INLINE 1
#endif

// ACCORD_DEVICE_EMULATION (tests only: crates/accord-device/tests/header_emulated.rs) compiles
// the device functions with a host compiler, on host threads, against a shim of the CUDA
// builtins they use.
#if defined(__CUDACC_RTC__) || defined(ACCORD_NVRTC) || defined(ACCORD_DEVICE_EMULATION)
#define ACCORD_DEVICE_CODE 1
#elif defined(__CUDACC__)
#define ACCORD_DEVICE_CODE 1
#include <stddef.h>
#else
#include <stddef.h>
#endif

#if defined(ACCORD_DEVICE_CODE)
#define ACCORD_DEVICE_INLINE __device__ __forceinline__
#endif

namespace accord {
namespace device {

// Fixed-width aliases. `unsigned long long` is 64 bits under nvcc, NVRTC and every LP64 host
// compiler; the static_asserts below make any other platform refuse to compile.
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
static_assert(sizeof(u64) == 8, "u64 must be 8 bytes");
static_assert(sizeof(u32) == 4, "u32 must be 4 bytes");
static_assert(sizeof(u16) == 2, "u16 must be 2 bytes");
static_assert(sizeof(u8) == 1, "u8 must be 1 byte");

// ---- Layout (mirrors layout.rs) ------------------------------------------------------------

/// Bytes of one descriptor (one 64-byte line).
constexpr u32 DESCRIPTOR_BYTES = 64;

/// `Descriptor::op`: copy `bytes` from this rank's `src_window` at `src_offset` to the peer's
/// `window` at `dst_offset`.
constexpr u8 OP_PUT = 1;
/// `Descriptor::op`: write the `bytes` (1..=8) low bytes of `src_offset` (an inline value).
constexpr u8 OP_PUT_VALUE = 2;
/// `Descriptor::op`: only the signal action, no data.
constexpr u8 OP_SIGNAL = 3;

/// `Descriptor::signal_op`: no signal.
constexpr u8 SIGNAL_NONE = 0;
/// `Descriptor::signal_op`: add `signal_value` to this rank's contribution at the peer.
constexpr u8 SIGNAL_ADD = 1;
/// `Descriptor::signal_op`: set this rank's contribution at the peer to `signal_value`.
constexpr u8 SIGNAL_SET = 2;

/// `Descriptor::flags` bit: bump this rank's counter `counter_id` once the put's source may be
/// reused (the put completed at this end).
constexpr u16 FLAG_COUNTER = 1u << 0;

/// Pass as `counter_id` for "no local counter action".
constexpr u32 NO_COUNTER = 0xffffffffu;
/// Pass as `ring` for the default ring, `blockIdx.x % ring_count`.
constexpr u32 RING_AUTO = 0xffffffffu;

/// One request from a GPU thread (layout.rs `Descriptor`). The producer writes every field,
/// then `seq = ticket + 1` last, with release semantics at system scope.
struct Descriptor {
  u64 seq;           ///< ticket + 1; 0 in a slot never written
  u8 op;             ///< OP_*
  u8 signal_op;      ///< SIGNAL_*
  u16 flags;         ///< FLAG_COUNTER; other bits reserved (zero)
  u32 peer;          ///< destination rank
  u32 window;        ///< destination window id
  u32 src_window;    ///< source window id (OP_PUT)
  u64 dst_offset;    ///< byte offset in the destination window
  u64 src_offset;    ///< OP_PUT: offset in the source window; OP_PUT_VALUE: the value
  u64 bytes;         ///< bytes to move (OP_PUT_VALUE: 1..=8)
  u32 signal_id;     ///< the peer's signal the action applies to
  u32 counter_id;    ///< this rank's counter FLAG_COUNTER bumps
  u64 signal_value;  ///< operand of the signal action
};

/// Control words of one ring (layout.rs `RingControl`), each on its own 64-byte line; written
/// by the ring's proxy thread only.
struct alignas(64) RingControl {
  u64 consumed;   ///< tickets whose slots are free again
  u64 _pad0[7];
  u64 completed;  ///< every ticket below this has its source reusable
  u64 _pad1[7];
  u64 error;      ///< 0, or 1 + the ticket of the first descriptor refused or failed
  u64 _pad2[7];
};

/// Where one ring lives (layout.rs `RingDevice`); every address is a device address.
struct RingDevice {
  u64 slots;            ///< Descriptor[slot_count] (mapped host memory)
  u64 control;          ///< RingControl (mapped host memory)
  u64 reserved;         ///< u64 ticket counter (device memory, GPU atomics only)
  u64 cached_consumed;  ///< u64 producers' copy of `consumed` (device memory)
  u32 slot_count;       ///< a power of two
  u32 _pad;
};

/// One window (layout.rs `WindowEntry`).
struct WindowEntry {
  u64 local_base;  ///< this rank's window
  u64 bytes;       ///< its length, the same on every rank
  u64 peer_bases;  ///< u64[world]: peers' windows mapped here for direct stores, 0 where not
};

/// What a kernel receives, by pointer, in device memory (layout.rs `DeviceTable`).
struct DeviceTable {
  u32 layout_version;  ///< ACCORD_DEVICE_LAYOUT_VERSION of the builder
  u32 rank;
  u32 world;
  u32 ring_count;
  u32 signal_count;    ///< the barrier's included: users get ids 0 .. signal_count - 2
  u32 counter_count;
  u32 window_count;
  u32 readable_windows;  ///< bit w: window w is this GPU's own memory (an 8-byte put travels inline)
  u64 rings;           ///< RingDevice[ring_count]
  u64 signals;         ///< u64[signal_count][world]: slot [s][r] holds rank r's contribution
  u64 signal_bases;    ///< u64[signal_count]: the sum of signal s at its last reset
  u64 counters;        ///< u64[counter_count] (mapped host memory)
  u64 windows;         ///< WindowEntry[window_count]
  u64 peer_signals;    ///< u64[world]: peers' signal slots mapped here, 0 where not
  u64 barrier_epoch;   ///< one u64 of device memory: barriers this rank entered
};

static_assert(sizeof(Descriptor) == DESCRIPTOR_BYTES, "a descriptor is one 64-byte line");
static_assert(sizeof(RingControl) == 192, "RingControl is three lines");
static_assert(sizeof(RingDevice) == 40, "RingDevice");
static_assert(sizeof(WindowEntry) == 24, "WindowEntry");
static_assert(sizeof(DeviceTable) == 88, "DeviceTable");
// Field offsets: NVRTC 13.0 has no __builtin_offsetof (NVRTC 13.2 does), so only the compilers
// that have it check them here; tests/header_layout.rs checks every offset with the host compiler.
#if !defined(__CUDACC_RTC__)
static_assert(__builtin_offsetof(Descriptor, peer) == 12, "Descriptor::peer");
static_assert(__builtin_offsetof(Descriptor, dst_offset) == 24, "Descriptor::dst_offset");
static_assert(__builtin_offsetof(Descriptor, signal_value) == 56, "Descriptor::signal_value");
static_assert(__builtin_offsetof(RingControl, completed) == 64, "RingControl::completed");
static_assert(__builtin_offsetof(RingControl, error) == 128, "RingControl::error");
static_assert(__builtin_offsetof(DeviceTable, rings) == 32, "DeviceTable::rings");
static_assert(__builtin_offsetof(DeviceTable, barrier_epoch) == 80, "DeviceTable::barrier_epoch");
#endif

#if defined(ACCORD_DEVICE_CODE)
#define ACCORD_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ACCORD_HOST_DEVICE inline
#endif

/// The descriptor's bytes 8..63 as seven little-endian words (`words[0]` holds bytes 8..15), in
/// the order the producer stores them before `seq`. Host code can call it too (the layout test
/// checks it against layout.rs).
ACCORD_HOST_DEVICE void pack_body(const Descriptor& d, u64 words[7]) {
  words[0] = u64(d.op) | (u64(d.signal_op) << 8) | (u64(d.flags) << 16) | (u64(d.peer) << 32);
  words[1] = u64(d.window) | (u64(d.src_window) << 32);
  words[2] = d.dst_offset;
  words[3] = d.src_offset;
  words[4] = d.bytes;
  words[5] = u64(d.signal_id) | (u64(d.counter_id) << 32);
  words[6] = d.signal_value;
}

/// What every device function returns.
enum Status : int {
  OK = 0,
  /// The bounded wait ran out (a full ring the proxy did not drain, a signal not reached, a
  /// flush not finished).
  TIMEOUT = 1,
  /// Some ring's `control.error` is set: the proxy refused or failed a descriptor (sticky).
  PROXY_ERROR = 2,
  /// An argument is out of range (peer, window, offset + bytes, signal, counter, ring); nothing
  /// was issued.
  BAD_ARGUMENT = 3,
  /// put_direct only: this peer (or its signal slots) cannot be stored to directly; nothing was
  /// written. Use put instead.
  NOT_DIRECT = 4,
};

#if defined(ACCORD_DEVICE_CODE)

/// A peer's window and signal slots as put_direct reaches them, resolved once by direct_peer.
/// Why: a kernel that puts to the same peer in a loop keeps this in registers and reads no
/// table in front of its stores (put_direct with a table resolves it on every call).
struct DirectPeer {
  u8* window;          ///< the peer's window, mapped here (null: not reachable by stores)
  u64 window_bytes;    ///< its length
  u64* signal_slots;   ///< this rank's slot of signal 0 at the peer, signal s at s * world
                       ///< further (null: the peer's slots are not mapped here)
  u32 world;
  u32 user_signals;    ///< signals put_direct may act on: 0 .. user_signals - 1
};

// ---- Memory-model helpers ---------------------------------------------------------------

namespace detail {

/// Load with acquire semantics at system scope (sees the proxy's and peers' writes in order).
ACCORD_DEVICE_INLINE u64 load_acquire_sys(const u64* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  u64 v;
  asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#else
  u64 v = *reinterpret_cast<const volatile u64*>(p);
  __threadfence_system();
  return v;
#endif
}

/// Store with release semantics at system scope (every earlier write of this thread is visible
/// first).
ACCORD_DEVICE_INLINE void store_release_sys(u64* p, u64 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __threadfence_system();
  *reinterpret_cast<volatile u64*>(p) = v;
#endif
}

/// Atomic add with release semantics at system scope (direct signals to a peer GPU).
ACCORD_DEVICE_INLINE void add_release_sys(u64* p, u64 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("red.release.sys.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __threadfence_system();
  atomicAdd_system(reinterpret_cast<unsigned long long*>(p), v);
#endif
}

ACCORD_DEVICE_INLINE u64 load_volatile(const u64* p) { return *reinterpret_cast<const volatile u64*>(p); }

/// Whether `p` is in the global state space (device or mapped host memory), not in shared or
/// local memory.
ACCORD_DEVICE_INLINE bool in_global(const void* p) {
#if defined(__CUDA_ARCH__)
  u32 global;
  asm("{ .reg .pred g; isspacep.global g, %1; selp.u32 %0, 1, 0, g; }" : "=r"(global) : "l"(p));
  return global != 0;
#else
  (void)p;
  return true;
#endif
}

#if defined(__CUDA_ARCH__)
/// A load through the read-only data path (`ld.global.nc`); `p` must be global memory.
ACCORD_DEVICE_INLINE u64 load_nc(const u64* p) {
  u64 v;
  asm("ld.global.nc.u64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}
ACCORD_DEVICE_INLINE u32 load_nc(const u32* p) {
  u32 v;
  asm("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
#endif

/// A word (u32 or u64) of the device table, its rings, its windows or its peer arrays. None of
/// them changes once built (registering a window builds a new table; the signal slots, bases,
/// counters and the barrier epoch they point to are other memory), so they are read through the
/// read-only data path (`ld.global.nc`). Why: an acquire at system scope (every wait's
/// confirmation, a put_direct's fence) invalidates the L1, and the plain loads of put_direct's
/// targets after it were three dependent L2 round trips in front of the first store of every
/// ping-pong turn. A table copied into shared or local memory (a kernel may copy the struct it
/// was given) is read with plain loads: the read-only path is for global memory only.
/// ACCORD_DEVICE_TABLE_PLAIN_LOADS turns this off (the bench's before/after).
template <class T>
ACCORD_DEVICE_INLINE T table_word(const T& field) {
#if defined(__CUDA_ARCH__) && !defined(ACCORD_DEVICE_TABLE_PLAIN_LOADS)
  return in_global(&field) ? load_nc(&field) : field;
#else
  return field;
#endif
}

/// Acquire fence at system scope: after a relaxed (volatile) load saw another agent's release
/// (the proxy's, through a host word), the reads that follow see everything written before it.
/// Where the observed word can simply be loaded again, an acquire load is cheaper (wait_signal).
ACCORD_DEVICE_INLINE void fence_acquire_sys() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("fence.acq_rel.sys;" ::: "memory");
#else
  __threadfence_system();
#endif
}

/// Nanoseconds of the GPU's global timer (the clock every timeout here is measured with).
ACCORD_DEVICE_INLINE u64 now_ns() {
#if defined(ACCORD_DEVICE_EMULATION)
  return accord_emulation_now_ns();  // the host emulation of the header's tests
#else
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}

ACCORD_DEVICE_INLINE void pause() {
#if defined(ACCORD_DEVICE_EMULATION)
  accord_emulation_pause();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  __nanosleep(64);
#endif
}

/// Sleeps about `ns` nanoseconds (at most about 1 ms on the GPU; a yield in the emulation).
ACCORD_DEVICE_INLINE void sleep_for(u32 ns) {
#if defined(ACCORD_DEVICE_EMULATION)
  (void)ns;
  accord_emulation_pause();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  __nanosleep(ns);
#else
  (void)ns;
#endif
}

/// This thread's index within its block, all three dimensions flattened.
ACCORD_DEVICE_INLINE u32 thread_in_block() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

ACCORD_DEVICE_INLINE const RingDevice* ring_at(const DeviceTable* t, u32 ring) {
  return reinterpret_cast<const RingDevice*>(table_word(t->rings)) + ring;
}

ACCORD_DEVICE_INLINE const RingControl* control_of(const RingDevice* r) {
  return reinterpret_cast<const RingControl*>(table_word(r->control));
}

ACCORD_DEVICE_INLINE const WindowEntry* window_at(const DeviceTable* t, u32 window) {
  return reinterpret_cast<const WindowEntry*>(table_word(t->windows)) + window;
}

/// Whether any ring reports a refused or failed descriptor.
ACCORD_DEVICE_INLINE bool proxy_failed(const DeviceTable* t) {
  for (u32 r = 0; r < table_word(t->ring_count); ++r) {
    if (load_acquire_sys(&control_of(ring_at(t, r))->error) != 0) return true;
  }
  return false;
}

/// `offset + bytes <= limit` without overflow.
ACCORD_DEVICE_INLINE bool fits(u64 offset, u64 bytes, u64 limit) { return bytes <= limit && offset <= limit - bytes; }

/// The ring a descriptor goes to: `ring`, or `blockIdx.x % ring_count` for RING_AUTO.
ACCORD_DEVICE_INLINE bool pick_ring(const DeviceTable* t, u32 ring, u32* out) {
  if (table_word(t->ring_count) == 0) return false;
  if (ring == RING_AUTO) ring = blockIdx.x % table_word(t->ring_count);
  if (ring >= table_word(t->ring_count)) return false;
  *out = ring;
  return true;
}

/// Waits until the slot of `ticket` is free: `ticket < consumed + slot_count`, refreshing the
/// producers' cached copy of `consumed` only when the ring looks full. TIMEOUT after
/// ACCORD_DEVICE_RING_WAIT_NS; the ticket is then never published, so that ring stays wedged:
/// treat it as fatal.
ACCORD_DEVICE_INLINE Status wait_for_slot(const RingDevice* ring, u64 slot_count, u64 ticket) {
  u64* cached = reinterpret_cast<u64*>(table_word(ring->cached_consumed));
  // Written without the subtraction `ticket - slot_count`, which could wrap.
  if (ticket < load_volatile(cached) + slot_count) return OK;
  // The ring looks full. Waiters reading the proxy's `consumed` (mapped host memory) flood
  // PCIe with reads, and the GPU's own fetches of the proxy's copy work queue behind them:
  // on the 2xH200 host a thousand waiting threads took the descriptor rate from 5.6 down to
  // 0.09-0.12 M puts/s, with or without a sleep between reads. So only the waiters holding
  // the next ACCORD_DEVICE_RING_READERS tickets to be freed read the host word (with a
  // doubling sleep, 64 ns up to about 8 us); the others watch the device-local cached
  // index, which a reader raises as soon as it sees slots freed.
  const u64* consumed_word = &control_of(ring)->consumed;
  const u64 start = now_ns();
  u32 sleep_ns = 64;
  for (;;) {
    const u64 known = load_volatile(cached);
    if (ticket < known + slot_count) break;
    if (ticket - (known + slot_count) < ACCORD_DEVICE_RING_READERS) {
      const u64 consumed = load_acquire_sys(consumed_word);
      if (consumed > known) atomicMax(reinterpret_cast<unsigned long long*>(cached), consumed);
      if (ticket < consumed + slot_count) break;
    }
    if (now_ns() - start > ACCORD_DEVICE_RING_WAIT_NS) return TIMEOUT;
    sleep_for(sleep_ns);
    if (sleep_ns < 8192) sleep_ns *= 2;
  }
  // Slots freed by the proxy are visible before their reuse: the cached index moved only
  // after some thread read `consumed` with acquire semantics.
  fence_acquire_sys();
  return OK;
}

/// The slot of `ticket`.
ACCORD_DEVICE_INLINE Descriptor* slot_of(const RingDevice* ring, u64 slot_count, u64 ticket) {
  return reinterpret_cast<Descriptor*>(table_word(ring->slots)) + (ticket & (slot_count - 1));
}

/// Writes bytes 8..63 of `d` into the slot of `ticket`, as one 8-byte and three 16-byte
/// stores; `seq` (bytes 0..7) is published after.
ACCORD_DEVICE_INLINE void write_body(const RingDevice* ring, u64 slot_count, u64 ticket, const Descriptor& d) {
  u64 body[7];
  pack_body(d, body);
  u64* words = reinterpret_cast<u64*>(slot_of(ring, slot_count, ticket));
  words[1] = body[0];
  reinterpret_cast<ulonglong2*>(words)[1] = make_ulonglong2(body[1], body[2]);
  reinterpret_cast<ulonglong2*>(words)[2] = make_ulonglong2(body[3], body[4]);
  reinterpret_cast<ulonglong2*>(words)[3] = make_ulonglong2(body[5], body[6]);
}

/// The producer protocol (the same as the proxy's HostProducer): take a ticket, wait for its
/// slot to be free (wait_for_slot), fill every field, then publish `seq = ticket + 1` with a
/// release store at system scope.
///
/// A TIMEOUT here means the proxy did not free a slot within ACCORD_DEVICE_RING_WAIT_NS; the
/// ticket taken is then never published, so that ring stays wedged: treat it as fatal.
ACCORD_DEVICE_INLINE Status publish(const DeviceTable* t, u32 ring_index, const Descriptor& d) {
  const RingDevice* ring = ring_at(t, ring_index);
  const u64 slot_count = table_word(ring->slot_count);
  u64* reserved = reinterpret_cast<u64*>(table_word(ring->reserved));
  const u64 ticket = atomicAdd(reinterpret_cast<unsigned long long*>(reserved), 1ull);
  const Status s = wait_for_slot(ring, slot_count, ticket);
  if (s != OK) return s;
  write_body(ring, slot_count, ticket, d);
  // A release store at system scope: the body above, and this thread's earlier writes (to the
  // put's source, say), are visible to the proxy and the copy engine before `seq` is.
  store_release_sys(&slot_of(ring, slot_count, ticket)->seq, ticket + 1);
  return OK;
}

/// Signal `id`'s slots here, one per rank.
ACCORD_DEVICE_INLINE const u64* signal_slots(const DeviceTable* t, u32 id) {
  return reinterpret_cast<const u64*>(table_word(t->signals)) + u64(id) * table_word(t->world);
}

/// Sum over ranks of signal `id`'s slots, with acquire loads.
ACCORD_DEVICE_INLINE u64 signal_sum(const DeviceTable* t, u32 id) {
  const u64* slots = signal_slots(t, id);
  u64 sum = 0;
  for (u32 r = 0; r < table_word(t->world); ++r) sum += load_acquire_sys(slots + r);
  return sum;
}

/// signal_sum with relaxed (volatile) loads: for spinning; confirm a hit with signal_sum.
ACCORD_DEVICE_INLINE u64 signal_sum_relaxed(const DeviceTable* t, u32 id) {
  const u64* slots = signal_slots(t, id);
  u64 sum = 0;
  for (u32 r = 0; r < table_word(t->world); ++r) sum += load_volatile(slots + r);
  return sum;
}

ACCORD_DEVICE_INLINE bool user_signal(const DeviceTable* t, u32 id) {
  return table_word(t->signal_count) >= 1 && id < table_word(t->signal_count) - 1;
}

/// Whether a signal action and a counter action are well formed for `t` (NO_COUNTER: none).
ACCORD_DEVICE_INLINE bool actions_ok(const DeviceTable* t, u8 signal_op, u32 signal_id, u32 counter_id) {
  if (signal_op != SIGNAL_NONE && (!user_signal(t, signal_id) || signal_op > SIGNAL_SET)) return false;
  return counter_id == NO_COUNTER || counter_id < table_word(t->counter_count);
}

/// Writes a put's signal and counter actions into `d` (checked by actions_ok).
ACCORD_DEVICE_INLINE void set_actions(Descriptor* d, u8 signal_op, u32 signal_id, u64 signal_value, u32 counter_id) {
  d->signal_op = signal_op;
  d->flags = counter_id == NO_COUNTER ? 0 : FLAG_COUNTER;
  d->signal_id = signal_op == SIGNAL_NONE ? 0 : signal_id;
  d->counter_id = counter_id == NO_COUNTER ? 0 : counter_id;
  d->signal_value = signal_value;
}

ACCORD_DEVICE_INLINE Status signal_any(const DeviceTable* t, u32 peer, u32 id, u8 op, u64 value, u32 ring) {
  u32 r;
  if (peer >= table_word(t->world) || id >= table_word(t->signal_count) || (op != SIGNAL_ADD && op != SIGNAL_SET) ||
      !pick_ring(t, ring, &r)) {
    return BAD_ARGUMENT;
  }
  Descriptor d = {};
  d.op = OP_SIGNAL;
  d.signal_op = op;
  d.peer = peer;
  d.signal_id = id;
  d.signal_value = value;
  return publish(t, r, d);
}

/// Runs `issue` on lane 0 of a converged warp after `__syncwarp()`, and gives every lane its
/// Status.
template <class F>
ACCORD_DEVICE_INLINE Status on_lane0(F issue) {
  __syncwarp();
  int s = OK;
  if ((thread_in_block() & 31u) == 0) s = issue();
  return static_cast<Status>(__shfl_sync(0xffffffffu, s, 0));
}

/// Runs `issue` on thread 0 of the block after `__syncthreads()`, and gives every thread its
/// Status.
template <class F>
ACCORD_DEVICE_INLINE Status on_thread0(F issue) {
  __shared__ int status;
  __syncthreads();
  if (thread_in_block() == 0) status = issue();
  __syncthreads();
  const Status s = static_cast<Status>(status);
  __syncthreads();
  return s;
}

/// Copies `bytes` from `src` to `dst` with thread `lane` of `lanes`: 16-byte vector stores when
/// both ends and the length allow, else 8-byte, else single bytes.
ACCORD_DEVICE_INLINE void copy_strided(void* dst, const void* src, u64 bytes, u32 lane, u32 lanes) {
  const u64 a = reinterpret_cast<u64>(dst) | reinterpret_cast<u64>(src) | bytes;
  if ((a & 15) == 0) {
    uint4* d = reinterpret_cast<uint4*>(dst);
    const uint4* s = reinterpret_cast<const uint4*>(src);
    for (u64 i = lane; i < bytes / 16; i += lanes) d[i] = s[i];
  } else if ((a & 7) == 0) {
    u64* d = reinterpret_cast<u64*>(dst);
    const u64* s = reinterpret_cast<const u64*>(src);
    for (u64 i = lane; i < bytes / 8; i += lanes) d[i] = s[i];
  } else {
    u8* d = reinterpret_cast<u8*>(dst);
    const u8* s = reinterpret_cast<const u8*>(src);
    for (u64 i = lane; i < bytes; i += lanes) d[i] = s[i];
  }
}

/// `peer`'s window `window` and signal slots as this rank's stores reach them; BAD_ARGUMENT
/// only for a window or peer out of range (an unmapped peer comes back with null pointers).
ACCORD_DEVICE_INLINE Status resolve_direct(const DeviceTable* t, u32 window, u32 peer, DirectPeer* out) {
  if (window >= table_word(t->window_count) || peer >= table_word(t->world)) return BAD_ARGUMENT;
  const WindowEntry* w = window_at(t, window);
  const u64 bases = table_word(w->peer_bases);
  const u64 base = bases == 0 ? 0 : table_word(reinterpret_cast<const u64*>(bases)[peer]);
  const u64 peer_signals = table_word(t->peer_signals);
  const u64 slots = peer_signals == 0 ? 0 : table_word(reinterpret_cast<const u64*>(peer_signals)[peer]);
  out->window = reinterpret_cast<u8*>(base);
  out->window_bytes = table_word(w->bytes);
  out->world = table_word(t->world);
  out->signal_slots = slots == 0 ? nullptr : reinterpret_cast<u64*>(slots) + table_word(t->rank);
  const u32 signals = table_word(t->signal_count);
  out->user_signals = signals == 0 ? 0 : signals - 1;
  return OK;
}

/// Where put_direct writes through a resolved peer: the bytes' destination, and the signal's
/// slot (null when no signal is asked), or NOT_DIRECT / BAD_ARGUMENT.
ACCORD_DEVICE_INLINE Status direct_targets_of(const DirectPeer& p, u64 dst_offset, u64 bytes, u8 signal_op,
                                              u32 signal_id, u8** dst, u64** signal_slot) {
  if (!fits(dst_offset, bytes, p.window_bytes)) return BAD_ARGUMENT;
  if (signal_op != SIGNAL_NONE &&
      (signal_id >= p.user_signals || (signal_op != SIGNAL_ADD && signal_op != SIGNAL_SET))) {
    return BAD_ARGUMENT;
  }
  if (p.window == nullptr) return NOT_DIRECT;
  *signal_slot = nullptr;
  if (signal_op != SIGNAL_NONE) {
    if (p.signal_slots == nullptr) return NOT_DIRECT;
    *signal_slot = p.signal_slots + u64(signal_id) * p.world;
  }
  *dst = p.window + dst_offset;
  return OK;
}

/// Where put_direct writes: the peer's window mapped here, and its signal slot (null when no
/// signal is asked), or NOT_DIRECT / BAD_ARGUMENT.
ACCORD_DEVICE_INLINE Status direct_targets(const DeviceTable* t, u32 window, u32 peer, u64 dst_offset, u64 bytes,
                                           u8 signal_op, u32 signal_id, u8** dst, u64** signal_slot) {
  DirectPeer p;
  const Status s = resolve_direct(t, window, peer, &p);
  if (s != OK) return s;
  return direct_targets_of(p, dst_offset, bytes, signal_op, signal_id, dst, signal_slot);
}

ACCORD_DEVICE_INLINE void direct_signal(u64* slot, u8 signal_op, u64 value) {
  if (slot == nullptr) return;
  if (signal_op == SIGNAL_ADD) {
    add_release_sys(slot, value);
  } else {
    store_release_sys(slot, value);
  }
}

/// What one wait_signal call waits for.
struct SignalWait {
  const u64* slots;  ///< the signal's slots here, one per rank
  u64 base;          ///< the sum at the last reset (read once)
  u64 at_least;
  u64 start;         ///< %globaltimer at the call
  u64 timeout_ns;
};

/// The periodic checks of a wait's poll loop: TIMEOUT past the deadline, PROXY_ERROR once a
/// ring reports one (its error words are mapped host memory, each look a PCIe read of about a
/// microsecond, so they are read once every 4096 polls, the clock every 64); OK to go on.
ACCORD_DEVICE_INLINE Status wait_checks(const DeviceTable* t, const SignalWait& w, u32 polls) {
  if ((polls & 63u) != 63u) return OK;
  if ((polls & 4095u) == 4095u && proxy_failed(t)) return PROXY_ERROR;
  if (now_ns() - w.start > w.timeout_ns) return TIMEOUT;
  if (polls > 4096) pause();
  return OK;
}

/// `sum` less the signal's base, 0 where a SIGNAL_SET lowered the sum below it.
ACCORD_DEVICE_INLINE u64 above_base(u64 sum, u64 base) { return sum >= base ? sum - base : 0; }

/// The poll loop of a wait: `relaxed_sum()` each poll; once it reaches the target,
/// `confirmed_sum()` (acquire loads) decides; the periodic checks (wait_checks) end it with
/// their status. The value reached goes to `*reached` when given.
template <class Relaxed, class Confirmed>
ACCORD_DEVICE_INLINE Status wait_loop(const DeviceTable* t, const SignalWait& w, u64* reached, Relaxed relaxed_sum,
                                      Confirmed confirmed_sum) {
  for (u32 polls = 0;; ++polls) {
    const u64 value = above_base(relaxed_sum(), w.base);
    if (value >= w.at_least) {
      const u64 confirmed = above_base(confirmed_sum(), w.base);
      if (confirmed >= w.at_least) {
        if (reached != nullptr) *reached = confirmed;
        return OK;
      }
    }
    const Status s = wait_checks(t, w, polls);
    if (s != OK) {
      if (reached != nullptr) *reached = value;
      return s;
    }
  }
}

/// wait_signal for a world of N ranks (N <= 8). Each poll issues its N relaxed loads back to
/// back and only then sums them: a loop over a runtime count added each value before loading
/// the next, so every poll was N dependent round trips to L2, and the ping's arrival was seen
/// that much later ("raw>wait" against "floor" in accord-device-bench's ping-pong). The slots
/// are read with acquire at entry (off the critical path: the value is not reached yet), and
/// once it is, only the slots that moved since are loaded again with acquire: one acquire
/// load after a ping instead of one per rank (each a round trip the reply waits behind;
/// "floor+acq"; cheaper than an acquire fence, "floor+fence"). They order this thread's later
/// reads after every contribution counted.
template <u32 N>
ACCORD_DEVICE_INLINE Status wait_tracked(const DeviceTable* t, const SignalWait& w, u64* reached) {
  u64 at_entry[N];
  u64 last[N];
#pragma unroll
  for (u32 r = 0; r < N; ++r) {
    at_entry[r] = load_acquire_sys(w.slots + r);
    last[r] = at_entry[r];
  }
  const auto relaxed_sum = [&]() {
#pragma unroll
    for (u32 r = 0; r < N; ++r) last[r] = load_volatile(w.slots + r);
    u64 sum = 0;
#pragma unroll
    for (u32 r = 0; r < N; ++r) sum += last[r];
    return sum;
  };
  const auto confirmed_sum = [&]() {
    u64 sum = 0;
#pragma unroll
    for (u32 r = 0; r < N; ++r) sum += last[r] == at_entry[r] ? at_entry[r] : load_acquire_sys(w.slots + r);
    return sum;
  };
  return wait_loop(t, w, reached, relaxed_sum, confirmed_sum);
}

/// wait_signal past 8 ranks: every slot is confirmed with acquire, as read_signal does.
ACCORD_DEVICE_INLINE Status wait_untracked(const DeviceTable* t, u32 id, const SignalWait& w, u64* reached) {
  return wait_loop(
      t, w, reached, [&]() { return signal_sum_relaxed(t, id); }, [&]() { return signal_sum(t, id); });
}

}  // namespace detail

// ---- The API ----------------------------------------------------------------------------

/// Whether `table` was built for this header's layout version.
ACCORD_DEVICE_INLINE bool table_ok(const DeviceTable* table) {
  return table != nullptr && detail::table_word(table->layout_version) == ACCORD_DEVICE_LAYOUT_VERSION;
}

/// Signals users may use: ids 0 .. user_signal_count(table) - 1 (the last one is the barrier's).
ACCORD_DEVICE_INLINE u32 user_signal_count(const DeviceTable* table) {
  return detail::table_word(table->signal_count) == 0 ? 0 : detail::table_word(table->signal_count) - 1;
}

/// put (one thread): asks the proxy to copy `bytes` (>= 1) from this rank's window `src_window`
/// at `src_offset` to `peer`'s window `window` at `dst_offset`, then to apply `signal_op`
/// (SIGNAL_NONE, SIGNAL_ADD, SIGNAL_SET) with `signal_value` to the peer's signal `signal_id`, and,
/// unless `counter_id == NO_COUNTER`, to bump this rank's counter `counter_id` once the source
/// is reusable.
///
/// Ordering: this thread's earlier writes (the source) are visible to the copy before it runs;
/// the signal is visible at the peer only after every byte of this put landed. Returning OK means
/// the descriptor is in the ring, not that the bytes moved: use flush (or the counter) before
/// overwriting the source, and the peer's wait_signal before reading the destination.
/// Memory touched: the ring's `reserved`/`cached_consumed` (device), one descriptor slot and,
/// only when the ring looks full, `control.consumed` (mapped host); the window table (read).
/// An 8-byte put with 8-byte aligned ends from a window in this GPU's own memory
/// (`readable_windows`) reads its source word here, when called (so its source may be reused
/// as soon as it returns), and travels inline, as a put_value (ACCORD_DEVICE_PUT_INLINE); its
/// counter still bumps once the proxy ran it. Memory touched then also: that source word.
/// `ring`: RING_AUTO (blockIdx.x % ring_count) or an explicit ring index.
ACCORD_DEVICE_INLINE Status put(const DeviceTable* table, u32 window, u32 peer, u64 dst_offset, u32 src_window,
                                u64 src_offset, u64 bytes, u8 signal_op = SIGNAL_NONE, u32 signal_id = 0,
                                u64 signal_value = 0, u32 counter_id = NO_COUNTER, u32 ring = RING_AUTO) {
  u32 r;
  const u32 windows = detail::table_word(table->window_count);
  if (bytes == 0 || peer >= detail::table_word(table->world) || window >= windows || src_window >= windows ||
      !detail::pick_ring(table, ring, &r)) {
    return BAD_ARGUMENT;
  }
  if (!detail::fits(dst_offset, bytes, detail::table_word(detail::window_at(table, window)->bytes)) ||
      !detail::fits(src_offset, bytes, detail::table_word(detail::window_at(table, src_window)->bytes))) {
    return BAD_ARGUMENT;
  }
  if (!detail::actions_ok(table, signal_op, signal_id, counter_id)) return BAD_ARGUMENT;
  Descriptor d = {};
  d.op = OP_PUT;
  d.peer = peer;
  d.window = window;
  d.src_window = src_window;
  d.dst_offset = dst_offset;
  d.src_offset = src_offset;
  d.bytes = bytes;
#if ACCORD_DEVICE_PUT_INLINE
  const u64 src = detail::table_word(detail::window_at(table, src_window)->local_base) + src_offset;
  const u32 readable = src_window < 32 ? (detail::table_word(table->readable_windows) >> src_window) & 1u : 0u;
  if (bytes == 8 && readable != 0 && ((src | dst_offset) & 7) == 0) {
    // Sent as put_value: alone in the proxy's batch, the word is stored with a stream write
    // instead of a copy-engine copy of 8 bytes (one driver call and the copy's start-up fewer).
    d.op = OP_PUT_VALUE;
    d.src_window = 0;
    d.src_offset = detail::load_volatile(reinterpret_cast<const u64*>(src));
  }
#endif
  detail::set_actions(&d, signal_op, signal_id, signal_value, counter_id);
  return detail::publish(table, r, d);
}

/// put_value (one thread): asks the proxy to write the `bytes` (1..=8) low bytes of `value`
/// (little-endian) to `peer`'s window `window` at `dst_offset`, with the same signal and counter
/// actions and the same ordering as put. The value travels inside the descriptor, so there is
/// no source to keep alive. Memory touched: as put.
ACCORD_DEVICE_INLINE Status put_value(const DeviceTable* table, u32 window, u32 peer, u64 dst_offset, u64 value,
                                      u32 bytes = 8, u8 signal_op = SIGNAL_NONE, u32 signal_id = 0,
                                      u64 signal_value = 0, u32 counter_id = NO_COUNTER, u32 ring = RING_AUTO) {
  u32 r;
  if (bytes == 0 || bytes > 8 || peer >= detail::table_word(table->world) ||
      window >= detail::table_word(table->window_count) || !detail::pick_ring(table, ring, &r) ||
      !detail::fits(dst_offset, bytes, detail::table_word(detail::window_at(table, window)->bytes))) {
    return BAD_ARGUMENT;
  }
  if (!detail::actions_ok(table, signal_op, signal_id, counter_id)) return BAD_ARGUMENT;
  Descriptor d = {};
  d.op = OP_PUT_VALUE;
  d.peer = peer;
  d.window = window;
  d.dst_offset = dst_offset;
  d.src_offset = value;
  d.bytes = bytes;
  detail::set_actions(&d, signal_op, signal_id, signal_value, counter_id);
  return detail::publish(table, r, d);
}

/// signal (one thread): asks the proxy to add `value` to (SIGNAL_ADD), or set to `value`
/// (SIGNAL_SET), this rank's contribution to `peer`'s signal `id`. No data moves. It is not
/// ordered after this rank's earlier puts (only a put's own signal is): flush first when the
/// peer must see them. Memory touched: as put.
ACCORD_DEVICE_INLINE Status signal(const DeviceTable* table, u32 peer, u32 id, u8 op, u64 value,
                                   u32 ring = RING_AUTO) {
  if (!detail::user_signal(table, id)) return BAD_ARGUMENT;
  return detail::signal_any(table, peer, id, op, value, ring);
}

/// read_signal (any thread): signal `id`'s value here, the sum over ranks of their
/// contributions minus the sum at the last reset_signal (0 if a SIGNAL_SET lowered it below
/// that). Acquire loads: writes that landed before the signal are visible after it.
/// Memory touched: `signals[id][*]` and `signal_bases[id]` (device memory).
ACCORD_DEVICE_INLINE u64 read_signal(const DeviceTable* table, u32 id) {
  if (!detail::user_signal(table, id)) return 0;
  const u64 base = detail::load_volatile(reinterpret_cast<const u64*>(detail::table_word(table->signal_bases)) + id);
  return detail::above_base(detail::signal_sum(table, id), base);
}

/// reset_signal (one thread): makes read_signal(id) read 0 from here on by recording the
/// current sum in `signal_bases[id]`. Device-local: no remote traffic. Call it only when no
/// other thread waits on `id`, and only once the contributions to reset have arrived.
ACCORD_DEVICE_INLINE Status reset_signal(const DeviceTable* table, u32 id) {
  if (!detail::user_signal(table, id)) return BAD_ARGUMENT;
  u64* base = reinterpret_cast<u64*>(detail::table_word(table->signal_bases)) + id;
  *reinterpret_cast<volatile u64*>(base) = detail::signal_sum(table, id);
  __threadfence();
  return OK;
}

/// wait_signal (any thread): waits until read_signal(id) >= at_least. OK when reached (the
/// value reached goes to `*reached` when given); TIMEOUT after `timeout_ns` of %globaltimer;
/// PROXY_ERROR as soon as some ring's `control.error` is set and the value is not reached.
/// Acquire: every byte of a put whose signal made the value reach `at_least` is visible after.
/// (A slot found back at its value at entry is not loaded again: a SIGNAL_SET that moved a slot
/// away and back to that same value during the wait is not acquired. The proxy's running values
/// only grow; only user SETs of a repeated value meet this.)
/// Memory touched: the signal slots (device), the signal's base (device, read once), every
/// ring's `control.error` (mapped host, read once every 4096 polls).
ACCORD_DEVICE_INLINE Status wait_signal(const DeviceTable* table, u32 id, u64 at_least, u64 timeout_ns,
                                        u64* reached = nullptr) {
  if (!detail::user_signal(table, id)) return BAD_ARGUMENT;
  const u64 start = detail::now_ns();
  // The base is read once: it changes only by reset_signal, which must not run while a thread
  // waits on the signal. It lives in device memory; in mapped host memory its read (a PCIe
  // round trip, about 2 us on the 2xH200 host) stood in front of the first poll.
  const u64* bases = reinterpret_cast<const u64*>(detail::table_word(table->signal_bases));
  const detail::SignalWait w{detail::signal_slots(table, id), detail::load_volatile(bases + id), at_least, start,
                             timeout_ns};
  switch (detail::table_word(table->world)) {
    case 1: return detail::wait_tracked<1>(table, w, reached);
    case 2: return detail::wait_tracked<2>(table, w, reached);
    case 3: return detail::wait_tracked<3>(table, w, reached);
    case 4: return detail::wait_tracked<4>(table, w, reached);
    case 5: return detail::wait_tracked<5>(table, w, reached);
    case 6: return detail::wait_tracked<6>(table, w, reached);
    case 7: return detail::wait_tracked<7>(table, w, reached);
    case 8: return detail::wait_tracked<8>(table, w, reached);
    default: return detail::wait_untracked(table, id, w, reached);
  }
}

/// read_counter (any thread): this rank's counter `id` (bumped by the proxy once per put issued
/// with that counter, when its source became reusable). Memory: `counters[id]` (mapped host).
ACCORD_DEVICE_INLINE u64 read_counter(const DeviceTable* table, u32 id) {
  if (id >= detail::table_word(table->counter_count)) return 0;
  return detail::load_acquire_sys(reinterpret_cast<const u64*>(detail::table_word(table->counters)) + id);
}

/// wait_counter (any thread): waits until read_counter(id) >= at_least; statuses as wait_signal.
ACCORD_DEVICE_INLINE Status wait_counter(const DeviceTable* table, u32 id, u64 at_least, u64 timeout_ns) {
  if (id >= detail::table_word(table->counter_count)) return BAD_ARGUMENT;
  const u64 start = detail::now_ns();
  for (u32 polls = 0;; ++polls) {
    if (read_counter(table, id) >= at_least) return OK;
    if ((polls & 15u) == 15u) {
      if (detail::proxy_failed(table)) return PROXY_ERROR;
      if (detail::now_ns() - start > timeout_ns) return TIMEOUT;
      detail::pause();
    }
  }
}

/// flush (one thread): waits until, on every ring, `control.completed` reaches the ticket count
/// (`reserved`) read when the flush reached that ring: every put issued before the call (by any
/// thread whose ticket was taken) has its source reusable, and has completed at this end.
/// OK, TIMEOUT (bounded by `timeout_ns` in all), or PROXY_ERROR when done but some descriptor
/// was refused or failed. Memory: `reserved` (device), `control.completed` and `control.error`
/// (mapped host).
ACCORD_DEVICE_INLINE Status flush(const DeviceTable* table, u64 timeout_ns) {
  const u64 start = detail::now_ns();
  for (u32 r = 0; r < detail::table_word(table->ring_count); ++r) {
    const RingDevice* ring = detail::ring_at(table, r);
    const u64 target = atomicAdd(reinterpret_cast<unsigned long long*>(detail::table_word(ring->reserved)), 0ull);
    const u64* completed = &detail::control_of(ring)->completed;
    while (detail::load_acquire_sys(completed) < target) {
      if (detail::now_ns() - start > timeout_ns) return TIMEOUT;
      detail::pause();
    }
  }
  return detail::proxy_failed(table) ? PROXY_ERROR : OK;
}

/// barrier (one thread per rank, every rank): flushes (so every earlier put of this rank has
/// landed), bumps `*barrier_epoch`, signals every other rank on the reserved last signal
/// (SIGNAL_ADD 1), then waits until every other rank's slot of that signal here reached the
/// epoch. Bounded by `timeout_ns` from the call in all (plus, only if a ring is full, each
/// signal's ring wait, ACCORD_DEVICE_RING_WAIT_NS). After a TIMEOUT or PROXY_ERROR the epochs of the
/// ranks may disagree: do not call barrier again on that table.
/// Memory: as flush and signal, plus `barrier_epoch` and the barrier's signal slots (device).
ACCORD_DEVICE_INLINE Status barrier(const DeviceTable* table, u64 timeout_ns) {
  if (detail::table_word(table->signal_count) == 0) return BAD_ARGUMENT;
  const u64 start = detail::now_ns();
  Status s = flush(table, timeout_ns);
  if (s != OK) return s;
  const u32 id = detail::table_word(table->signal_count) - 1;
  volatile u64* epoch_word = reinterpret_cast<volatile u64*>(detail::table_word(table->barrier_epoch));
  const u64 epoch = *epoch_word + 1;
  *epoch_word = epoch;
  for (u32 p = 0; p < detail::table_word(table->world); ++p) {
    if (p == detail::table_word(table->rank)) continue;
    s = detail::signal_any(table, p, id, SIGNAL_ADD, 1, RING_AUTO);
    if (s != OK) return s;
  }
  const u64* slots = detail::signal_slots(table, id);
  for (u32 p = 0; p < detail::table_word(table->world); ++p) {
    if (p == detail::table_word(table->rank)) continue;
    for (u32 polls = 0; detail::load_acquire_sys(slots + p) < epoch; ++polls) {
      if ((polls & 63u) == 63u) {
        if (detail::proxy_failed(table)) return PROXY_ERROR;
        if (detail::now_ns() - start > timeout_ns) return TIMEOUT;
      }
    }
  }
  return OK;
}

// ---- Warp and block variants ----------------------------------------------------------------
// `_warp`: every lane of a converged warp calls it with the same arguments; after __syncwarp()
// (so every lane's earlier writes are ordered before the issue) lane 0 issues, and every lane
// gets the Status. `_block`: every thread of the block calls it; after __syncthreads() thread 0
// issues, and every thread gets the Status. The issuing thread's __threadfence_system() is
// cumulative: the other threads' writes it observed through the barrier are visible first.

/// put, issued once by lane 0 of a converged warp.
ACCORD_DEVICE_INLINE Status put_warp(const DeviceTable* table, u32 window, u32 peer, u64 dst_offset, u32 src_window,
                                     u64 src_offset, u64 bytes, u8 signal_op = SIGNAL_NONE, u32 signal_id = 0,
                                     u64 signal_value = 0, u32 counter_id = NO_COUNTER, u32 ring = RING_AUTO) {
  return detail::on_lane0([&]() {
    return put(table, window, peer, dst_offset, src_window, src_offset, bytes, signal_op, signal_id, signal_value,
               counter_id, ring);
  });
}

/// put, issued once by thread 0 of the block.
ACCORD_DEVICE_INLINE Status put_block(const DeviceTable* table, u32 window, u32 peer, u64 dst_offset,
                                      u32 src_window, u64 src_offset, u64 bytes, u8 signal_op = SIGNAL_NONE,
                                      u32 signal_id = 0, u64 signal_value = 0, u32 counter_id = NO_COUNTER,
                                      u32 ring = RING_AUTO) {
  return detail::on_thread0([&]() {
    return put(table, window, peer, dst_offset, src_window, src_offset, bytes, signal_op, signal_id, signal_value,
               counter_id, ring);
  });
}

/// put_value, issued once by lane 0 of a converged warp.
ACCORD_DEVICE_INLINE Status put_value_warp(const DeviceTable* table, u32 window, u32 peer, u64 dst_offset,
                                           u64 value, u32 bytes = 8, u8 signal_op = SIGNAL_NONE,
                                           u32 signal_id = 0, u64 signal_value = 0, u32 counter_id = NO_COUNTER,
                                           u32 ring = RING_AUTO) {
  return detail::on_lane0([&]() {
    return put_value(table, window, peer, dst_offset, value, bytes, signal_op, signal_id, signal_value, counter_id,
                     ring);
  });
}

/// put_value, issued once by thread 0 of the block.
ACCORD_DEVICE_INLINE Status put_value_block(const DeviceTable* table, u32 window, u32 peer, u64 dst_offset,
                                            u64 value, u32 bytes = 8, u8 signal_op = SIGNAL_NONE,
                                            u32 signal_id = 0, u64 signal_value = 0, u32 counter_id = NO_COUNTER,
                                            u32 ring = RING_AUTO) {
  return detail::on_thread0([&]() {
    return put_value(table, window, peer, dst_offset, value, bytes, signal_op, signal_id, signal_value, counter_id,
                     ring);
  });
}

/// signal, issued once by lane 0 of a converged warp.
ACCORD_DEVICE_INLINE Status signal_warp(const DeviceTable* table, u32 peer, u32 id, u8 op, u64 value,
                                        u32 ring = RING_AUTO) {
  return detail::on_lane0([&]() { return signal(table, peer, id, op, value, ring); });
}

/// signal, issued once by thread 0 of the block.
ACCORD_DEVICE_INLINE Status signal_block(const DeviceTable* table, u32 peer, u32 id, u8 op, u64 value,
                                         u32 ring = RING_AUTO) {
  return detail::on_thread0([&]() { return signal(table, peer, id, op, value, ring); });
}

// ---- Direct stores (the load/store path) ---------------------------------------------------
// When the host mapped `peer`'s window into this process (`WindowEntry::peer_bases[peer] != 0`,
// same-host GPUs with peer access), small puts can skip the proxy: the calling threads store the
// bytes themselves, fence at system scope, then update the peer's signal slot through
// `DeviceTable::peer_signals[peer]` with a release atomic (add) or release store (set).
// Rule: a signal id is driven either through the proxy or directly, never both, because the
// proxy owns the running value of the slots it writes and would overwrite a direct update.
// These use SMs for the bytes; the proxy path uses none.

/// direct_peer (any thread): resolves `peer`'s window `window` for put_direct once, so a loop
/// of put_direct calls to that peer reads no table (`ping-pong` mode put_direct(peer) of
/// accord-device-bench measures the difference). OK; NOT_DIRECT when the window is not mapped
/// here; BAD_ARGUMENT for a window or peer out of range. Memory: the window table (read).
ACCORD_DEVICE_INLINE Status direct_peer(const DeviceTable* table, u32 window, u32 peer, DirectPeer* out) {
  const Status s = detail::resolve_direct(table, window, peer, out);
  if (s != OK) return s;
  return out->window == nullptr ? NOT_DIRECT : OK;
}

/// put_direct (one thread) through a peer resolved by direct_peer: the same stores, ordering
/// and statuses as put_direct with a table (NOT_DIRECT when a signal is asked and the peer's
/// slots are not mapped here).
ACCORD_DEVICE_INLINE Status put_direct(const DirectPeer& to, u64 dst_offset, const void* src, u64 bytes,
                                       u8 signal_op = SIGNAL_NONE, u32 signal_id = 0, u64 signal_value = 0) {
  u8* dst;
  u64* slot;
  const Status s = detail::direct_targets_of(to, dst_offset, bytes, signal_op, signal_id, &dst, &slot);
  if (s != OK) return s;
  detail::copy_strided(dst, src, bytes, 0, 1);
  // The signal's release (store or reduction at system scope) orders the stores above before
  // it; without a signal, the fence makes the bytes visible before this returns.
  if (slot == nullptr) __threadfence_system();
  detail::direct_signal(slot, signal_op, signal_value);
  return OK;
}

/// put_direct (one thread): stores `bytes` from `src` (any memory this thread can read) into
/// `peer`'s window `window` at `dst_offset`, then applies the signal action directly. OK;
/// NOT_DIRECT when the peer's window or signal slots are not mapped here (nothing written); or
/// BAD_ARGUMENT. Ordering: the bytes are visible to the peer before its signal slot changes.
/// Memory: the window table, the peer's window and signal slot (peer device memory).
/// Signal through one path per (peer, signal): put_direct's signal and the proxy's (put,
/// put_value, signal) both write this rank's slot at the peer, and the proxy sets it to its own
/// running value, which would hide earlier direct adds (the peer's wait then ends in TIMEOUT).
ACCORD_DEVICE_INLINE Status put_direct(const DeviceTable* table, u32 window, u32 peer, u64 dst_offset,
                                       const void* src, u64 bytes, u8 signal_op = SIGNAL_NONE, u32 signal_id = 0,
                                       u64 signal_value = 0) {
  DirectPeer p;
  const Status s = detail::resolve_direct(table, window, peer, &p);
  if (s != OK) return s;
  return put_direct(p, dst_offset, src, bytes, signal_op, signal_id, signal_value);
}

/// put_direct by a converged warp: the lanes share the stores (16 bytes a lane a step where
/// aligned), each fences, then lane 0 applies the signal. Every lane gets the Status.
ACCORD_DEVICE_INLINE Status put_direct_warp(const DeviceTable* table, u32 window, u32 peer, u64 dst_offset,
                                            const void* src, u64 bytes, u8 signal_op = SIGNAL_NONE,
                                            u32 signal_id = 0, u64 signal_value = 0) {
  u8* dst;
  u64* slot;
  const Status s =
      detail::direct_targets(table, window, peer, dst_offset, bytes, signal_op, signal_id, &dst, &slot);
  if (s != OK) return s;
  const u32 lane = detail::thread_in_block() & 31u;
  detail::copy_strided(dst, src, bytes, lane, 32);
  __threadfence_system();
  __syncwarp();
  if (lane == 0) detail::direct_signal(slot, signal_op, signal_value);
  __syncwarp();
  return OK;
}

/// put_direct by a whole block: the threads share the stores, each fences, then thread 0
/// applies the signal. Every thread gets the Status.
ACCORD_DEVICE_INLINE Status put_direct_block(const DeviceTable* table, u32 window, u32 peer, u64 dst_offset,
                                             const void* src, u64 bytes, u8 signal_op = SIGNAL_NONE,
                                             u32 signal_id = 0, u64 signal_value = 0) {
  u8* dst;
  u64* slot;
  const Status s =
      detail::direct_targets(table, window, peer, dst_offset, bytes, signal_op, signal_id, &dst, &slot);
  if (s != OK) return s;
  const u32 me = detail::thread_in_block();
  detail::copy_strided(dst, src, bytes, me, blockDim.x * blockDim.y * blockDim.z);
  __threadfence_system();
  __syncthreads();
  if (me == 0) detail::direct_signal(slot, signal_op, signal_value);
  __syncthreads();
  return OK;
}

#endif  // ACCORD_DEVICE_CODE

}  // namespace device
}  // namespace accord

#endif  // ACCORD_DEVICE_CUH
