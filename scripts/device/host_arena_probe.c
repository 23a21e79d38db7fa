// How fast could a same-host CPU all_reduce be if the ranks shared one memory arena instead
// of moving every segment through the engine (issue 20: CPU DDP needs a faster host
// all_reduce)? This probe measures the protocol such a collective would run, so the figure
// comes before the code in the library.
//
// p processes (forked, so the arena is inherited and nothing else can map it) share an arena
// of two buffers x p slots of CHUNK bytes, plus one cache line of flags per rank and phase.
// The vector moves in chunks; for chunk k (epoch e = k + 1, buffer k % 2) each rank:
//   1. waits until every rank finished chunk k - 2 (its buffer is free again);
//   2. copies its input chunk into its slot and publishes in[me] = e;
//   3. waits for every in[r] >= e, then reduces block `me` of the chunk over all slots, in
//      place in its own slot, and publishes red[me] = e;
//   4. waits for every red[r] >= e, then copies every rank's reduced block into its output,
//      and publishes out[me] = e.
// Per rank and byte: one copy in, one read of each slot's block, one copy out; three flag
// barriers per chunk instead of 2(p-1) dependent steps. Every wait is bounded (10 s) and
// names the rank it waited for. Inputs are small integers in f32, so every sum is exact and
// the check compares for equality.
//
// Build and run: cc -O2 -march=x86-64 -o /tmp/arena scripts/device/host_arena_probe.c
//   /tmp/arena RANKS BYTES [CHUNK_BYTES=1048576] [ITERS=20]
// Prints one line: ranks, bytes, chunk, mean time per all_reduce (rank 0, after 2 warm-up
// calls), algbw and busbw (2(p-1)/p), and wrong elements summed over ranks.
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LINE 64
#define WAIT_LIMIT_NS (10ull * 1000 * 1000 * 1000)

struct flags {
    _Atomic uint64_t in;
    char pad0[LINE - 8];
    _Atomic uint64_t red;
    char pad1[LINE - 8];
    _Atomic uint64_t out;
    char pad2[LINE - 8];
    _Atomic uint64_t wrong;
    char pad3[LINE - 8];
};

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

// Waits until field(r) >= want for every rank; exits naming the first laggard at the limit.
static void wait_all(struct flags *f, int p, size_t field, uint64_t want, int me, const char *what) {
    uint64_t start = 0;
    for (int r = 0; r < p; r++) {
        _Atomic uint64_t *w = (_Atomic uint64_t *)((char *)&f[r] + field);
        unsigned spins = 0;
        while (atomic_load_explicit(w, memory_order_acquire) < want) {
            if (++spins < 4096) continue;
            if (!start) start = now_ns();
            if (now_ns() - start > WAIT_LIMIT_NS) {
                fprintf(stderr, "rank %d: waited 10 s for rank %d to reach %s %llu\n", me, r, what,
                        (unsigned long long)want);
                exit(3);
            }
            sched_yield();
        }
    }
}

static float value(int rank, size_t i) { return (float)((i * 7 + (size_t)rank * 13) % 1000); }

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s RANKS BYTES [CHUNK_BYTES] [ITERS]\n", argv[0]);
        return 2;
    }
    int p = atoi(argv[1]);
    size_t bytes = strtoull(argv[2], 0, 0);
    size_t chunk = argc > 3 ? strtoull(argv[3], 0, 0) : (1u << 20);
    int iters = argc > 4 ? atoi(argv[4]) : 20;
    if (p < 1 || p > 64 || bytes < 4 || chunk < (size_t)p * 64 || iters < 1) {
        fprintf(stderr, "need 1..64 ranks, BYTES >= 4, CHUNK_BYTES >= 64 x RANKS, ITERS >= 1\n");
        return 2;
    }
    chunk -= chunk % ((size_t)p * 64);  // blocks of whole cache lines
    size_t n = bytes / 4, chunk_elems = chunk / 4, block_elems = chunk_elems / p;
    size_t flags_bytes = (size_t)p * sizeof(struct flags);
    size_t arena_bytes = flags_bytes + 2 * (size_t)p * chunk;
    char *arena = mmap(0, arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (arena == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(arena, 0, arena_bytes);
    struct flags *f = (struct flags *)arena;
    float *slots = (float *)(arena + flags_bytes);  // [buffer][rank][chunk_elems]
    _Atomic uint64_t *t0 = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    for (int me = 0; me < p; me++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid > 0) continue;
        float *in = malloc(bytes), *out = malloc(bytes);
        for (size_t i = 0; i < n; i++) in[i] = value(me, i);
        memset(out, 0, bytes);
        uint64_t epoch = 0, start = 0;
        for (int it = 0; it < iters + 2; it++) {
            if (it == 2) start = now_ns();
            for (size_t base = 0; base < n; base += chunk_elems) {
                size_t len = n - base < chunk_elems ? n - base : chunk_elems;
                uint64_t e = ++epoch;
                float *buf = slots + (size_t)(e % 2) * p * chunk_elems;
                if (e > 2) wait_all(f, p, offsetof(struct flags, out), e - 2, me, "out");
                memcpy(buf + (size_t)me * chunk_elems, in + base, len * 4);
                atomic_store_explicit(&f[me].in, e, memory_order_release);
                wait_all(f, p, offsetof(struct flags, in), e, me, "in");
                // Block `me` of this chunk (the last block takes the remainder).
                size_t lo = (size_t)me * block_elems;
                size_t hi = me == p - 1 ? len : (lo + block_elems < len ? lo + block_elems : len);
                if (lo < hi) {
                    float *acc = buf + (size_t)me * chunk_elems;
                    for (int r = 0; r < p; r++) {
                        if (r == me) continue;
                        const float *src = buf + (size_t)r * chunk_elems;
                        for (size_t i = lo; i < hi; i++) acc[i] += src[i];
                    }
                }
                atomic_store_explicit(&f[me].red, e, memory_order_release);
                wait_all(f, p, offsetof(struct flags, red), e, me, "red");
                for (int r = 0; r < p; r++) {
                    size_t rlo = (size_t)r * block_elems;
                    size_t rhi = r == p - 1 ? len : (rlo + block_elems < len ? rlo + block_elems : len);
                    if (rlo < rhi) memcpy(out + base + rlo, buf + (size_t)r * chunk_elems + rlo, (rhi - rlo) * 4);
                }
                atomic_store_explicit(&f[me].out, e, memory_order_release);
            }
        }
        uint64_t elapsed = now_ns() - start;
        uint64_t wrong = 0;
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int r = 0; r < p; r++) want += value(r, i);
            wrong += out[i] != want;
        }
        atomic_store(&f[me].wrong, wrong);
        if (me == 0) atomic_store(t0, elapsed);
        _exit(0);
    }
    int failed = 0;
    for (int r = 0; r < p; r++) {
        int status;
        if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
    }
    if (failed) {
        fprintf(stderr, "a rank failed\n");
        return 1;
    }
    uint64_t wrong = 0;
    for (int r = 0; r < p; r++) wrong += atomic_load(&f[r].wrong);
    double t = (double)atomic_load(t0) / iters / 1e9;
    double algbw = (double)bytes / t / 1e9;
    printf("arena ranks %d bytes %zu chunk %zu time_us %.1f algbw %.2f busbw %.2f wrong %llu\n", p, bytes, chunk,
           t * 1e6, algbw, algbw * 2.0 * (p - 1) / p, (unsigned long long)wrong);
    return wrong ? 1 : 0;
}
