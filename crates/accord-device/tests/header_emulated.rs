//! The device API's own code (`accord/device.cuh`), run on host threads: the header is compiled
//! by the host C++ compiler with `ACCORD_DEVICE_EMULATION` and a shim of the few CUDA builtins it
//! uses (atomics as `__atomic` builtins, fences as `seq_cst` fences, `%globaltimer` as the steady
//! clock), against a consumer thread that plays the proxy exactly as layout.rs describes it (take
//! slot `next % slot_count` when `seq == next + 1`, then publish `consumed` and `completed` with
//! release stores, apply signals to the slots, bump counters).
//!
//! What this proves: the producer protocol of `put`/`put_value`/`signal` (tickets, back-pressure
//! through a full 8-slot ring with the cached consumer index, every field of every descriptor),
//! the argument checks, and the waits (`wait_signal`, `flush`, `barrier`, `wait_counter`) with
//! their OK / TIMEOUT / PROXY_ERROR outcomes. What it cannot prove: the GPU memory model (system
//! scope fences over PCIe), warp and block variants with real warps, or the direct-store path;
//! those need a GPU (`accord-device-bench`). Skips with a printed reason without a host C++
//! compiler.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The CUDA builtins the header uses, for the host (shared with accord-bench's end-to-end test).
const SHIM: &str = include_str!("../kernels/host_emulation.h");

/// The scenarios: one `ok <name>` line each, or `FAIL <name>: <why>`.
const PROGRAM: &str = r#"
#include <accord/device.cuh>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>
using namespace accord::device;

constexpr u32 SLOTS = 8, WORLD = 2, RANK = 0, SIGNALS = 3, BARRIER = SIGNALS - 1, COUNTERS = 2;
constexpr u64 WINDOW_BYTES = 4096;

struct Env {
  alignas(64) Descriptor slots[SLOTS];
  RingControl control;
  u64 reserved = 0, cached = 0;
  u64 signals[SIGNALS * WORLD] = {};
  u64 bases[SIGNALS] = {};
  u64 counters[COUNTERS] = {};
  u64 epoch = 0;
  unsigned char window0[WINDOW_BYTES], window1[WINDOW_BYTES];
  WindowEntry windows[2];
  RingDevice ring;
  DeviceTable table;
  // The consumer's side.
  std::mutex lock;
  std::vector<Descriptor> seen;
  u64 running[SIGNALS] = {};
  u64 peer_barrier = 0;
  std::atomic<bool> stop{false}, paused{false}, slow{false}, pause_seen{false};

  Env() {
    std::memset(slots, 0, sizeof slots);
    std::memset(&control, 0, sizeof control);
    windows[0] = WindowEntry{(u64)window0, WINDOW_BYTES, 0};
    windows[1] = WindowEntry{(u64)window1, WINDOW_BYTES, 0};
    ring = RingDevice{(u64)slots, (u64)&control, (u64)&reserved, (u64)&cached, SLOTS, 0};
    // Window 1 (the puts' source) counts as this "GPU's" memory, window 0 does not.
    table = DeviceTable{ACCORD_DEVICE_LAYOUT_VERSION, RANK, WORLD, 1, SIGNALS, COUNTERS, 2, 0b10, (u64)&ring,
                        (u64)signals, (u64)bases, (u64)counters, (u64)windows, 0, (u64)&epoch};
  }

  // The proxy, as layout.rs describes it: in ticket order, one slot at a time.
  void consume() {
    u64 next = 0;
    while (!stop.load()) {
      if (paused.load()) {
        pause_seen.store(true);
        std::this_thread::yield();
        continue;
      }
      Descriptor* s = &slots[next % SLOTS];
      if (__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) != next + 1) { std::this_thread::yield(); continue; }
      Descriptor d = *s;
      {
        std::lock_guard<std::mutex> g(lock);
        seen.push_back(d);
      }
      if (d.signal_op != SIGNAL_NONE && d.peer == RANK) {
        running[d.signal_id] = d.signal_op == SIGNAL_ADD ? running[d.signal_id] + d.signal_value : d.signal_value;
        __atomic_store_n(&signals[d.signal_id * WORLD + RANK], running[d.signal_id], __ATOMIC_RELEASE);
      }
      if (d.op == OP_SIGNAL && d.peer == 1 && d.signal_id == BARRIER) {
        // The peer enters the barrier too: its contribution to our barrier slot follows ours.
        __atomic_store_n(&signals[BARRIER * WORLD + 1], ++peer_barrier, __ATOMIC_RELEASE);
      }
      if (d.flags & FLAG_COUNTER) __atomic_fetch_add(&counters[d.counter_id], 1, __ATOMIC_RELEASE);
      __atomic_store_n(&control.completed, next + 1, __ATOMIC_RELEASE);
      __atomic_store_n(&control.consumed, next + 1, __ATOMIC_RELEASE);
      ++next;
      if (slow.load() && next % 16 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  // Stops the consumer and waits (bounded) until it is in its paused branch, so no descriptor
  // put after this returns is taken: setting the flag alone races with a consumer that read it
  // just before and takes the next descriptor anyway (a flake seen once in CI).
  bool pause() {
    pause_seen.store(false);
    paused.store(true);
    const u64 start = accord_emulation_now_ns();
    while (!pause_seen.load()) {
      if (accord_emulation_now_ns() - start > 10000000000ull) return false;
      std::this_thread::yield();
    }
    return true;
  }

  // Waits (bounded) until the consumer took every ticket handed out.
  bool drained() {
    const u64 start = accord_emulation_now_ns();
    while (__atomic_load_n(&control.completed, __ATOMIC_ACQUIRE) != __atomic_load_n(&reserved, __ATOMIC_ACQUIRE)) {
      if (accord_emulation_now_ns() - start > 10000000000ull) return false;
      std::this_thread::yield();
    }
    return true;
  }

  std::vector<Descriptor> take() {
    std::lock_guard<std::mutex> g(lock);
    std::vector<Descriptor> out;
    out.swap(seen);
    return out;
  }
};

static int failures = 0;
static void verdict(const char* name, bool ok, const char* why) {
  if (ok) std::printf("ok %s\n", name);
  else { std::printf("FAIL %s: %s\n", name, why); ++failures; }
}

int main() {
  Env* env = new Env();
  const DeviceTable* t = &env->table;
  std::thread consumer([env] { env->consume(); });

  // 4 producers x 2000 puts through an 8-slot ring the consumer drains slowly: each descriptor
  // arrives once, whole, and each producer's in its program order.
  {
    env->slow = true;
    constexpr u32 PRODUCERS = 4, EACH = 2000;
    std::vector<std::thread> producers;
    std::atomic<int> bad_status{0};
    for (u32 p = 0; p < PRODUCERS; ++p) {
      producers.emplace_back([&, p] {
        for (u32 k = 0; k < EACH; ++k) {
          // 16 bytes: an aligned 8-byte put would travel inline (its own scenario below).
          Status s = put(t, 0, 1, (k * 8) % (WINDOW_BYTES - 8), 1, (p * 8) % (WINDOW_BYTES - 8), 16, SIGNAL_NONE, 0,
                         (u64(p) << 32) | k, p % 2 == 0 ? NO_COUNTER : 1);
          if (s != OK) bad_status++;
        }
      });
    }
    for (auto& th : producers) th.join();
    const bool drained = env->drained();
    env->slow = false;
    std::vector<Descriptor> seen = env->take();
    std::vector<u32> next(PRODUCERS, 0);
    bool fields = true, order = true;
    std::set<u64> tags;
    for (size_t i = 0; i < seen.size(); ++i) {
      const Descriptor& d = seen[i];
      const u32 p = u32(d.signal_value >> 32), k = u32(d.signal_value);
      fields &= d.seq == i + 1 && d.op == OP_PUT && d.peer == 1 && d.window == 0 && d.src_window == 1 &&
                d.bytes == 16 && d.dst_offset == (k * 8) % (WINDOW_BYTES - 8) &&
                d.src_offset == (p * 8) % (WINDOW_BYTES - 8) &&
                d.signal_op == SIGNAL_NONE && d.flags == (p % 2 == 0 ? 0 : FLAG_COUNTER) &&
                d.counter_id == (p % 2 == 0 ? 0u : 1u) && p < PRODUCERS;
      if (p < PRODUCERS) { order &= k == next[p]; next[p] = k + 1; }
      tags.insert(d.signal_value);
    }
    const bool all = seen.size() == PRODUCERS * EACH && tags.size() == PRODUCERS * EACH;
    const bool counted = __atomic_load_n(&env->counters[1], __ATOMIC_ACQUIRE) == 2 * EACH;
    const bool refreshed = env->cached > 0;  // the full ring sent producers to control.consumed
    verdict("producers_share_a_small_ring_and_lose_nothing",
            drained && bad_status == 0 && all && fields && order && counted && refreshed,
            !drained ? "not drained" : bad_status ? "a put failed" : !all ? "descriptors lost or repeated"
            : !fields ? "a field differs" : !order ? "a producer's puts out of order"
            : !counted ? "counter" : "cached_consumed never refreshed");
  }

  // put_value and signal fill their descriptors as layout.rs says.
  {
    Status a = put_value(t, 0, 1, 16, 0x0102030405060708ull, 4, SIGNAL_SET, 1, 77);
    Status b = signal(t, 1, 0, SIGNAL_ADD, 5);
    env->drained();
    std::vector<Descriptor> seen = env->take();
    bool ok = a == OK && b == OK && seen.size() == 2 && seen[0].op == OP_PUT_VALUE && seen[0].bytes == 4 &&
              seen[0].src_offset == 0x0102030405060708ull && seen[0].dst_offset == 16 && seen[0].signal_op == SIGNAL_SET &&
              seen[0].signal_id == 1 && seen[0].signal_value == 77 && seen[1].op == OP_SIGNAL && seen[1].peer == 1 &&
              seen[1].signal_op == SIGNAL_ADD && seen[1].signal_id == 0 && seen[1].signal_value == 5 && seen[1].bytes == 0;
    verdict("put_value_and_signal_fill_their_descriptors", ok, "a field differs");
  }

  // An aligned 8-byte put from a readable window travels inline: a put_value carrying its source
  // word, with its signal and counter actions; an unaligned or a longer one, or one from a
  // window the GPU may not read, stays a copy.
  {
    const u64 word = 0x1122334455667788ull;
    std::memcpy(env->window1 + 24, &word, 8);
    Status a = put(t, 0, 1, 40, 1, 24, 8, SIGNAL_ADD, 1, 3, 1);
    Status b = put(t, 0, 1, 44, 1, 24, 8);
    Status c = put(t, 0, 1, 40, 1, 24, 16);
    Status d = put(t, 1, 1, 40, 0, 24, 8);  // from window 0, not readable here: a copy
    env->drained();
    std::vector<Descriptor> seen = env->take();
    bool ok = a == OK && b == OK && c == OK && d == OK && seen.size() == 4 && seen[3].op == OP_PUT &&
              seen[3].src_window == 0 && seen[0].op == OP_PUT_VALUE &&
              seen[0].src_offset == word && seen[0].bytes == 8 && seen[0].dst_offset == 40 &&
              seen[0].signal_op == SIGNAL_ADD && seen[0].signal_id == 1 && seen[0].signal_value == 3 &&
              seen[0].flags == FLAG_COUNTER && seen[0].counter_id == 1 && seen[1].op == OP_PUT &&
              seen[1].dst_offset == 44 && seen[2].op == OP_PUT && seen[2].bytes == 16 && seen[2].src_offset == 24;
    verdict("an_aligned_8_byte_put_travels_inline", ok, "a field differs");
  }

  // Bad arguments come back BAD_ARGUMENT without taking a ticket.
  {
    const u64 before = env->reserved;
    Status got[] = {
        put(t, 0, WORLD, 0, 1, 0, 8), put(t, 2, 0, 0, 1, 0, 8), put(t, 0, 0, 0, 2, 0, 8),
        put(t, 0, 0, WINDOW_BYTES - 4, 1, 0, 8), put(t, 0, 0, 0, 1, WINDOW_BYTES, 1), put(t, 0, 0, ~0ull - 2, 1, 0, 8),
        put(t, 0, 0, 0, 1, 0, 0), put(t, 0, 0, 0, 1, 0, 8, 3, 0, 1), put(t, 0, 0, 0, 1, 0, 8, SIGNAL_ADD, BARRIER, 1),
        put(t, 0, 0, 0, 1, 0, 8, SIGNAL_NONE, 0, 0, COUNTERS), put(t, 0, 0, 0, 1, 0, 8, SIGNAL_NONE, 0, 0, NO_COUNTER, 1),
        put_value(t, 0, 0, 0, 1, 0), put_value(t, 0, 0, 0, 1, 9), signal(t, 0, BARRIER, SIGNAL_ADD, 1),
        signal(t, 0, 0, SIGNAL_NONE, 1), signal(t, 0, 0, 7, 1), wait_signal(t, BARRIER, 0, 1000),
        reset_signal(t, SIGNALS), wait_counter(t, COUNTERS, 0, 1000),
    };
    bool ok = env->reserved == before;
    for (Status s : got) ok &= s == BAD_ARGUMENT;
    verdict("bad_arguments_take_no_ticket", ok, "a bad call was issued or not refused");
  }

  // wait_signal sees puts' signals to this rank; reset_signal restarts the count; an unsent
  // signal times out.
  {
    Status a = put(t, 0, RANK, 0, 1, 0, 8, SIGNAL_ADD, 0, 3);
    Status b = put(t, 0, RANK, 0, 1, 0, 8, SIGNAL_ADD, 0, 4);
    u64 reached = 0;
    Status w = wait_signal(t, 0, 7, 5000000000ull, &reached);
    const bool read = read_signal(t, 0) == 7;
    Status r = reset_signal(t, 0);
    const bool zero = read_signal(t, 0) == 0;
    Status c = put_value(t, 0, RANK, 0, 1, 8, SIGNAL_ADD, 0, 2);
    Status w2 = wait_signal(t, 0, 2, 5000000000ull);
    const u64 start = accord_emulation_now_ns();
    Status never = wait_signal(t, 1, 1000, 20000000ull);  // 20 ms
    const bool bounded = accord_emulation_now_ns() - start < 5000000000ull;
    env->drained();
    env->take();
    verdict("wait_signal_sees_signals_resets_and_times_out",
            a == OK && b == OK && w == OK && reached == 7 && read && r == OK && zero && c == OK && w2 == OK &&
                never == TIMEOUT && bounded,
            "a wait or read went wrong");
  }

  // wait_signal sums every rank's slot in worlds of 3 (every slot tracked from the entry on)
  // and 11 (past the tracked ranks): contributions there
  // before the wait and one that arrives during it.
  {
    bool ok = true;
    for (u32 world : {3u, 11u}) {
      std::vector<u64> slots(SIGNALS * world, 0);
      u64 bases_w[SIGNALS] = {};
      DeviceTable tw = env->table;
      tw.world = world;
      tw.signals = (u64)slots.data();
      tw.signal_bases = (u64)bases_w;
      slots[0] = 5;          // rank 0's contribution to signal 0, there before the wait
      slots[world - 1] = 2;  // the last rank's
      std::thread late([&slots] {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        __atomic_store_n(&slots[1], 4, __ATOMIC_RELEASE);  // rank 1's, during the wait
      });
      u64 reached = 0;
      Status w = wait_signal(&tw, 0, 11, 5000000000ull, &reached);
      late.join();
      Status never = wait_signal(&tw, 0, 12, 20000000ull);
      if (!(w == OK && reached == 11 && never == TIMEOUT)) {
        std::printf("world %u: wait %d reached %llu, the higher wait %d\n", world, int(w), (unsigned long long)reached, int(never));
        ok = false;
      }
    }
    verdict("wait_signal_sums_every_rank_in_larger_worlds", ok, "a sum over 3 or 11 ranks went wrong (printed above)");
  }

  // A SET that lowers a contribution below the last reset reads 0, never a wrapped value.
  {
    put(t, 0, RANK, 0, 1, 0, 8, SIGNAL_SET, 1, 50);
    wait_signal(t, 1, 50, 5000000000ull);
    reset_signal(t, 1);
    put(t, 0, RANK, 0, 1, 0, 8, SIGNAL_SET, 1, 10);
    env->drained();
    env->take();
    verdict("a_lowered_signal_reads_zero_not_a_wrapped_value", read_signal(t, 1) == 0 &&
            wait_signal(t, 1, 1, 1000000ull) == TIMEOUT, "read a wrapped value");
  }

  // flush returns once every earlier ticket completed, and times out while the proxy stalls.
  {
    const bool stopped = env->pause();
    Status a = put(t, 0, 1, 0, 1, 0, 8);
    Status stalled = flush(t, 20000000ull);
    env->paused = false;
    Status done = flush(t, 5000000000ull);
    const bool completed = env->control.completed == env->reserved;
    env->take();
    verdict("flush_waits_for_completion_and_is_bounded",
            stopped && a == OK && stalled == TIMEOUT && done == OK && completed,
            "flush returned the wrong status");
  }

  // wait_counter sees the proxy's bumps.
  {
    const u64 before = env->counters[0];
    put(t, 0, 1, 0, 1, 0, 8, SIGNAL_NONE, 0, 0, 0);
    put(t, 0, 1, 0, 1, 0, 8, SIGNAL_NONE, 0, 0, 0);
    Status w = wait_counter(t, 0, before + 2, 5000000000ull);
    Status never = wait_counter(t, 0, before + 3, 20000000ull);
    env->drained();
    env->take();
    verdict("wait_counter_sees_bumps_and_is_bounded", w == OK && never == TIMEOUT && read_counter(t, 0) == before + 2,
            "counter wait went wrong");
  }

  // barrier: flush, bump the epoch, signal the peer, wait for the peer's slot; twice.
  {
    Status a = barrier(t, 5000000000ull);
    Status b = barrier(t, 5000000000ull);
    env->drained();
    std::vector<Descriptor> seen = env->take();
    bool ok = a == OK && b == OK && env->epoch == 2 && seen.size() == 2;
    for (const Descriptor& d : seen) {
      ok &= d.op == OP_SIGNAL && d.peer == 1 && d.signal_id == BARRIER && d.signal_op == SIGNAL_ADD && d.signal_value == 1;
    }
    verdict("barrier_signals_every_peer_and_waits_for_their_epoch", ok, "barrier went wrong");
  }

  // A full ring whose proxy stalls: put gives up after the ring wait, it does not hang.
  {
    const bool stopped = env->pause();
    accord_emulation_ring_wait_ns = 20000000ull;  // 20 ms
    Status s = OK;
    int issued = 0;
    for (; issued < int(SLOTS) + 1 && s == OK; ++issued) s = put(t, 0, 1, 0, 1, 0, 8);
    verdict("a_full_stalled_ring_times_out", stopped && s == TIMEOUT && issued == int(SLOTS) + 1,
            "the ninth put did not time out");
    accord_emulation_ring_wait_ns = 10000000000ull;
  }

  // A proxy error stops waits with PROXY_ERROR instead of letting them run out.
  {
    __atomic_store_n(&env->control.error, 5, __ATOMIC_RELEASE);
    const u64 start = accord_emulation_now_ns();
    Status w = wait_signal(t, 1, 1000, 5000000000ull);
    Status f = flush(t, 1000000ull);
    const bool quick = accord_emulation_now_ns() - start < 1000000000ull;
    verdict("a_proxy_error_ends_waits", w == PROXY_ERROR && (f == PROXY_ERROR || f == TIMEOUT) && quick,
            "waits did not stop on the error");
  }

  env->stop = true;
  consumer.join();
  delete env;
  return failures == 0 ? 0 : 1;
}
"#;

const SCENARIOS: [&str; 12] = [
    "producers_share_a_small_ring_and_lose_nothing",
    "put_value_and_signal_fill_their_descriptors",
    "an_aligned_8_byte_put_travels_inline",
    "bad_arguments_take_no_ticket",
    "wait_signal_sees_signals_resets_and_times_out",
    "wait_signal_sums_every_rank_in_larger_worlds",
    "a_lowered_signal_reads_zero_not_a_wrapped_value",
    "flush_waits_for_completion_and_is_bounded",
    "wait_counter_sees_bumps_and_is_bounded",
    "barrier_signals_every_peer_and_waits_for_their_epoch",
    "a_full_stalled_ring_times_out",
    "a_proxy_error_ends_waits",
];

fn compiler() -> Option<String> {
    let candidates = std::env::var("CXX").ok().into_iter().chain(["c++", "g++", "clang++"].map(String::from));
    candidates.into_iter().find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
}

fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

#[test]
fn the_device_code_runs_its_protocol_on_host_threads() {
    let Some(cxx) = compiler() else {
        println!("skipped: no host C++ compiler ($CXX, c++, g++, clang++) to build the emulation with");
        return;
    };
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("accord-header-emulated-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let src = dir.join("emulated.cpp");
    let exe = dir.join("emulated");
    std::fs::write(&src, format!("{SHIM}\n{PROGRAM}")).expect("source");
    let built = Command::new(&cxx)
        .args(["-std=c++17", "-O2", "-pthread", "-Wall", "-Wextra", "-Wno-unused-parameter", "-I"])
        .arg(include_dir())
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run the compiler");
    assert!(built.status.success(), "{cxx} failed:\n{}", String::from_utf8_lossy(&built.stderr));
    // Bounded: every wait in the program is bounded, and the test kills it after 120 s anyway.
    let mut child = Command::new(&exe).stdout(Stdio::piped()).spawn().expect("run the emulation");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    use std::io::Read;
    child.stdout.take().expect("stdout").read_to_string(&mut out).expect("read output");
    let _ = std::fs::remove_dir_all(&dir);
    let status = status.unwrap_or_else(|| panic!("the emulation ran past 120 s; it printed:\n{out}"));
    let passed: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("ok ")).collect();
    let failed: Vec<&str> = out.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert!(failed.is_empty() && status.success(), "emulated device code failed ({status}):\n{out}");
    assert_eq!(passed, SCENARIOS, "every scenario must report");
}
