// NVSHMEM's device-initiated put-with-signal, measured the way accord-device-bench measures
// Accord's device API (issue 19's anchor): one process per GPU, two PEs, kernels on both sides.
//
// Why it exists: Accord's numbers (ping-pong one way, large-put bandwidth against the IPC copy
// ceiling) mean little without the established library's numbers on the same host in the same
// call. This program prints those, as a table and as JSON rows of the same shape as
// accord-device-bench's ("bench":"device_pingpong" / "device_put_bandwidth", "route":"nvshmem"),
// so scripts/device/nvshmem_anchor.sh can print them beside Accord's.
//
// What it measures:
//   1. ping-pong: one thread (or one warp) on PE0 puts 8 B / 4 KiB into PE1 with
//      nvshmem_putmem_signal_nbi (NVSHMEM_SIGNAL_SET of the iteration number); PE1's kernel
//      waits with nvshmem_signal_wait_until, checks the data and replies the same way. Each
//      round trip is timed on PE0 with %globaltimer; one way = half the median. Several runs of
//      --iters round trips (after a warm-up each); the table gives the median of the runs'
//      medians. The receiver checks the stamp (first and last 8 bytes) and a pattern in bytes
//      8..64 of every message, as Accord's ping-pong kernel does.
//   2. bandwidth: one block (--threads) on PE0 puts each size with
//      nvshmemx_putmem_signal_nbi_block, --bw-iters times, then nvshmem_quiet; timed with CUDA
//      events around the kernel (so one launch is included, as in Accord's put timing). PE1
//      waits for the last signal and checks every byte. The ceiling is cudaMemcpyAsync into the
//      peer's buffer through nvshmem_ptr (the IPC mapping NVSHMEM itself made), same count.
//
// Bootstrap: NVSHMEM's unique-id initialisation. PE0 writes the id to --id-file (a temporary
// name, then rename, so the reader never sees half an id); PE1 waits for it, bounded by
// --id-wait-s. Every wait is bounded: a watchdog thread exits the process with a message naming
// the PE, the step and whom it waited for when a step outlives --step-timeout-s or the whole
// run outlives --timeout-s (a kernel stuck in nvshmem_signal_wait_until cannot time out itself).
//
// Safety: refuses to start unless NVSHMEM_DISABLE_NVLS=1 (NVLink multicast can put a shared
// host's GPUs out of service).
//
// Build and run: scripts/device/nvshmem_anchor.sh (finds NVSHMEM in Python's site-packages,
// builds with nvcc -rdc=true, runs both PEs under `timeout`).
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include <sys/stat.h>
#include <unistd.h>

namespace {

using u64 = unsigned long long;

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

struct Options {
  int pe = -1;
  std::string id_file;
  unsigned iters = 1000;
  unsigned runs = 5;
  unsigned bw_iters = 10;
  unsigned threads = 1024;
  std::vector<unsigned> sizes_mib{1, 4, 16, 64, 256};
  double timeout_s = 100;
  double step_timeout_s = 30;
  double id_wait_s = 30;
};

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr,
               "nvshmem_putsignal: %s\n"
               "usage: nvshmem_putsignal --pe 0|1 --id-file PATH [--iters N (1..100000)] [--runs R (1..50)]\n"
               "       [--bw-iters K (1..1000)] [--threads T (32..1024, a multiple of 32)]\n"
               "       [--sizes-mib 1,4,16,64,256 (each 1..1024)] [--timeout-s S] [--step-timeout-s S]\n"
               "       [--id-wait-s S]\n",
               why.c_str());
  std::exit(2);
}

unsigned parse_unsigned(const char* flag, const char* text, unsigned lo, unsigned hi) {
  char* end = nullptr;
  errno = 0;
  unsigned long v = std::strtoul(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || v < lo || v > hi) {
    usage_error(std::string(flag) + " takes a whole number in " + std::to_string(lo) + ".." + std::to_string(hi) +
                ", not '" + text + "'");
  }
  return static_cast<unsigned>(v);
}

double parse_seconds(const char* flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !(v > 0) || v > 3600) {
    usage_error(std::string(flag) + " takes seconds in (0, 3600], not '" + text + "'");
  }
  return v;
}

std::vector<unsigned> parse_sizes(const char* text) {
  std::vector<unsigned> out;
  std::string all(text);
  size_t start = 0;
  while (start <= all.size()) {
    size_t comma = all.find(',', start);
    std::string item = all.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    out.push_back(parse_unsigned("--sizes-mib", item.c_str(), 1, 1024));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.empty() || out.size() > 16) usage_error("--sizes-mib takes 1 to 16 sizes");
  return out;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) usage_error(flag + " needs a value");
    const char* v = argv[++i];
    if (flag == "--pe") o.pe = static_cast<int>(parse_unsigned("--pe", v, 0, 1));
    else if (flag == "--id-file") o.id_file = v;
    else if (flag == "--iters") o.iters = parse_unsigned("--iters", v, 1, 100000);
    else if (flag == "--runs") o.runs = parse_unsigned("--runs", v, 1, 50);
    else if (flag == "--bw-iters") o.bw_iters = parse_unsigned("--bw-iters", v, 1, 1000);
    else if (flag == "--threads") o.threads = parse_unsigned("--threads", v, 32, 1024);
    else if (flag == "--sizes-mib") o.sizes_mib = parse_sizes(v);
    else if (flag == "--timeout-s") o.timeout_s = parse_seconds("--timeout-s", v);
    else if (flag == "--step-timeout-s") o.step_timeout_s = parse_seconds("--step-timeout-s", v);
    else if (flag == "--id-wait-s") o.id_wait_s = parse_seconds("--id-wait-s", v);
    else usage_error("unknown flag " + flag);
  }
  if (o.pe < 0) usage_error("--pe is required");
  if (o.id_file.empty()) usage_error("--id-file is required");
  if (o.threads % 32 != 0) usage_error("--threads must be a multiple of 32");
  return o;
}

// ---------------------------------------------------------------------------------------------
// Watchdog: every step is named; a step that outlives its limit ends the process with a message.
// ---------------------------------------------------------------------------------------------

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Watchdog {
  int pe = 0;
  double run_deadline = 0;
  double step_limit_s = 0;
  std::atomic<double> step_deadline{0};
  std::atomic<const char*> step{"starting"};
  std::atomic<bool> finished{false};
  volatile u64* progress = nullptr;  // mapped host word: the iteration a ping-pong kernel reached
  std::thread thread;

  void begin(const char* name) {
    step.store(name);
    step_deadline.store(std::min(now_s() + step_limit_s, run_deadline));
  }

  void start(int pe_, double run_s, double step_s) {
    pe = pe_;
    run_deadline = now_s() + run_s;
    step_limit_s = step_s;
    begin("starting");
    thread = std::thread([this] {
      while (!finished.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (!finished.load() && now_s() > step_deadline.load()) {
          std::fprintf(stderr,
                       "nvshmem_putsignal: PE%d: watchdog: step '%s' did not finish in time (step limit %.0f s, "
                       "run limit reached: %s); PE%d did not answer; last ping-pong iteration reported: %llu\n",
                       pe, step.load(), step_limit_s, now_s() > run_deadline ? "yes" : "no", pe ^ 1,
                       progress ? static_cast<u64>(*progress) : 0ull);
          std::fflush(stdout);
          std::fflush(stderr);
          _exit(3);
        }
      }
    });
  }

  void stop() {
    finished.store(true);
    if (thread.joinable()) thread.join();
  }
};

Watchdog g_watch;

#define CUDA_OK(call)                                                                                     \
  do {                                                                                                    \
    cudaError_t err_ = (call);                                                                            \
    if (err_ != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "nvshmem_putsignal: PE%d: %s failed: %s (step '%s')\n", g_watch.pe, #call,    \
                   cudaGetErrorString(err_), g_watch.step.load());                                       \
      std::fflush(stdout);                                                                                \
      _exit(4);                                                                                           \
    }                                                                                                     \
  } while (0)

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "nvshmem_putsignal: PE%d: %s\n", g_watch.pe, why.c_str());
  std::fflush(stdout);
  _exit(5);
}

// ---------------------------------------------------------------------------------------------
// Unique-id exchange through a file
// ---------------------------------------------------------------------------------------------

void write_id(const std::string& path, const nvshmemx_uniqueid_t& id) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot create " + tmp + ": " + std::strerror(errno));
  bool ok = std::fwrite(&id, sizeof id, 1, f) == 1;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot write the unique id to " + path);
}

nvshmemx_uniqueid_t read_id(const std::string& path, double wait_s) {
  const double deadline = now_s() + wait_s;
  struct stat st;
  while (stat(path.c_str(), &st) != 0) {
    if (now_s() > deadline) {
      fail("no unique id from PE0 at " + path + " after " + std::to_string(static_cast<int>(wait_s)) +
           " s (PE0 did not start, or failed before nvshmemx_get_uniqueid)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  nvshmemx_uniqueid_t id;
  if (static_cast<size_t>(st.st_size) != sizeof id) {
    fail(path + " holds " + std::to_string(st.st_size) + " bytes, not a unique id of " + std::to_string(sizeof id));
  }
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f || std::fread(&id, sizeof id, 1, f) != 1) fail("cannot read the unique id from " + path);
  std::fclose(f);
  return id;
}

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ u64 globaltimer_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The byte at offset b (8 <= b < 64) of message n from PE `from`.
__device__ __forceinline__ uint8_t pattern(int from, u64 n, size_t b) {
  return static_cast<uint8_t>(b * 7u + n * 13u + static_cast<unsigned>(from) * 101u + 1u);
}

// Stamps message n: the first word n, the last word ~n (when bytes >= 16), bytes 8..64 a pattern.
__device__ void stamp(uint8_t* buf, size_t bytes, u64 n, int from) {
  reinterpret_cast<volatile u64*>(buf)[0] = n;
  for (size_t b = 8; b < bytes && b < 64; ++b) buf[b] = pattern(from, n, b);
  if (bytes >= 16) reinterpret_cast<volatile u64*>(buf)[bytes / 8 - 1] = ~n;
}

// Wrong bytes of message n from PE `from` in what `stamp` writes (volatile loads: the bytes come
// from the other GPU).
__device__ u64 check(const uint8_t* buf, size_t bytes, u64 n, int from) {
  const volatile uint8_t* v = buf;
  u64 wrong = 0;
  const u64 first = reinterpret_cast<const volatile u64*>(buf)[0];
  for (int b = 0; b < 8; ++b) wrong += ((first >> (8 * b)) & 0xff) != ((n >> (8 * b)) & 0xff);
  for (size_t b = 8; b < bytes && b < 64; ++b) wrong += v[b] != pattern(from, n, b);
  if (bytes >= 16) {
    const u64 last = reinterpret_cast<const volatile u64*>(buf)[bytes / 8 - 1];
    for (int b = 0; b < 8; ++b) wrong += ((last >> (8 * b)) & 0xff) != ((~n >> (8 * b)) & 0xff);
  }
  return wrong;
}

struct PingArgs {
  uint8_t* recv;      // symmetric: the peer puts here
  uint8_t* send;      // symmetric: the source of this PE's puts
  uint64_t* signal;   // symmetric: the peer sets it to the iteration number
  size_t bytes;
  u64 first;          // signal value of the first iteration (values only grow across runs)
  unsigned warm;
  unsigned iters;
  int me;
  u64* rtt_ns;        // [iters], PE0
  u64* wrong;         // [1], bytes found wrong at this PE
  volatile u64* progress;  // mapped host word for the watchdog
};

// This PE's stamped message to `peer` with its signal set to `n`: by the whole warp (kWarp), or
// by the lead thread alone.
template <bool kWarp>
__device__ void put_stamp(const PingArgs& a, u64 n, int peer, bool lead) {
  if (kWarp) {
    nvshmemx_putmem_signal_nbi_warp(a.recv, a.send, a.bytes, a.signal, n, NVSHMEM_SIGNAL_SET, peer);
  } else if (lead) {
    nvshmem_putmem_signal_nbi(a.recv, a.send, a.bytes, a.signal, n, NVSHMEM_SIGNAL_SET, peer);
  }
}

// kWarp: the put is nvshmemx_putmem_signal_nbi_warp by a whole warp; else one thread puts.
template <bool kWarp>
__global__ void pingpong_kernel(PingArgs a) {
  const bool lead = threadIdx.x == 0;
  const int peer = a.me ^ 1;
  for (unsigned i = 0; i < a.warm + a.iters; ++i) {
    const u64 n = a.first + i;
    u64 t0 = 0;
    if (a.me == 0) {
      if (lead) {
        t0 = globaltimer_ns();
        stamp(a.send, a.bytes, n, a.me);
      }
      __syncwarp();
      put_stamp<kWarp>(a, n, peer, lead);
      if (lead) {
        nvshmem_signal_wait_until(a.signal, NVSHMEM_CMP_GE, n);
        const u64 bad = check(a.recv, a.bytes, n, peer);
        const u64 t1 = globaltimer_ns();
        if (bad) atomicAdd(a.wrong, bad);
        if (i >= a.warm) a.rtt_ns[i - a.warm] = t1 - t0;
      }
    } else {
      if (lead) {
        nvshmem_signal_wait_until(a.signal, NVSHMEM_CMP_GE, n);
        const u64 bad = check(a.recv, a.bytes, n, peer);
        if (bad) atomicAdd(a.wrong, bad);
        stamp(a.send, a.bytes, n, a.me);
      }
      __syncwarp();
      put_stamp<kWarp>(a, n, peer, lead);
    }
    if (lead && (i & 63u) == 63u) *a.progress = n;
    __syncwarp();
  }
  if (lead) {
    nvshmem_quiet();
    *a.progress = a.first + a.warm + a.iters - 1;
  }
}

// The 8-byte word w of the bandwidth pattern for size number `tag`.
__device__ __forceinline__ u64 bw_word(size_t w, unsigned tag) {
  return (static_cast<u64>(w) * 0x9E3779B97F4A7C15ull) ^ (static_cast<u64>(tag + 1) << 56) ^ 0x5bd1e995ull;
}

__global__ void fill_kernel(u64* buf, size_t words, unsigned tag) {
  for (size_t w = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; w < words;
       w += static_cast<size_t>(gridDim.x) * blockDim.x) {
    buf[w] = bw_word(w, tag);
  }
}

__global__ void check_kernel(const u64* buf, size_t words, unsigned tag, u64* wrong) {
  u64 bad = 0;
  for (size_t w = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; w < words;
       w += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const u64 diff = buf[w] ^ bw_word(w, tag);
    for (int b = 0; b < 8; ++b) bad += ((diff >> (8 * b)) & 0xff) != 0;
  }
  if (bad) atomicAdd(wrong, bad);
}

// One block puts `bytes` `iters` times, each with a signal (ADD 1), then waits for completion.
// The bounds keep the register count low enough for a block of 1,024 threads to launch.
__global__ void __launch_bounds__(1024, 1)
    bw_put_kernel(uint8_t* dst, const uint8_t* src, size_t bytes, uint64_t* signal, unsigned iters, int peer) {
  for (unsigned k = 0; k < iters; ++k) {
    nvshmemx_putmem_signal_nbi_block(dst, src, bytes, signal, 1, NVSHMEM_SIGNAL_ADD, peer);
  }
  __syncthreads();
  if (threadIdx.x == 0) nvshmem_quiet();
  __syncthreads();
}

__global__ void wait_kernel(uint64_t* signal, u64 value) {
  if (threadIdx.x == 0) nvshmem_signal_wait_until(signal, NVSHMEM_CMP_GE, value);
}

__global__ void fetch_kernel(u64* out, uint64_t* symmetric, int pe) {
  if (threadIdx.x == 0) *out = nvshmem_uint64_g(symmetric, pe);
}

// ---------------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------------

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t k = static_cast<size_t>(std::lround((v.size() - 1) * q));
  return v[std::min(k, v.size() - 1)];
}

struct Ctx {
  Options opt;
  int me = 0;
  cudaStream_t stream{};
  uint8_t* ping_recv = nullptr;
  uint8_t* ping_send = nullptr;
  uint64_t* ping_signal = nullptr;
  uint64_t* bw_signal = nullptr;
  uint64_t* report = nullptr;  // symmetric: wrong bytes this PE found in the last step
  uint8_t* bw_src = nullptr;
  uint8_t* bw_dst = nullptr;
  u64* dev_words = nullptr;    // [iters]: round trips, then scratch
  u64* dev_wrong = nullptr;
  u64* progress_dev = nullptr; // the watchdog's mapped host word, as the GPU sees it
  u64 ping_counter = 1;        // next ping-pong signal value
  u64 bw_expected = 0;         // bw_signal's value once every put so far has landed
  bool failed = false;
};

void sync(Ctx& c, const char* step) {
  g_watch.begin(step);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(c.stream));
}

void barrier(const char* step) {
  g_watch.begin(step);
  nvshmem_barrier_all();
}

u64 read_u64(Ctx& c, const u64* dev) {
  u64 v = 0;
  CUDA_OK(cudaMemcpyAsync(&v, dev, sizeof v, cudaMemcpyDeviceToHost, c.stream));
  sync(c, "reading a result word");
  return v;
}

// Publishes this PE's wrong-byte count and returns the sum over both PEs (a collective).
u64 wrong_on_both(Ctx& c, u64 mine, const char* step) {
  CUDA_OK(cudaMemcpyAsync(c.report, &mine, sizeof mine, cudaMemcpyHostToDevice, c.stream));
  sync(c, step);
  barrier(step);
  fetch_kernel<<<1, 1, 0, c.stream>>>(c.dev_wrong, c.report, c.me ^ 1);
  sync(c, step);
  const u64 theirs = read_u64(c, c.dev_wrong);
  barrier(step);
  return mine + theirs;
}

void run_pingpong(Ctx& c, bool warp, size_t bytes) {
  const char* mode = warp ? "putmem_signal_nbi_warp" : "putmem_signal_nbi";
  const unsigned warm = std::max(1u, std::min(100u, c.opt.iters / 10));
  std::vector<double> run_medians, samples;
  double event_ms_total = 0;
  u64 my_wrong = 0;
  barrier("ping-pong start barrier");
  for (unsigned r = 0; r < c.opt.runs; ++r) {
    CUDA_OK(cudaMemsetAsync(c.dev_wrong, 0, sizeof(u64), c.stream));
    PingArgs a{c.ping_recv, c.ping_send, c.ping_signal, bytes, c.ping_counter, warm, c.opt.iters, c.me,
               c.dev_words, c.dev_wrong, c.progress_dev};
    c.ping_counter += warm + c.opt.iters;
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    CUDA_OK(cudaEventRecord(e0, c.stream));
    if (warp) pingpong_kernel<true><<<1, 32, 0, c.stream>>>(a);
    else pingpong_kernel<false><<<1, 1, 0, c.stream>>>(a);
    CUDA_OK(cudaEventRecord(e1, c.stream));
    sync(c, warp ? "ping-pong (warp) kernel, waiting for the peer's replies"
                 : "ping-pong kernel, waiting for the peer's replies");
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    event_ms_total += ms;
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    my_wrong += read_u64(c, c.dev_wrong);
    if (c.me == 0) {
      std::vector<u64> rtt(c.opt.iters);
      CUDA_OK(cudaMemcpyAsync(rtt.data(), c.dev_words, rtt.size() * sizeof(u64), cudaMemcpyDeviceToHost, c.stream));
      sync(c, "reading round trips");
      std::vector<double> us;
      for (u64 ns : rtt) us.push_back(ns / 1e3);
      run_medians.push_back(percentile(us, 0.5));
      samples.insert(samples.end(), us.begin(), us.end());
    }
  }
  const u64 wrong = wrong_on_both(c, my_wrong, "ping-pong: gathering wrong bytes");
  if (c.me != 0) {
    std::printf("# PE1: ping-pong %s %zu B: %llu wrong bytes seen here\n", mode, bytes, my_wrong);
    return;
  }
  const bool ok = wrong == 0;
  c.failed |= !ok;
  const double med = percentile(run_medians, 0.5);
  const double p99 = percentile(samples, 0.99);
  const double lo = percentile(samples, 0.0);
  const double event_rtt = event_ms_total * 1e3 / (static_cast<double>(c.opt.runs) * (warm + c.opt.iters));
  std::printf(" %24s %7zu %11.2f %11.2f %11.2f %11.2f %13.2f %6llu %4s\n", mode, bytes, med, p99, lo, med / 2,
              event_rtt, wrong, ok ? "true" : "false");
  std::printf(
      "{\"bench\":\"device_pingpong\",\"route\":\"nvshmem\",\"mode\":\"nvshmem_%s\",\"bytes\":%zu,\"iters\":%u,"
      "\"runs\":%u,\"rtt_median_us\":%.3f,\"rtt_p99_us\":%.3f,\"rtt_min_us\":%.3f,\"one_way_us\":%.3f,"
      "\"event_rtt_mean_us\":%.3f,\"wrong_bytes\":%llu,\"ok\":%s}\n",
      mode, bytes, c.opt.iters, c.opt.runs, med, p99, lo, med / 2, event_rtt, wrong, ok ? "true" : "false");
  std::fflush(stdout);
}

void run_bandwidth(Ctx& c, unsigned tag, size_t bytes) {
  const int peer = c.me ^ 1;
  const unsigned iters = c.opt.bw_iters;
  const size_t words = bytes / 8;
  double ceiling = -1, put = 0;
  if (c.me == 0) {
    fill_kernel<<<264, 512, 0, c.stream>>>(reinterpret_cast<u64*>(c.bw_src), words, tag);
    sync(c, "filling the bandwidth source");
    void* peer_dst = nvshmem_ptr(c.bw_dst, peer);
    if (peer_dst) {
      cudaEvent_t e0, e1;
      CUDA_OK(cudaEventCreate(&e0));
      CUDA_OK(cudaEventCreate(&e1));
      CUDA_OK(cudaMemcpyAsync(peer_dst, c.bw_src, bytes, cudaMemcpyDefault, c.stream));
      CUDA_OK(cudaEventRecord(e0, c.stream));
      for (unsigned k = 0; k < iters; ++k) {
        CUDA_OK(cudaMemcpyAsync(peer_dst, c.bw_src, bytes, cudaMemcpyDefault, c.stream));
      }
      CUDA_OK(cudaEventRecord(e1, c.stream));
      sync(c, "ceiling copies (cudaMemcpyAsync into the peer through nvshmem_ptr)");
      float ms = 0;
      CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
      ceiling = static_cast<double>(bytes) * iters / (ms / 1e3) / 1e9;
      CUDA_OK(cudaEventDestroy(e0));
      CUDA_OK(cudaEventDestroy(e1));
    }
  }
  barrier("bandwidth: ceiling done");
  if (c.me == 1) {
    CUDA_OK(cudaMemsetAsync(c.bw_dst, 0, bytes, c.stream));
    sync(c, "clearing the bandwidth destination");
  }
  barrier("bandwidth: destination cleared");
  c.bw_expected += 1 + iters;  // one warm-up put, then the timed ones
  u64 my_wrong = 0;
  if (c.me == 0) {
    bw_put_kernel<<<1, c.opt.threads, 0, c.stream>>>(c.bw_dst, c.bw_src, bytes, c.bw_signal, 1, peer);
    sync(c, "bandwidth warm-up put");
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    CUDA_OK(cudaEventRecord(e0, c.stream));
    bw_put_kernel<<<1, c.opt.threads, 0, c.stream>>>(c.bw_dst, c.bw_src, bytes, c.bw_signal, iters, peer);
    CUDA_OK(cudaEventRecord(e1, c.stream));
    sync(c, "bandwidth puts and nvshmem_quiet");
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    put = static_cast<double>(bytes) * iters / (ms / 1e3) / 1e9;
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
  } else {
    wait_kernel<<<1, 1, 0, c.stream>>>(c.bw_signal, c.bw_expected);
    sync(c, "bandwidth: waiting for PE0's last signal");
    CUDA_OK(cudaMemsetAsync(c.dev_wrong, 0, sizeof(u64), c.stream));
    check_kernel<<<264, 512, 0, c.stream>>>(reinterpret_cast<const u64*>(c.bw_dst), words, tag, c.dev_wrong);
    sync(c, "bandwidth: checking every byte");
    my_wrong = read_u64(c, c.dev_wrong);
  }
  const u64 wrong = wrong_on_both(c, my_wrong, "bandwidth: gathering wrong bytes");
  if (c.me != 0) {
    std::printf("# PE1: bandwidth %zu B: %llu wrong bytes of %zu\n", bytes, my_wrong, bytes);
    return;
  }
  const bool ok = wrong == 0;
  c.failed |= !ok;
  char ceil_text[32] = "-", ratio_text[32] = "-", ceil_json[32] = "null", ratio_json[32] = "null";
  if (ceiling > 0) {
    std::snprintf(ceil_text, sizeof ceil_text, "%.1f", ceiling);
    std::snprintf(ratio_text, sizeof ratio_text, "%.3f", put / ceiling);
    std::snprintf(ceil_json, sizeof ceil_json, "%.2f", ceiling);
    std::snprintf(ratio_json, sizeof ratio_json, "%.4f", put / ceiling);
  }
  std::printf(" %11zu %10s %9.1f %9s %8u %8u %6llu %4s\n", bytes, ceil_text, put, ratio_text, 1u, c.opt.threads,
              wrong, ok ? "true" : "false");
  std::printf(
      "{\"bench\":\"device_put_bandwidth\",\"route\":\"nvshmem\",\"bytes\":%zu,\"iters\":%u,\"ceiling_gbps\":%s,"
      "\"engine_write_gbps\":null,\"put_gbps\":%.2f,\"put_vs_ceiling\":%s,\"put_vs_engine\":null,\"copy_sms\":1,"
      "\"issuer_ctas\":1,\"threads\":%u,\"wrong_bytes\":%llu,\"ok\":%s}\n",
      bytes, iters, ceil_json, put, ratio_json, c.opt.threads, wrong, ok ? "true" : "false");
  std::fflush(stdout);
}

template <typename T>
T* symmetric_alloc(size_t bytes, const char* what) {
  g_watch.begin(what);
  void* p = nvshmem_malloc(bytes);
  if (!p) {
    fail(std::string("nvshmem_malloc of ") + std::to_string(bytes) + " bytes for " + what +
         " failed (NVSHMEM_SYMMETRIC_SIZE too small?)");
  }
  return static_cast<T*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  Ctx c;
  c.opt = parse_options(argc, argv);
  c.me = c.opt.pe;
  const char* nvls = std::getenv("NVSHMEM_DISABLE_NVLS");
  if (!nvls || std::string(nvls) != "1") {
    std::fprintf(stderr,
                 "nvshmem_putsignal: refusing to start without NVSHMEM_DISABLE_NVLS=1 (NVLink multicast must stay "
                 "off on a shared host)\n");
    return 2;
  }
  g_watch.pe = c.me;
  g_watch.start(c.me, c.opt.timeout_s, c.opt.step_timeout_s);

  int gpus = 0;
  CUDA_OK(cudaGetDeviceCount(&gpus));
  if (gpus < 2) fail("needs 2 GPUs, CUDA sees " + std::to_string(gpus));
  CUDA_OK(cudaSetDevice(c.me));
  u64* progress_host = nullptr;
  CUDA_OK(cudaHostAlloc(&progress_host, sizeof(u64), cudaHostAllocMapped));
  *progress_host = 0;
  CUDA_OK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&c.progress_dev), progress_host, 0));
  g_watch.progress = progress_host;

  nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
  if (c.me == 0) {
    g_watch.begin("nvshmemx_get_uniqueid");
    unlink(c.opt.id_file.c_str());
    if (nvshmemx_get_uniqueid(&id) != 0) fail("nvshmemx_get_uniqueid failed");
    write_id(c.opt.id_file, id);
  } else {
    g_watch.begin("waiting for PE0's unique id file");
    id = read_id(c.opt.id_file, std::min(c.opt.id_wait_s, c.opt.step_timeout_s));
  }
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  if (nvshmemx_set_attr_uniqueid_args(c.me, 2, &id, &attr) != 0) fail("nvshmemx_set_attr_uniqueid_args failed");
  g_watch.begin("nvshmemx_init_attr (unique-id bootstrap: both PEs must join)");
  if (nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr) != 0) fail("nvshmemx_init_attr failed");
  if (nvshmem_my_pe() != c.me || nvshmem_n_pes() != 2) {
    fail("NVSHMEM says PE " + std::to_string(nvshmem_my_pe()) + " of " + std::to_string(nvshmem_n_pes()) +
         ", expected PE " + std::to_string(c.me) + " of 2");
  }
  if (c.me == 0) {
    // nvshmem_info_get_version reports the OpenSHMEM specification the library implements
    // (1.3), not NVSHMEM's release: the release is the headers' vendor version.
    int spec_major = 0, spec_minor = 0;
    nvshmem_info_get_version(&spec_major, &spec_minor);
    cudaDeviceProp prop{};
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    std::printf("# NVSHMEM %d.%d.%d (OpenSHMEM %d.%d), 2 PEs, PE0 on GPU 0 (%s), PE1 on GPU 1\n",
                NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION, NVSHMEM_VENDOR_PATCH_VERSION, spec_major, spec_minor,
                prop.name);
  }
  CUDA_OK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));

  size_t max_bytes = 0;
  for (unsigned mib : c.opt.sizes_mib) max_bytes = std::max(max_bytes, static_cast<size_t>(mib) << 20);
  c.ping_recv = symmetric_alloc<uint8_t>(4096, "ping-pong receive buffer");
  c.ping_send = symmetric_alloc<uint8_t>(4096, "ping-pong send buffer");
  c.ping_signal = symmetric_alloc<uint64_t>(sizeof(uint64_t), "ping-pong signal");
  c.bw_signal = symmetric_alloc<uint64_t>(sizeof(uint64_t), "bandwidth signal");
  c.report = symmetric_alloc<uint64_t>(sizeof(uint64_t), "report word");
  c.bw_src = symmetric_alloc<uint8_t>(max_bytes, "bandwidth source");
  c.bw_dst = symmetric_alloc<uint8_t>(max_bytes, "bandwidth destination");
  CUDA_OK(cudaMemset(c.ping_signal, 0, sizeof(uint64_t)));
  CUDA_OK(cudaMemset(c.bw_signal, 0, sizeof(uint64_t)));
  CUDA_OK(cudaMemset(c.ping_recv, 0, 4096));
  CUDA_OK(cudaMalloc(&c.dev_words, sizeof(u64) * c.opt.iters));
  CUDA_OK(cudaMalloc(&c.dev_wrong, sizeof(u64)));
  CUDA_OK(cudaDeviceSynchronize());
  barrier("after allocation");

  if (c.me == 0) {
    std::printf("#\n# NVSHMEM ping-pong, kernel to kernel, %u runs of %u round trips (each after a warm-up); "
                "rtt_med = median of the runs' medians, one way = half\n",
                c.opt.runs, c.opt.iters);
    std::printf("# %24s %7s %11s %11s %11s %11s %13s %6s %4s\n", "mode", "bytes", "rtt_med_us", "rtt_p99_us",
                "rtt_min_us", "one_way_us", "event_rtt_us", "wrong", "ok");
  }
  run_pingpong(c, false, 8);
  run_pingpong(c, false, 4096);
  run_pingpong(c, true, 4096);

  cudaFuncAttributes put_attr{};
  CUDA_OK(cudaFuncGetAttributes(&put_attr, bw_put_kernel));
  if (static_cast<int>(c.opt.threads) > put_attr.maxThreadsPerBlock) {
    const unsigned fit = static_cast<unsigned>(put_attr.maxThreadsPerBlock) / 32u * 32u;
    if (c.me == 0) {
      std::printf("# --threads %u cut to %u: bw_put_kernel uses %d registers a thread, so a block holds at most %d\n",
                  c.opt.threads, fit, put_attr.numRegs, put_attr.maxThreadsPerBlock);
    }
    c.opt.threads = fit;
  }
  if (c.me == 0) {
    std::printf("#\n# NVSHMEM large puts PE0 -> PE1: one block of %u threads, nvshmemx_putmem_signal_nbi_block "
                "x%u then nvshmem_quiet; ceiling = cudaMemcpyAsync into the peer (nvshmem_ptr), same count\n",
                c.opt.threads, c.opt.bw_iters);
    std::printf("# %11s %10s %9s %9s %8s %8s %6s %4s\n", "bytes", "ceil_GB/s", "put_GB/s", "put/ceil", "blocks",
                "threads", "wrong", "ok");
  }
  for (size_t k = 0; k < c.opt.sizes_mib.size(); ++k) {
    run_bandwidth(c, static_cast<unsigned>(k), static_cast<size_t>(c.opt.sizes_mib[k]) << 20);
  }

  barrier("final barrier");
  g_watch.begin("nvshmem_free and nvshmem_finalize");
  nvshmem_free(c.bw_dst);
  nvshmem_free(c.bw_src);
  nvshmem_free(c.report);
  nvshmem_free(c.bw_signal);
  nvshmem_free(c.ping_signal);
  nvshmem_free(c.ping_send);
  nvshmem_free(c.ping_recv);
  nvshmem_finalize();
  g_watch.stop();
  CUDA_OK(cudaFree(c.dev_words));
  CUDA_OK(cudaFree(c.dev_wrong));
  CUDA_OK(cudaFreeHost(progress_host));
  if (c.me == 0) std::printf("# nvshmem_putsignal: %s\n", c.failed ? "FAILED (wrong bytes)" : "all checks passed");
  return c.failed ? 1 : 0;
}
