// Kernels of accord.ep (expert-parallel dispatch and combine), compiled at run time with NVRTC
// by accord/nvrtc.py for the GPU they run on, and launched on the caller's current stream.
//
// Everything runs on the GPU in stream order, with no host round trip in the data path; the plan
// (ep_plan) has a torch twin, accord/_ep_plan.py, the CPU tests' reference. The kernels:
//   * ep_plan: every offset of a dispatch and its combine, from the exchanged count matrix;
//   * ep_layout_tokens / ep_layout_scan: the count row and each token's place per destination;
//     the scan ends by putting the row to every peer (the count exchange), and ep_plan begins by
//     waiting for theirs;
//   * ep_pack_tokens: read each token once and write it to every rank it goes to (the packing
//     of tokens per destination rank), putting each chunk as soon as it is packed and the
//     metadata after the last token;
//   * ep_copy_out: dispatch's output, each row as soon as its chunk arrived, own rows first;
//   * ep_combine_send: combine's rows for other ranks into the send window, chunk by chunk;
//   * ep_put_segments / ep_signal_peers: ask the device proxy (accord/device.cuh) to move one
//     contiguous segment per peer with a signal: the bytes go by copy engine on one host and by
//     the engine's network route elsewhere, so no SM copies them;
//   * ep_wait: wait, bounded, for a signal to reach this call's epoch, without the host;
//   * ep_reduce_bf16 / ep_reduce_f32: combine's sum over ranks, in fp32.
//
// Failures never hang and never pass silently: a kernel that cannot issue or whose wait runs out
// records (stage << 24) | (rank << 8) | status in the status word (first failure wins), which
// accord.ep reads and raises at its next host synchronisation. Once the status is set, waits
// return at once, so a failed call costs one timeout, not one per kernel.
#include <accord/device.cuh>

using namespace accord::device;
typedef long long i64;

#define EP_MAX_FAN 64

namespace {

__device__ __forceinline__ void record_failure(int* status, int stage, u32 rank, int code) {
  atomicCAS(status, 0, (stage << 24) | (int(rank & 0xffffu) << 8) | (code & 0xff));
}

__device__ __forceinline__ bool failed(const int* status) {
  return *reinterpret_cast<const volatile int*>(status) != 0;
}

// Asks the proxy to move args[r] = {bytes, source offset, destination offset} from this rank's
// `src_window` to r's `dst_window` and add 1 to r's signal `sig` (the signal alone when there
// are no bytes), recording a failure under `stage`: ep_put_segments' one peer, also the count
// exchange at the end of ep_layout_scan and the metadata put at the end of ep_pack_tokens.
__device__ void put_segment(const DeviceTable* t, u32 r, const i64* args, u32 dst_window, u32 src_window, u32 sig,
                            int stage, int* status) {
  const i64 bytes = args[3 * r];
  const i64 src_offset = args[3 * r + 1];
  const i64 dst_offset = args[3 * r + 2];
  Status s;
  if (bytes < 0 || src_offset < 0 || dst_offset < 0) {
    s = BAD_ARGUMENT;
  } else if (bytes == 0) {
    s = signal(t, r, sig, SIGNAL_ADD, 1);
  } else {
    s = put(t, dst_window, r, u64(dst_offset), src_window, u64(src_offset), u64(bytes), SIGNAL_ADD, sig, 1);
  }
  if (s != OK) record_failure(status, stage, r, int(s));
}

// Waits, bounded, until every other rank's slot of signal `sig` reached `each`; a failure is
// recorded with the first rank whose slot is short (EP signals are never reset).
__device__ void wait_each_peer(const DeviceTable* t, u32 me, u32 ranks, u32 sig, u64 each, u64 timeout_ns, int stage,
                               int* status) {
  const Status s = wait_signal(t, sig, each * u64(ranks - 1), timeout_ns);
  if (s == OK) return;
  const u64* slots = reinterpret_cast<const u64*>(t->signals) + u64(sig) * t->world;
  u32 lagging = me;
  for (u32 r = 0; r < ranks; ++r) {
    if (r != me && *reinterpret_cast<const volatile u64*>(slots + r) < each) {
      lagging = r;
      break;
    }
  }
  record_failure(status, stage, lagging, int(s));
}

__device__ __forceinline__ float bf16_to_f32(unsigned short v) { return __uint_as_float(u32(v) << 16); }

// Round to nearest even, as torch's float -> bfloat16 conversion; NaN stays a quiet NaN.
__device__ __forceinline__ unsigned short f32_to_bf16(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}

}  // namespace

// ---- Packing and summing rows: a warp a row, 16-byte pieces, loads in flight ----------------

// A warp's destinations for one row live in lanes 0..fan-1 (fan <= 32) and are broadcast by
// shuffles, so a row is read once whatever the fan-out.
// 16-byte loads a lane keeps in flight: the reduces hold fp32 sums beside them (4); the copies
// hold only the loads, so twice as many fit a 1024-thread block's registers (8): an SM with 24
// of them streams at the rate its loads in flight allow (about 46 GB/s an SM with 4 on the
// 2xH200 host, examples/ep_bench.py --profile).
constexpr u32 EP_UNROLL = 4;
constexpr u32 EP_COPY_UNROLL = 8;

// Copies `bytes` at `src` to each non-null `dst` held by lanes 0..fan-1, with this warp. With
// `coherent`, plain loads instead of the read-only cache's: for rows that land while the kernel
// runs.
__device__ __forceinline__ void warp_copy_fanout(const unsigned char* src, u64 bytes, unsigned char* mine, u32 fan,
                                                 bool coherent = false) {
  const u32 lane = threadIdx.x & 31u;
  if (((bytes | reinterpret_cast<u64>(src)) & 15u) == 0) {
    const int4* from = reinterpret_cast<const int4*>(src);
    const u64 pieces = bytes / 16;
    for (u64 base = 0; base < pieces; base += 32 * EP_COPY_UNROLL) {
      int4 v[EP_COPY_UNROLL];
#pragma unroll
      for (u32 u = 0; u < EP_COPY_UNROLL; ++u) {
        const u64 j = base + u * 32 + lane;
        if (j < pieces) v[u] = coherent ? from[j] : __ldg(from + j);
      }
      for (u32 f = 0; f < fan; ++f) {
        int4* to = reinterpret_cast<int4*>(__shfl_sync(0xffffffffu, reinterpret_cast<u64>(mine), f));
        if (to == nullptr) continue;
#pragma unroll
        for (u32 u = 0; u < EP_COPY_UNROLL; ++u) {
          const u64 j = base + u * 32 + lane;
          if (j < pieces) to[j] = v[u];
        }
      }
    }
  } else {
    // Every lane runs every step (the shuffles need the whole warp).
    for (u64 base = 0; base < bytes; base += 32) {
      const u64 j = base + lane;
      const unsigned char v = j < bytes ? src[j] : 0;
      for (u32 f = 0; f < fan; ++f) {
        unsigned char* to = reinterpret_cast<unsigned char*>(__shfl_sync(0xffffffffu, reinterpret_cast<u64>(mine), f));
        if (to != nullptr && j < bytes) to[j] = v;
      }
    }
  }
}

__device__ __forceinline__ u64 global_warp() { return (u64(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; }
__device__ __forceinline__ u64 warp_count() { return (u64(gridDim.x) * blockDim.x) >> 5; }

// What ep_pack_tokens needs to put each chunk of the rows as soon as it is packed (chunks = 0:
// it puts nothing, the host launches the puts after it).
struct ChunkPuts {
  const DeviceTable* table;
  u32 me, chunks, dst_window, src_window, sig;
  u64 per_chunk;             // tokens a chunk: [c * per_chunk, (c + 1) * per_chunk)
  const i64* prefix;         // [chunks + 1][ranks]: rows of the segment to r before chunk c
  const i64* segments;       // [ranks][3]: (bytes, source offset, destination offset) of the whole segment
  unsigned int* done;        // [chunks + 1]: tokens of chunk c packed, then of all (zeroed by ep_layout_scan)
  int* status;
  const i64* meta_segments;  // [ranks][3]: the metadata segments, put after the last token (null: not here)
  u32 meta_dst_window, meta_src_window, meta_sig;
};

// Asks the proxy to move chunk c of this rank's segment to every other rank, with chunk c's own
// signal p.sig + c (a signal alone where the chunk has no row for that rank), so the receiver can
// copy a chunk out as soon as it arrived.
__device__ void put_chunk(const ChunkPuts& p, u32 ranks, u64 row_bytes, u32 c) {
  for (u32 r = 0; r < ranks; ++r) {
    if (r == p.me) continue;
    const i64 before = p.prefix[u64(c) * ranks + r];
    const i64 count = p.prefix[u64(c + 1) * ranks + r] - before;
    Status s;
    if (count <= 0) {
      s = signal(p.table, r, p.sig + c, SIGNAL_ADD, 1);
    } else {
      const u64 offset = u64(before) * row_bytes;
      s = put(p.table, p.dst_window, r, u64(p.segments[3 * r + 2]) + offset, p.src_window,
              u64(p.segments[3 * r + 1]) + offset, u64(count) * row_bytes, SIGNAL_ADD, p.sig + c, 1);
    }
    if (s != OK) record_failure(p.status, 2, r, int(s));
  }
}

// The metadata segments to every other rank, once every token's metadata row is written (with
// chunks; ep_put_segments' launch otherwise), each with its signal; nothing once this call
// recorded a failure (as ep_put_segments does: the offsets may come from an incomplete matrix).
__device__ void put_meta(const ChunkPuts& p, u32 ranks) {
  if (p.meta_segments == nullptr || failed(p.status)) return;
  for (u32 r = 0; r < ranks; ++r) {
    if (r != p.me) put_segment(p.table, r, p.meta_segments, p.meta_dst_window, p.meta_src_window, p.meta_sig, 2, p.status);
  }
}

// dispatch's packing: token t's row of `x` to bases[r] + rows[t * ranks + r] * row_bytes and its
// metadata row (k int64 expert ids, k float32 weights, the int32 token index, then for fp8 rows
// the token's `scale_words` float32 scales, 0 words otherwise) to
// meta_bases[r] + rows[...] * meta_bytes, for every rank r it goes to (ranks <= 32). With chunks,
// the warp that packs a chunk's last token puts that chunk (every warp makes its stores visible
// system-wide before it counts its token), so the copy engines start while later chunks are
// still being packed; thread 0 puts the chunks that have no token at the start.
extern "C" __global__ void __launch_bounds__(1024) ep_pack_tokens(const unsigned char* x, u64 row_bytes, const i64* topk_idx,
                                          const float* topk_weights, u32 k, u64 tokens, u32 ranks, const i64* rows,
                                          const u64* x_bases, const u64* meta_bases, u64 meta_bytes,
                                          const float* scales, u32 scale_words, ChunkPuts chunk) {
  const u32 lane = threadIdx.x & 31u;
  if (chunk.chunks > 0 && blockIdx.x == 0 && threadIdx.x == 0) {
    for (u32 c = 0; c < chunk.chunks; ++c) {
      if (u64(c) * chunk.per_chunk >= tokens) put_chunk(chunk, ranks, row_bytes, c);
    }
    if (tokens == 0) put_meta(chunk, ranks);
  }
  for (u64 t = global_warp(); t < tokens; t += warp_count()) {
    i64 row = -1;
    unsigned char* mine = nullptr;
    if (lane < ranks) {
      row = rows[t * ranks + lane];
      if (row >= 0) mine = reinterpret_cast<unsigned char*>(x_bases[lane] + u64(row) * row_bytes);
    }
    warp_copy_fanout(x + t * row_bytes, row_bytes, mine, ranks);
    for (u32 f = 0; f < ranks; ++f) {
      const i64 r = __shfl_sync(0xffffffffu, row, f);
      if (r < 0) continue;
      unsigned char* meta = reinterpret_cast<unsigned char*>(meta_bases[f] + u64(r) * meta_bytes);
      for (u32 j = lane; j < k; j += 32) {
        reinterpret_cast<i64*>(meta)[j] = topk_idx[t * k + j];
        reinterpret_cast<float*>(meta + 8 * u64(k))[j] = topk_weights[t * k + j];
      }
      if (lane == 0) *reinterpret_cast<int*>(meta + 12 * u64(k)) = int(t);
      // fp8 rows: the token's per-block scales ride in its metadata row, after the index.
      float* scale_row = reinterpret_cast<float*>(meta + 12 * u64(k) + 4);
      for (u32 j = lane; j < scale_words; j += 32) scale_row[j] = scales[t * scale_words + j];
    }
    if (chunk.chunks > 0) {
      __threadfence_system();
      __syncwarp();
      if (lane == 0) {
        const u32 c = u32(t / chunk.per_chunk);
        const u64 first = u64(c) * chunk.per_chunk;
        const u64 size = tokens - first < chunk.per_chunk ? tokens - first : chunk.per_chunk;
        if (u64(atomicAdd(chunk.done + c, 1u)) + 1 == size) put_chunk(chunk, ranks, row_bytes, c);
        if (u64(atomicAdd(chunk.done + chunk.chunks, 1u)) + 1 == tokens) put_meta(chunk, ranks);
      }
    }
  }
}

// What ep_combine_send needs to put each chunk of combine's rows as soon as it is copied
// (chunks = 0: it puts nothing, the host launches one put a peer after it).
struct CombinePuts {
  const DeviceTable* table;
  u32 me, chunks, dst_window, src_window, sig;
  const i64* segments;  // [ranks][3]: (bytes, offset here, offset at the peer) of the rows back to each rank
  unsigned int* done;   // [chunks]: rows of chunk c copied; the last row's warp resets it to 0
  int* status;
};

// Asks the proxy to move the part of chunk c (received rows [lo, hi)) that answers each other
// rank, with its own signal p.sig + c (a signal alone where the chunk holds none of that rank's
// rows), so the receiver can tell which chunks arrived, in whatever order. A rank's rows are one
// contiguous range of the receive order, at the same rows of the send window, so a chunk's part
// for a rank is one put.
__device__ void put_combine_chunk(const CombinePuts& p, u32 ranks, u64 row_bytes, u64 lo, u64 hi, u32 c) {
  for (u32 r = 0; r < ranks; ++r) {
    if (r == p.me) continue;
    const u64 first = u64(p.segments[3 * r + 1]) / row_bytes;
    const u64 end = first + u64(p.segments[3 * r]) / row_bytes;
    const u64 a = lo > first ? lo : first;
    const u64 b = hi < end ? hi : end;
    Status s;
    if (b <= a) {
      s = signal(p.table, r, p.sig + c, SIGNAL_ADD, 1);
    } else {
      s = put(p.table, p.dst_window, r, u64(p.segments[3 * r + 2]) + (a - first) * row_bytes, p.src_window,
              a * row_bytes, (b - a) * row_bytes, SIGNAL_ADD, p.sig + c, 1);
    }
    if (s != OK) record_failure(p.status, 4, r, int(s));
  }
}

// combine's sending side: received row i of `x` (the experts' output, rows in the receive
// order) to row i of the send window `send`, for the rows of other ranks (this rank's own are
// summed straight from `x`), for i < min(*n_rows, n_max). The warps walk only the other ranks'
// rows, in rounds in receive order, so with chunks the rows [c * S, (c + 1) * S) of that walk
// (S = ceil(m / chunks), m rows to send) are copied early for small c and put as soon as they are
// copied: the copy engines move a chunk while later ones are still being copied.
extern "C" __global__ void __launch_bounds__(1024) ep_combine_send(const unsigned char* x, u64 row_bytes, const i64* n_rows,
                                                                   u64 n_max, u32 ranks, unsigned char* send,
                                                                   CombinePuts p) {
  const i64 given = *n_rows;
  const u64 n = given < 0 ? 0 : (u64(given) < n_max ? u64(given) : n_max);
  // This rank's own rows [own_first, own_end) are not sent; the walk skips them.
  const u64 own_first_raw = u64(p.segments[3 * p.me + 1]) / row_bytes;
  const u64 own_first = own_first_raw < n ? own_first_raw : n;
  const u64 own_count_raw = u64(p.segments[3 * p.me]) / row_bytes;
  const u64 own_count = own_count_raw < n - own_first ? own_count_raw : n - own_first;
  const u64 m = n - own_count;
  const u64 per = p.chunks > 0 && m > 0 ? (m + p.chunks - 1) / p.chunks : 1;
  const u32 lane = threadIdx.x & 31u;
  // Walk position j -> received row i.
  auto row_of = [&](u64 j) { return j < own_first ? j : j + own_count; };
  if (p.chunks > 0 && blockIdx.x == 0 && threadIdx.x == 0) {
    for (u32 c = 0; c < p.chunks; ++c) {
      if (u64(c) * per >= m) put_combine_chunk(p, ranks, row_bytes, n, n, c);
    }
  }
  for (u64 j = global_warp(); j < m; j += warp_count()) {
    const u64 i = row_of(j);
    warp_copy_fanout(x + i * row_bytes, row_bytes, lane == 0 ? send + i * row_bytes : nullptr, 1);
    if (p.chunks > 0) {
      __threadfence_system();
      __syncwarp();
      if (lane == 0) {
        const u64 c = j / per;
        const u64 lo = c * per;
        const u64 hi = lo + per < m ? lo + per : m;
        if (u64(atomicAdd(p.done + c, 1u)) + 1 == hi - lo) {
          p.done[c] = 0;  // every row of the chunk counted: ready for the next call
          // The walk's [lo, hi) in received rows: own rows inside it are skipped by the puts.
          put_combine_chunk(p, ranks, row_bytes, row_of(lo), hi == m ? n : row_of(hi), u32(c));
        }
      }
    }
  }
}

// ---- The plan, on the GPU ----------------------------------------------------------------

// Publishes `count` values to pinned host memory the host polls (an exact-size output needs the
// number of rows on the host): host[2..] the values, host[1] the status word so far, then, after a
// system fence, host[0] = seq, which the host waits for. One thread. No copy, event or host
// synchronisation: the host sees the values as soon as the kernel stored them.
__device__ void publish_to_host(i64* host, u64 seq, const i64* values, u32 count, const int* status) {
  if (host == nullptr) return;
  for (u32 i = 0; i < count; ++i) host[2 + i] = values[i];
  host[1] = i64(*reinterpret_cast<const volatile int*>(status));
  __threadfence_system();
  *reinterpret_cast<volatile i64*>(host) = i64(seq);
}

// Block-wide exclusive scan of one value a thread (blockDim.x a multiple of 32, at most 1024);
// `*total` gets the block's sum. Every thread of the block must call it.
__device__ u32 block_exclusive_scan(u32 v, u32* total) {
  __shared__ u32 warp_sums[32];
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  u32 x = v;
  for (u32 d = 1; d < 32; d <<= 1) {
    const u32 y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    u32 w = lane < warps ? warp_sums[lane] : 0;
    for (u32 d = 1; d < 32; d <<= 1) {
      const u32 y = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += y;
    }
    warp_sums[lane] = w;
  }
  __syncthreads();
  const u32 before = warp == 0 ? 0 : warp_sums[warp - 1];
  *total = warp_sums[warps - 1];
  __syncthreads();
  return before + x - v;
}

#define EP_MAX_EXPERTS 4096

// The layout in two kernels: the per-token work spread over many blocks (one block alone read
// topk_idx three times and took about 53 us of a 4096-token dispatch on the 2xH200 host), then
// one block for the scans, which only read a 32-bit mask a token.
#define EP_LAYOUT_THREADS 256

// EP_LAYOUT_THREADS tokens a block: masks[t] gets bit r set when token t has an expert on rank r
// (a token counts once for a rank however many of its experts live there), and partial[b][e] the
// number of block b's (token, slot) pairs naming expert e. An expert id out of range is
// recorded as a bad argument (stage 5) and ignored.
extern "C" __global__ void __launch_bounds__(EP_LAYOUT_THREADS) ep_layout_tokens(const i64* topk_idx, u64 tokens, u32 k,
                                                                                 u32 ranks, u32 experts, u32* masks,
                                                                                 i64* partial, int* status) {
  __shared__ unsigned int per_expert[EP_MAX_EXPERTS];
  const u32 per_rank = experts / ranks;
  for (u32 e = threadIdx.x; e < experts; e += blockDim.x) per_expert[e] = 0;
  __syncthreads();
  const u64 t = u64(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < tokens) {
    u32 mask = 0;
    for (u32 j = 0; j < k; ++j) {
      const i64 e = topk_idx[t * k + j];
      if (e < 0) continue;
      if (e >= i64(experts)) {
        record_failure(status, 5, u32(t), int(BAD_ARGUMENT));
        continue;
      }
      atomicAdd(&per_expert[e], 1u);
      mask |= 1u << (u32(e) / per_rank);
    }
    masks[t] = mask;
  }
  __syncthreads();
  for (u32 e = threadIdx.x; e < experts; e += blockDim.x) partial[u64(blockIdx.x) * experts + e] = i64(per_expert[e]);
}

// One block (1024 threads), after ep_layout_tokens (`blocks` of them): this rank's count row
// (tokens per rank, then per expert: the row the count exchange sends) and, per (token, rank),
// the token's index among those going to that rank (-1 when it does not); with chunks, the rows
// to each rank before each chunk boundary ([chunks + 1][ranks]) and the chunks' packed-token
// counts zeroed.
extern "C" __global__ void __launch_bounds__(1024) ep_layout_scan(const u32* masks, u64 tokens, u32 ranks, u32 experts,
                                                                  const i64* partial, u32 blocks, i64* within,
                                                                  i64* count_row, u32 chunks, u64 per_chunk,
                                                                  i64* chunk_prefix, unsigned int* chunk_done,
                                                                  i64* row_prefix, const DeviceTable* t, u32 me,
                                                                  const i64* exchange, u32 count_window, u32 count_sig,
                                                                  int* status) {
  // chunk_done[chunks] counts every packed token (ep_pack_tokens puts the metadata after the last).
  for (u32 c = threadIdx.x; c < chunks + (chunks > 0 ? 1u : 0u); c += blockDim.x) chunk_done[c] = 0;
  for (u32 e = threadIdx.x; e < experts; e += blockDim.x) {
    i64 sum = 0;
    for (u32 b = 0; b < blocks; ++b) sum += partial[u64(b) * experts + e];
    count_row[ranks + e] = sum;
  }
  const u64 chunk = (tokens + blockDim.x - 1) / blockDim.x;
  const u64 t0 = u64(threadIdx.x) * chunk;
  const u64 t1 = t0 + chunk < tokens ? t0 + chunk : tokens;
  for (u32 r = 0; r < ranks; ++r) {
    u32 mine = 0;
    for (u64 t = t0; t < t1; ++t) mine += (masks[t] >> r) & 1u;
    u32 total;
    u32 next = block_exclusive_scan(mine, &total);
    for (u64 t = t0; t < t1; ++t) {
      // A chunk starting at t: the rows before it.
      if (chunks > 0 && t % per_chunk == 0) chunk_prefix[(t / per_chunk) * ranks + r] = i64(next);
      within[t * ranks + r] = (masks[t] >> r) & 1u ? i64(next++) : -1;
    }
    if (threadIdx.x == 0) {
      count_row[r] = i64(total);
      // Chunk boundaries at or past the last token: every row is before them.
      for (u32 c = 0; c <= chunks; ++c) {
        if (chunks > 0 && u64(c) * per_chunk >= tokens) chunk_prefix[u64(c) * ranks + r] = i64(total);
      }
    }
  }
  // The prefixes travel in the count row too ([chunks + 1][ranks]; one chunk of everything when
  // chunks is 0), so a receiver knows in which chunk each of its rows comes (ep_copy_out).
  __syncthreads();
  for (u32 i = threadIdx.x; i < ((chunks > 0 ? chunks : 1) + 1) * ranks; i += blockDim.x) {
    const u32 c = i / ranks, r = i % ranks;
    row_prefix[i] = chunks > 0 ? chunk_prefix[i] : (c == 0 ? 0 : count_row[r]);
  }
  // The count exchange (exchange non-null: ep_put_segments' puts, one launch fewer): every
  // thread makes its part of the row visible system-wide, then one thread a peer asks the proxy
  // to put the row there, with the signal the peers wait for.
  if (exchange != nullptr) {
    __threadfence_system();
    __syncthreads();
    const u32 r = threadIdx.x;
    if (r < ranks && r != me && !failed(status)) put_segment(t, r, exchange, count_window, count_window, count_sig, 1, status);
  }
}

// One block: everything dispatch and combine need from the exchanged count matrix
// ([ranks][ranks + experts]; C[s][r] = matrix[s][r] tokens go from s to r), as _ep_plan.plan
// computes it with torch (the CPU tests check that one against a reference):
//   rows[t][r]     where token t goes: r's segment of the send window (r != me) or this rank's
//                  own segment of the receive window (r == me); -1 when it does not go to r.
//                  Combine's answers land at the same rows: the send layout in combine's receive
//                  window for r != me, the receive order of combine's input for r == me;
//   puts_x, puts_meta, comb_puts [ranks][3]: (bytes, source offset, destination offset);
//   summary        [rows received, then per local expert the tokens received], also published
//                  to `host` (pinned memory the host polls; null: not needed) under `seq`;
//   walk [ranks][2] where combine's answers from each rank come in its chunks (ep_reduce_*).
// With `host`, the receive rows each sender's dispatch chunks land in are published after the
// summary, at host[2 + 1 + experts / ranks + c * ranks + s]: the first row of sender s's chunk c
// in the receive window (c <= dispatch_chunks: the last is the end of s's segment), so the host
// can queue a copy-engine copy of each chunk's rows behind that chunk's signal (ep.py's
// _copy_out_by_chunk). The bounds come from the senders' chunk prefixes in the count rows
// (ep_layout_scan's row_prefix).
extern "C" __global__ void __launch_bounds__(1024) ep_plan(const i64* matrix, u32 ranks, u32 experts, u32 me, u64 tokens, const i64* within,
                                   i64* rows, u64 row_bytes, u64 meta_bytes, u64 comb_row_bytes, i64* puts_x, i64* puts_meta,
                                   i64* comb_puts, i64* summary, i64* host, u64 seq, int* status,
                                   u32 comb_chunks, i64* walk, u64 width, u32 dispatch_chunks,
                                   const DeviceTable* t, u32 count_sig, u64* state, u32 count_slot, u64 timeout_ns,
                                   u64* bump) {
  __shared__ i64 send_me[64], recv_me[64], recv_col[64], send_col[64], from[64];
  // The count exchange's wait (state non-null: ep_wait's, one launch fewer): this call's epoch,
  // then every other rank's row, before any thread reads the matrix. `bump` (non-null) is the
  // epoch of dispatch's chunk signals, bumped for this call here so that no kernel of its own
  // is launched for it (ep_copy_out reads it after this kernel).
  if (state != nullptr) {
    if (threadIdx.x == 0) {
      const u64 epoch = ++state[count_slot];
      if (!failed(status)) wait_each_peer(t, me, ranks, count_sig, epoch, timeout_ns, 1, status);
    }
    __syncthreads();
  }
  if (bump != nullptr && threadIdx.x == 0) ++*bump;
  if (threadIdx.x == 0) {
    i64 a = 0, c = 0;
    for (u32 r = 0; r < ranks; ++r) {
      send_me[r] = a;  // sum of C[me][r' < r]
      a += matrix[u64(me) * width + r];
      recv_col[r] = c;  // sum of C[s' < r][me]
      from[r] = matrix[u64(r) * width + me];
      c += from[r];
      i64 b = 0, d = 0;
      for (u32 s = 0; s < me; ++s) b += matrix[u64(s) * width + r];
      recv_me[r] = b;  // sum of C[s < me][r]
      for (u32 q = 0; q < me; ++q) d += matrix[u64(r) * width + q];
      send_col[r] = d;  // sum of C[r][q < me]
    }
    summary[0] = c;
  }
  __syncthreads();
  for (u64 i = threadIdx.x; i < tokens * ranks; i += blockDim.x) {
    const u32 r = u32(i % ranks);
    const i64 w = within[i];
    rows[i] = w < 0 ? -1 : (r == me ? recv_me[me] + w : send_me[r] + w);
  }
  if (threadIdx.x < ranks) {
    const u32 r = threadIdx.x;
    const i64 count = matrix[u64(me) * width + r];
    puts_x[3 * r] = count * i64(row_bytes);
    puts_x[3 * r + 1] = send_me[r] * i64(row_bytes);
    puts_x[3 * r + 2] = recv_me[r] * i64(row_bytes);
    puts_meta[3 * r] = count * i64(meta_bytes);
    puts_meta[3 * r + 1] = send_me[r] * i64(meta_bytes);
    puts_meta[3 * r + 2] = recv_me[r] * i64(meta_bytes);
    // Combine's rows are the buffer's dtype (comb_row_bytes), also when dispatch moved fp8 rows.
    comb_puts[3 * r] = from[r] * i64(comb_row_bytes);
    comb_puts[3 * r + 1] = recv_col[r] * i64(comb_row_bytes);
    comb_puts[3 * r + 2] = send_col[r] * i64(comb_row_bytes);
    // Where this rank's answers from r sit in r's combine walk (ep_combine_send: r's received
    // rows without its own), and r's chunk size: answer row j here (in r's segment of combine's
    // receive window) comes in r's chunk (j + walk[2r]) / walk[2r + 1].
    i64 received = 0, own_first = 0;
    for (u32 s = 0; s < ranks; ++s) {
      const i64 c = matrix[u64(s) * width + r];
      if (s < r) own_first += c;
      received += c;
    }
    const i64 own_count = matrix[u64(r) * width + r];
    const i64 m = received - own_count;
    const i64 start = recv_me[r] < own_first ? recv_me[r] : recv_me[r] - own_count;
    walk[2 * r] = start - send_me[r];
    walk[2 * r + 1] = comb_chunks > 0 && m > 0 ? (m + comb_chunks - 1) / comb_chunks : 1;
  }
  const u32 per_rank = experts / ranks;
  for (u32 e = threadIdx.x; e < per_rank; e += blockDim.x) {
    i64 sum = 0;
    for (u32 s = 0; s < ranks; ++s) sum += matrix[u64(s) * width + ranks + u64(me) * per_rank + e];
    summary[1 + e] = sum;
  }
  __syncthreads();
  if (threadIdx.x == 0 && host != nullptr) {
    // Before publish_to_host's fence and sequence store, so the host sees them with the summary.
    i64* bounds = host + 2 + 1 + per_rank;
    for (u32 c = 0; c <= dispatch_chunks; ++c) {
      for (u32 s = 0; s < ranks; ++s) {
        const i64 before = matrix[u64(s) * width + ranks + experts + u64(c) * ranks + me];
        bounds[u64(c) * ranks + s] = recv_col[s] + before;
      }
    }
  }
  if (threadIdx.x == 0) publish_to_host(host, seq, summary, 1 + per_rank, status);
}

// The received metadata rows as DeepEP gives them: expert ids local to this rank (-1 for
// experts elsewhere, weight 0), the weights, each row's token index at its source and, for fp8
// rows, its scales; rows at or beyond summary[0] (num_worst_tokens padding) get -1, 0, -1 and 0.
extern "C" __global__ void ep_unpack_meta(const unsigned char* meta, u64 meta_bytes, u32 k, u32 me, u32 per_rank,
                                          const i64* summary, u64 rows_out, i64* out_idx, float* out_weights,
                                          int* out_src, u32 scale_words, float* out_scales) {
  const i64 total = summary[0];
  const i64 lo = i64(me) * per_rank;
  for (u64 i = u64(blockIdx.x) * blockDim.x + threadIdx.x; i < rows_out * (k + 1); i += u64(gridDim.x) * blockDim.x) {
    const u64 row = i / (k + 1), j = i % (k + 1);
    const bool live = i64(row) < total;
    const unsigned char* m = meta + row * meta_bytes;
    if (j == k) {
      out_src[row] = live ? *reinterpret_cast<const int*>(m + 12 * u64(k)) : -1;
      continue;
    }
    const i64 e = live ? reinterpret_cast<const i64*>(m)[j] : -1;
    const bool local = e >= lo && e < lo + per_rank;
    out_idx[row * k + j] = local ? e - lo : -1;
    out_weights[row * k + j] = local ? reinterpret_cast<const float*>(m + 8 * u64(k))[j] : 0.0f;
  }
  // fp8 rows: each row's scales (`scale_words` float32 after the token index; 0 for padding).
  for (u64 i = u64(blockIdx.x) * blockDim.x + threadIdx.x; i < rows_out * scale_words; i += u64(gridDim.x) * blockDim.x) {
    const u64 row = i / scale_words, j = i % scale_words;
    const float* scale_row = reinterpret_cast<const float*>(meta + row * meta_bytes + 12 * u64(k) + 4);
    out_scales[i] = i64(row) < total ? scale_row[j] : 0.0f;
  }
}

// One thread per rank r != me: asks the proxy to copy args[r] = {bytes, src_offset, dst_offset}
// from this rank's `src_window` to r's `dst_window`, then to add 1 to r's signal `sig`; a peer
// with no bytes gets the signal alone, so the receiver's count of signals does not depend on
// the data. Launch with at least `ranks` threads in one block.
extern "C" __global__ void ep_put_segments(const DeviceTable* t, u32 me, u32 ranks, const i64* args, u32 dst_window,
                                           u32 src_window, u32 sig, int stage, int* status) {
  const u32 r = threadIdx.x;
  if (r >= ranks || r == me || failed(status)) return;
  put_segment(t, r, args, dst_window, src_window, sig, stage, status);
}


// One thread per rank r != me: adds 1 to r's signal `sig` (no data).
extern "C" __global__ void ep_signal_peers(const DeviceTable* t, u32 me, u32 ranks, u32 sig, int stage, int* status) {
  const u32 r = threadIdx.x;
  if (r >= ranks || r == me || failed(status)) return;
  const Status s = signal(t, r, sig, SIGNAL_ADD, 1);
  if (s != OK) record_failure(status, stage, r, int(s));
}

// One thread: epoch = ++state[slot]; when epoch > lag, waits until signal `sig` reaches
// per_peer * (ranks - 1) * (epoch - lag), i.e. until every other rank's slot has reached
// per_peer * (epoch - lag). The epoch lives on the GPU, so a CUDA graph replays it correctly.
// On a timeout, the first rank whose slot is short is recorded.
extern "C" __global__ void ep_wait(const DeviceTable* t, u32 me, u32 ranks, u32 sig, u64 per_peer, u64 lag, u64* state,
                                   u32 slot, u64 timeout_ns, int stage, int* status) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const u64 epoch = ++state[slot];
  if (epoch <= lag || failed(status)) return;
  wait_each_peer(t, me, ranks, sig, per_peer * (epoch - lag), timeout_ns, stage, status);
}

// One thread: waits, bounded, until every other rank raised signal `sig` once per call so far,
// i.e. until each of its slots reached *epoch (a slot's epoch, already bumped for this call by an
// ep_wait, or for dispatch's chunks by ep_plan). For signals raised once a call and waited for one by one within a call (dispatch's
// chunks: the stream copies each chunk's rows out as soon as its signal is in).
extern "C" __global__ void ep_wait_epoch(const DeviceTable* t, u32 me, u32 ranks, u32 sig, const u64* epoch, u64 timeout_ns,
                                         int stage, int* status) {
  if (threadIdx.x != 0 || blockIdx.x != 0 || failed(status)) return;
  wait_each_peer(t, me, ranks, sig, *reinterpret_cast<const volatile u64*>(epoch), timeout_ns, stage, status);
}

// The pipelined combine: a reduce that sums each token as soon as its answers arrived, instead of
// after every chunk from every rank (walk null: the host already waited for all of them).
struct ChunkWait {
  const DeviceTable* table;
  const i64* walk;      // [ranks][2] (ep_plan): answer row j from rank r comes in its chunk (j + walk[2r]) / walk[2r+1]
  const u64* epoch;     // this call's epoch (bumped before by ep_wait, or by ep_plan for dispatch's chunks)
  u64 timeout_ns;
  int* status;
  u32 sig_base;         // chunk c's signal is sig_base + c
};

// Lane 0 waits until every other rank's chunk holding token tok's answer arrived (its signal
// reached this call's epoch), then the warp goes on. Bounded by `deadline` (%globaltimer); a
// timeout is recorded (stage 4) and not waited for again.
__device__ void wait_answers(const ChunkWait& w, const i64* rows, u64 tok, u32 fan, u32 me, u64 deadline) {
  if (w.walk == nullptr) return;
  if ((threadIdx.x & 31u) == 0) {
    const u64 epoch = *reinterpret_cast<const volatile u64*>(w.epoch);
    const u64* slots = reinterpret_cast<const u64*>(w.table->signals);
    const u32 world = w.table->world;
    for (u32 r = 0; r < fan; ++r) {
      const i64 row = rows[tok * fan + r];
      if (r == me || row < 0) continue;
      const u64 c = u64(row + w.walk[2 * r]) / u64(w.walk[2 * r + 1]);
      const u64* slot = slots + (u64(w.sig_base) + c) * world + r;
      while (detail::load_acquire_sys(slot) < epoch && !failed(w.status)) {
        if (detail::now_ns() > deadline) {
          record_failure(w.status, 4, r, int(TIMEOUT));
          break;
        }
        detail::sleep_for(128);
      }
    }
  }
  __syncwarp();
}

// out[t] = sum over f of (f == me ? own : src)[rows[t * fan + f]] (rows < 0 skipped), in fp32,
// for bf16 rows of `hidden` elements (a multiple of 8): the other ranks' answers from combine's
// receive window, this rank's own from combine's input. A warp a token; fan <= 32.
extern "C" __global__ void __launch_bounds__(1024) ep_reduce_bf16(unsigned short* out, u64 tokens, u64 hidden, u32 fan, const i64* rows,
                                          const unsigned short* src, u32 me, const unsigned short* own, ChunkWait w) {
  const u32 lane = threadIdx.x & 31u;
  const u64 pieces = hidden / 8;
  const u64 deadline = detail::now_ns() + w.timeout_ns;
  for (u64 tok = global_warp(); tok < tokens; tok += warp_count()) {
    wait_answers(w, rows, tok, fan, me, deadline);
    const unsigned short* mine = nullptr;
    if (lane < fan) {
      const i64 r = rows[tok * fan + lane];
      if (r >= 0) mine = (lane == me ? own : src) + u64(r) * hidden;
    }
    int4* dst = reinterpret_cast<int4*>(out + tok * hidden);
    for (u64 base = 0; base < pieces; base += 32 * EP_UNROLL) {
      float acc[EP_UNROLL][8];
#pragma unroll
      for (u32 u = 0; u < EP_UNROLL; ++u)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[u][e] = 0.0f;
      for (u32 f = 0; f < fan; ++f) {
        const int4* from = reinterpret_cast<const int4*>(__shfl_sync(0xffffffffu, reinterpret_cast<u64>(mine), f));
        if (from == nullptr) continue;
        int4 v[EP_UNROLL];
#pragma unroll
        for (u32 u = 0; u < EP_UNROLL; ++u) {
          const u64 j = base + u * 32 + lane;
          if (j < pieces) v[u] = from[j];  // not __ldg: answers land while this runs
        }
#pragma unroll
        for (u32 u = 0; u < EP_UNROLL; ++u) {
          const unsigned short* h = reinterpret_cast<const unsigned short*>(&v[u]);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[u][e] += bf16_to_f32(h[e]);
        }
      }
#pragma unroll
      for (u32 u = 0; u < EP_UNROLL; ++u) {
        const u64 j = base + u * 32 + lane;
        if (j >= pieces) continue;
        int4 packed;
        unsigned short* p = reinterpret_cast<unsigned short*>(&packed);
#pragma unroll
        for (int e = 0; e < 8; ++e) p[e] = f32_to_bf16(acc[u][e]);
        dst[j] = packed;
      }
    }
  }
}

// As ep_reduce_bf16 for float32 rows (hidden a multiple of 4).
extern "C" __global__ void __launch_bounds__(1024) ep_reduce_f32(float* out, u64 tokens, u64 hidden, u32 fan, const i64* rows,
                                         const float* src, u32 me, const float* own, ChunkWait w) {
  const u32 lane = threadIdx.x & 31u;
  const u64 pieces = hidden / 4;
  const u64 deadline = detail::now_ns() + w.timeout_ns;
  for (u64 tok = global_warp(); tok < tokens; tok += warp_count()) {
    wait_answers(w, rows, tok, fan, me, deadline);
    const float* mine = nullptr;
    if (lane < fan) {
      const i64 r = rows[tok * fan + lane];
      if (r >= 0) mine = (lane == me ? own : src) + u64(r) * hidden;
    }
    float4* dst = reinterpret_cast<float4*>(out + tok * hidden);
    for (u64 base = 0; base < pieces; base += 32) {
      const u64 j = base + lane;
      float4 acc = make_float4(0, 0, 0, 0);
      for (u32 f = 0; f < fan; ++f) {
        const float4* from = reinterpret_cast<const float4*>(__shfl_sync(0xffffffffu, reinterpret_cast<u64>(mine), f));
        if (from == nullptr || j >= pieces) continue;
        const float4 v = from[j];
        acc.x += v.x;
        acc.y += v.y;
        acc.z += v.z;
        acc.w += v.w;
      }
      if (j < pieces) dst[j] = acc;
    }
  }
}

// dispatch's output, pipelined: out row i = receive-window row i for i < min(rows received,
// n_out), copied as soon as the chunk of its sender that holds it arrived (signal sig_base + c
// from that rank reached this call's epoch); this rank's own rows at once. out null: only the
// waits (views of the window are returned). The matrix rows (stride wide) end with each sender's
// chunk prefixes [(chunks + 1)][ranks] (ep_layout_scan): chunk c of sender s holds rows
// [prefix_s[c][me], prefix_s[c + 1][me]) of s's segment here. A warp a row: this rank's own
// rows first (packed before this kernel started, so they are copied while the copy engines
// still move the other ranks' chunks), then the other senders' rows in receive order, so the
// warps wait for a chunk only once the rows already here are copied.
extern "C" __global__ void __launch_bounds__(1024) ep_copy_out(const unsigned char* recv, unsigned char* out, u64 row_bytes,
                                                               u64 n_out, const i64* matrix, u64 stride, u32 ranks,
                                                               u32 experts, u32 me, u32 chunks, ChunkWait w) {
  __shared__ i64 seg_start[65];
  if (threadIdx.x == 0) {
    i64 at = 0;
    for (u32 s = 0; s < ranks; ++s) {
      seg_start[s] = at;
      at += matrix[u64(s) * stride + me];
    }
    seg_start[ranks] = at;
  }
  __syncthreads();
  const u64 total = u64(seg_start[ranks]);
  const u64 n = total < n_out ? total : n_out;
  const u64 deadline = detail::now_ns() + w.timeout_ns;
  const u64 epoch = *reinterpret_cast<const volatile u64*>(w.epoch);
  const u64* slots = reinterpret_cast<const u64*>(w.table->signals);
  const u32 world = w.table->world, lane = threadIdx.x & 31u;
  const u64 own_first = u64(seg_start[me]), own_rows = u64(seg_start[me + 1]) - own_first;
  for (u64 k = global_warp(); k < total; k += warp_count()) {
    // The k-th row in copy order: own rows, then the rows before them, then those after.
    const u64 other = k - own_rows;
    const u64 i = k < own_rows ? own_first + k : (other < own_first ? other : other + own_rows);
    if (i >= n) continue;  // past the caller's rows (warp-uniform: a warp a row)
    u32 s = 0;
    while (s + 1 < ranks && u64(seg_start[s + 1]) <= i) ++s;
    if (s != me && lane == 0) {
      const i64 j = i64(i) - seg_start[s];
      const i64* prefix = matrix + u64(s) * stride + ranks + experts;
      u32 c = 0;
      while (c + 1 < chunks && prefix[u64(c + 1) * ranks + me] <= j) ++c;
      const u64* slot = slots + (u64(w.sig_base) + c) * world + s;
      while (detail::load_acquire_sys(slot) < epoch && !failed(w.status)) {
        if (detail::now_ns() > deadline) {
          record_failure(w.status, 2, s, int(TIMEOUT));
          break;
        }
        detail::sleep_for(128);
      }
    }
    __syncwarp();
    if (out != nullptr) {
      warp_copy_fanout(recv + i * row_bytes, row_bytes, lane == 0 ? out + i * row_bytes : nullptr, 1, true);
    }
  }
}

// ---- all_to_all_v with split sizes on the GPU -----------------------------------------------

// One block: from the exchanged matrix (row s: rank s's split sizes, rows per destination), the
// segment of this rank to each rank r as (bytes, offset in the input, offset at r's receive
// window), r == me included (the local copy), and [rows received, rows from each rank].
extern "C" __global__ void ep_a2av_plan(const i64* matrix, u32 ranks, u32 width, u32 me, u64 row_bytes, i64* puts,
                                        i64* summary, i64* host, u64 seq, const int* status) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  i64 send = 0, total = 0;
  for (u32 r = 0; r < ranks; ++r) {
    i64 before = 0;
    for (u32 s = 0; s < me; ++s) before += matrix[u64(s) * width + r];
    const i64 count = matrix[u64(me) * width + r];
    puts[3 * r] = count * i64(row_bytes);
    puts[3 * r + 1] = send * i64(row_bytes);
    puts[3 * r + 2] = before * i64(row_bytes);
    send += count;
    const i64 from = matrix[u64(r) * width + me];
    summary[1 + r] = from;
    total += from;
  }
  summary[0] = total;
  publish_to_host(host, seq, summary, 1, status);
}

// Copies args[0] bytes from src + args[1] to dst + args[2] (args on the GPU), 16 bytes a thread
// a step where aligned.
extern "C" __global__ void __launch_bounds__(1024) ep_copy_segment(const unsigned char* src, unsigned char* dst,
                                                                   const i64* args) {
  const i64 bytes = args[0];
  if (bytes <= 0) return;
  const unsigned char* from = src + args[1];
  unsigned char* to = dst + args[2];
  const u64 n = u64(bytes);
  const u64 step = u64(gridDim.x) * blockDim.x;
  const u64 first = u64(blockIdx.x) * blockDim.x + threadIdx.x;
  if (((n | reinterpret_cast<u64>(from) | reinterpret_cast<u64>(to)) & 15u) == 0) {
    for (u64 j = first; j < n / 16; j += step) reinterpret_cast<int4*>(to)[j] = __ldg(reinterpret_cast<const int4*>(from) + j);
  } else {
    for (u64 j = first; j < n; j += step) to[j] = from[j];
  }
}


// ---- Low-latency mode: per-expert receive buffers filled by per-token direct stores ---------
// For decode-sized batches (DeepEP's low-latency mode): every (token, expert) row goes straight
// into its expert's fixed receive buffer at the expert's rank, stored by the warp that reads it
// over the GPUs' peer mapping (NVLink), so a dispatch is one kernel and a signal a rank, with no
// plan, no proxy turn and no host in between; CUDA graphs replay it with new routing. Slots: the
// buffer of local expert l has max_tokens rows per source rank, [(l * ranks + src) * max_tokens
// + slot]; a source fills its slots in the order its warps claim them (atomics), so the order of
// one source's rows for one expert is not the token order (each row carries its token).

// What every low-latency kernel needs (ep.py's _LowLatency, natural alignment on both sides).
struct LowLatency {
  const DeviceTable* table;
  u32 me, ranks, experts, k;
  u64 max_tokens;                 // slots a (local expert, source rank)
  u64 row_bytes;
  u32 recv_window, src_window, count_window, comb_window;
  u32 sig;                        // the signal this kernel raises at every other rank
  unsigned int* blocks_done;      // counts finished blocks; the last one resets it
  int* status;
};

// Window `window` of rank `peer` as this GPU reaches it: its own window, or the peer's through
// the peer mapping (null where the host mapped none).
__device__ __forceinline__ unsigned char* ll_base(const DeviceTable* t, u32 window, u32 peer) {
  const WindowEntry* w = detail::window_at(t, window);
  if (peer == t->rank) return reinterpret_cast<unsigned char*>(w->local_base);
  const u64 base = w->peer_bases == 0 ? 0 : reinterpret_cast<const u64*>(w->peer_bases)[peer];
  return reinterpret_cast<unsigned char*>(base);
}

// Whether this block is the grid's last to finish; every block's stores are made visible
// system-wide before it counts itself, so the last one can signal for all of them.
__device__ bool ll_last_block(unsigned int* blocks_done) {
  __shared__ bool last;
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(blocks_done, 1u) + 1 == gridDim.x;
    if (last) *blocks_done = 0;
  }
  __syncthreads();
  if (last) __threadfence_system();
  return last;
}

// Adds 1 to signal p.sig at every other rank, directly (its slot for this rank), after this
// block's earlier stores.
__device__ void ll_signal_others(const LowLatency& p, int stage) {
  for (u32 r = threadIdx.x; r < p.ranks; r += blockDim.x) {
    if (r == p.me) continue;
    const Status s = put_direct(p.table, p.recv_window, r, 0, nullptr, 0, SIGNAL_ADD, p.sig, 1);
    if (s != OK) record_failure(p.status, stage, r, int(s));
  }
}

// One thread per rank: probe[r] = 1 when rank r's four low-latency windows and its signal slots
// are mapped here (direct stores can reach it), else 0.
extern "C" __global__ void ep_ll_probe(const DeviceTable* t, u32 ranks, u32 first_window, int* probe) {
  const u32 r = threadIdx.x;
  if (r >= ranks) return;
  bool ok = r == t->rank || (t->peer_signals != 0 && reinterpret_cast<const u64*>(t->peer_signals)[r] != 0);
  for (u32 w = first_window; w < first_window + 4; ++w) ok = ok && ll_base(t, w, r) != nullptr;
  probe[r] = ok ? 1 : 0;
}

// Dispatch: one warp per (token, slot j) of topk_idx [tokens][k] with an expert e >= 0: the
// token's row into e's receive buffer at e's rank, at the next slot of this rank there
// (counts[e], a u32 per global expert, zeroed again by the last block), and (token * k + j) in
// the source-info window beside it. The last block stores each expert's count at the expert's
// rank (count window [local][src]), then signals every other rank.
extern "C" __global__ void __launch_bounds__(1024) ep_ll_dispatch(const unsigned char* x, const i64* topk_idx, u64 tokens,
                                                                 unsigned int* counts, LowLatency p) {
  const u32 lane = threadIdx.x & 31u;
  const u32 per_rank = p.experts / p.ranks;
  if (!failed(p.status)) {
    for (u64 item = global_warp(); item < tokens * p.k; item += warp_count()) {
      const i64 e = topk_idx[item];
      if (e < 0) continue;
      if (e >= i64(p.experts)) {
        if (lane == 0) record_failure(p.status, 5, u32(item / p.k), int(BAD_ARGUMENT));
        continue;
      }
      const u32 r = u32(e) / per_rank, local = u32(e) % per_rank;
      unsigned char* rows = ll_base(p.table, p.recv_window, r);
      unsigned char* info = ll_base(p.table, p.src_window, r);
      if (rows == nullptr || info == nullptr) {
        if (lane == 0) record_failure(p.status, 7, r, int(NOT_DIRECT));
        continue;
      }
      u32 slot = 0;
      if (lane == 0) slot = atomicAdd(counts + e, 1u);
      slot = __shfl_sync(0xffffffffu, slot, 0);
      if (slot >= p.max_tokens) {  // an expert named twice by one token, or more tokens than slots
        if (lane == 0) record_failure(p.status, 5, u32(item / p.k), int(BAD_ARGUMENT));
        continue;
      }
      const u64 cell = (u64(local) * p.ranks + p.me) * p.max_tokens + slot;
      warp_copy_fanout(x + (item / p.k) * p.row_bytes, p.row_bytes, lane == 0 ? rows + cell * p.row_bytes : nullptr, 1);
      if (lane == 0) reinterpret_cast<int*>(info)[cell] = int(item);
    }
  }
  if (!ll_last_block(p.blocks_done)) return;
  for (u32 e = threadIdx.x; e < p.experts; e += blockDim.x) {
    const u32 r = e / per_rank, local = e % per_rank;
    unsigned char* cnt = ll_base(p.table, p.count_window, r);
    const u32 n = counts[e];
    if (cnt != nullptr) reinterpret_cast<i64*>(cnt)[u64(local) * p.ranks + p.me] = i64(n < p.max_tokens ? n : p.max_tokens);
    counts[e] = 0;
  }
  __threadfence_system();
  __syncthreads();
  ll_signal_others(p, 7);
}

// Every thread of the block, in shared memory: start[q] = the sum of count(q') over q' < q for
// q <= n, so start[n] is the total. count(q) is read twice and must give the same value both
// times (counts written before the kernel started). Why: the low-latency kernels walk only the
// rows that exist, flattened over (expert, source) pairs, so every warp gets work. The walk over
// all E/R x R x M slots it replaces took 173.5 us for ~1,024 rows on 2xH100
// (docs/results/2026-11-26-ep.md); by its arithmetic, not a measurement: 24 blocks of 32 warps are
// 768 warps, 3 x (R x M = 256) slots of an expert, so warp w only ever saw slot w mod 256, and
// the ~8 rows an expert holds fell to the same ~24 warps, one after another.
template <typename Count>
__device__ void block_prefix(Count count, u32 n, u32* start) {
  const u32 per = (n + blockDim.x - 1) / blockDim.x;
  const u32 q0 = threadIdx.x * per;
  const u32 q1 = q0 + per < n ? q0 + per : n;
  u32 mine = 0;
  for (u32 q = q0; q < q1; ++q) mine += count(q);
  u32 total;
  u32 at = block_exclusive_scan(mine, &total);
  for (u32 q = q0; q < q1; ++q) {
    start[q] = at;
    at += count(q);
  }
  if (threadIdx.x == 0) start[n] = total;
  __syncthreads();
}

// The q in [0, n) with start[q] <= j < start[q + 1], for j < start[n] (start as block_prefix
// leaves it; empty entries are skipped: the last q with start[q] <= j is the non-empty one).
__device__ __forceinline__ u32 prefix_find(const u32* start, u32 n, u32 j) {
  u32 lo = 0, hi = n;
  while (lo < hi) {
    const u32 mid = (lo + hi + 1) / 2;
    if (start[mid] <= j) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// After the dispatch's signal: each local expert's rows, packed in source-rank order into
// out [local][ranks * max_tokens] rows (the first packed_count[local] valid), with each row's
// (token * k + slot) at its source in out_src, and layout[local][src] = (offset << 32) | count.
// A warp a received row, over the rows that exist only (block_prefix over the (local, src)
// counts, each clamped to max_tokens); block 0 writes layout and packed_count.
extern "C" __global__ void __launch_bounds__(1024) ep_ll_unpack(const unsigned char* recv, const int* src_info,
                                                               const i64* counts, u32 local_experts, u32 ranks,
                                                               u64 max_tokens, u64 row_bytes, unsigned char* out,
                                                               int* out_src, i64* layout, int* packed_count) {
  __shared__ u32 start[EP_MAX_EXPERTS + 1];
  const u32 pairs = local_experts * ranks;  // (local expert, source) pairs: the experts, <= EP_MAX_EXPERTS
  if (pairs > EP_MAX_EXPERTS) return;       // refused by accord.ep.Buffer before any launch
  block_prefix(
      [&](u32 q) {
        const i64 c = counts[q];
        return c <= 0 ? 0u : (u64(c) < max_tokens ? u32(c) : u32(max_tokens));
      },
      pairs, start);
  if (blockIdx.x == 0) {
    for (u32 q = threadIdx.x; q < pairs; q += blockDim.x) {
      const u32 l = q / ranks, first = start[l * ranks];
      layout[q] = (i64(start[q] - first) << 32) | i64(start[q + 1] - start[q]);
      if (q % ranks == 0) packed_count[l] = int(start[(l + 1) * ranks] - first);
    }
  }
  const u32 lane = threadIdx.x & 31u;
  const u64 total = start[pairs];
  for (u64 j = global_warp(); j < total; j += warp_count()) {
    const u32 q = prefix_find(start, pairs, u32(j));
    const u32 l = q / ranks;
    const u64 i = j - start[q];
    const u64 cell = u64(q) * max_tokens + i;  // (l * ranks + src) * max_tokens + i
    const u64 to = u64(l) * ranks * max_tokens + (start[q] - start[l * ranks]) + i;
    warp_copy_fanout(recv + cell * row_bytes, row_bytes, lane == 0 ? out + to * row_bytes : nullptr, 1);
    if (lane == 0) out_src[to] = src_info[cell];
  }
}

// Combine, sending side: one warp per valid packed row i of each local expert l (i <
// packed_count[l]), over those rows only (block_prefix over packed_count): y's row back to the
// rank it came from (layout's ranges), into that rank's combine buffer at (token * k + slot)
// (out_src; a cell outside the buffer is refused as a bad argument). The last block signals every
// other rank.
extern "C" __global__ void __launch_bounds__(1024) ep_ll_combine_send(const unsigned char* y, const int* out_src,
                                                                     const i64* layout, const int* packed_count,
                                                                     u32 local_experts, LowLatency p) {
  __shared__ u32 start[EP_MAX_EXPERTS + 1];
  const u32 lane = threadIdx.x & 31u;
  const u64 per_expert = u64(p.ranks) * p.max_tokens;
  const u64 cells = p.max_tokens * p.k;  // rows of a combine buffer
  const u32 local = local_experts <= EP_MAX_EXPERTS ? local_experts : 0;  // more: refused by accord.ep.Buffer
  block_prefix(
      [&](u32 l) {
        const int c = packed_count[l];
        return c <= 0 ? 0u : (u64(c) < per_expert ? u32(c) : u32(per_expert));
      },
      local, start);
  if (!failed(p.status)) {
    const u64 total = start[local];
    for (u64 j = global_warp(); j < total; j += warp_count()) {
      const u32 l = prefix_find(start, local, u32(j));
      const u64 i = j - start[l];
      u32 r = 0;
      while (r + 1 < p.ranks && u64(layout[u64(l) * p.ranks + r + 1] >> 32) <= i) ++r;
      unsigned char* comb = ll_base(p.table, p.comb_window, r);
      if (comb == nullptr) {
        if (lane == 0) record_failure(p.status, 8, r, int(NOT_DIRECT));
        continue;
      }
      const u64 item = u64(l) * per_expert + i;
      const int cell = out_src[item];
      if (cell < 0 || u64(cell) >= cells) {
        if (lane == 0) record_failure(p.status, 8, r, int(BAD_ARGUMENT));
        continue;
      }
      warp_copy_fanout(y + item * p.row_bytes, p.row_bytes, lane == 0 ? comb + u64(cell) * p.row_bytes : nullptr, 1);
    }
  }
  if (!ll_last_block(p.blocks_done)) return;
  ll_signal_others(p, 8);
}

// Combine, receiving side: out[t] = sum over slots j with topk_idx[t][j] >= 0 of
// weights[t][j] * comb[t * k + j], in fp32, for bf16 rows of `hidden` (a multiple of 8). A warp
// per (token, 32 * EP_UNROLL pieces of its row): a decode batch has fewer tokens than the grid
// has warps, so a warp a whole token left most of them idle (same sums in the same order).
extern "C" __global__ void __launch_bounds__(1024) ep_ll_reduce_bf16(unsigned short* out, const unsigned short* comb,
                                                                    const i64* topk_idx, const float* weights,
                                                                    u64 tokens, u32 k, u64 hidden) {
  const u32 lane = threadIdx.x & 31u;
  const u64 pieces = hidden / 8;
  const u64 step = 32 * EP_UNROLL;
  const u64 parts = (pieces + step - 1) / step;
  for (u64 item = global_warp(); item < tokens * parts; item += warp_count()) {
    const u64 t = item / parts;
    int4* dst = reinterpret_cast<int4*>(out + t * hidden);
    {
      const u64 base = (item % parts) * step;
      float acc[EP_UNROLL][8];
#pragma unroll
      for (u32 u = 0; u < EP_UNROLL; ++u)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[u][e] = 0.0f;
      for (u32 j = 0; j < k; ++j) {
        if (topk_idx[t * k + j] < 0) continue;
        const float w = weights[t * k + j];
        const int4* from = reinterpret_cast<const int4*>(comb + (t * k + j) * hidden);
        int4 v[EP_UNROLL];
#pragma unroll
        for (u32 u = 0; u < EP_UNROLL; ++u) {
          const u64 i = base + u * 32 + lane;
          if (i < pieces) v[u] = __ldg(from + i);
        }
#pragma unroll
        for (u32 u = 0; u < EP_UNROLL; ++u) {
          const unsigned short* h = reinterpret_cast<const unsigned short*>(&v[u]);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[u][e] += w * bf16_to_f32(h[e]);
        }
      }
#pragma unroll
      for (u32 u = 0; u < EP_UNROLL; ++u) {
        const u64 i = base + u * 32 + lane;
        if (i >= pieces) continue;
        int4 packed;
        unsigned short* q = reinterpret_cast<unsigned short*>(&packed);
#pragma unroll
        for (int e = 0; e < 8; ++e) q[e] = f32_to_bf16(acc[u][e]);
        dst[i] = packed;
      }
    }
  }
}

// One thread per other rank: adds 1 to its signal `sig` directly (no data), as the low-latency
// kernels do; for the "buffer free again" signals, raised after this rank read them.
extern "C" __global__ void ep_ll_signal(const DeviceTable* t, u32 me, u32 ranks, u32 window, u32 sig, int stage,
                                        int* status) {
  const u32 r = threadIdx.x;
  if (r >= ranks || r == me) return;
  const Status s = put_direct(t, window, r, 0, nullptr, 0, SIGNAL_ADD, sig, 1);
  if (s != OK) record_failure(status, stage, r, int(s));
}
