// Probe of a same-host route between two processes that moves bytes through a shared-memory
// ring with the GPUs' copy engines instead of CPU memcpy (docs/results/2026-11-22-nccl-plugin.md,
// session 5, "Next"). Two processes, rank r on GPU r, both directions at once: each rank's
// producer thread copies PIECE-byte pieces of a device buffer into its outgoing ring (one
// device-to-host DMA per piece) and publishes them in order; each rank's consumer thread copies
// pieces of its incoming ring into a device buffer (one host-to-device DMA per piece) and frees
// them in order. Mode `cpu` is the same-run baseline: the same rings, filled and drained with
// memcpy from and to host buffers by one thread each (the plugin's route today, per lane).
//
// Build: cc -O2 -pthread -o dma_ring_probe scripts/device/dma_ring_probe.c -ldl
// Run:   ./dma_ring_probe dma|cpu PIECE SLOTS GIB   (e.g. dma 524288 16 16)
// Prints per rank: GB/s (1e9 bytes/s) sent and received, and whether the last piece received
// holds the peer's pattern. Uses the CUDA driver API through dlopen("libcuda.so.1"), so it
// builds where no CUDA toolkit is installed; `dma` needs 2 GPUs.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BUFFER_BYTES ((size_t)256 << 20)
#define SLOTS_MAX 256
#define CU_SUCCESS 0
#define CU_NOT_READY 600
#define CU_MEMHOSTREGISTER_PORTABLE 1
#define CU_EVENT_DISABLE_TIMING 2

typedef int cu_result;
typedef unsigned long long cu_ptr;
static cu_result (*cu_init)(unsigned);
static cu_result (*cu_device_get)(int *, int);
static cu_result (*cu_primary_ctx_retain)(void **, int);
static cu_result (*cu_ctx_set_current)(void *);
static cu_result (*cu_mem_alloc)(cu_ptr *, size_t);
static cu_result (*cu_memset_d32)(cu_ptr, unsigned, size_t);
static cu_result (*cu_mem_host_register)(void *, size_t, unsigned);
static cu_result (*cu_stream_create)(void **, unsigned);
static cu_result (*cu_event_create)(void **, unsigned);
static cu_result (*cu_event_record)(void *, void *);
static cu_result (*cu_event_query)(void *);
static cu_result (*cu_dtoh_async)(void *, cu_ptr, size_t, void *);
static cu_result (*cu_htod_async)(cu_ptr, const void *, size_t, void *);
static cu_result (*cu_dtoh)(void *, cu_ptr, size_t);
static cu_result (*cu_ctx_synchronize)(void);

static void check(cu_result rc, const char *what) {
    if (rc != CU_SUCCESS) {
        fprintf(stderr, "%s failed: CUresult %d\n", what, rc);
        exit(1);
    }
}

static void load_cuda(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "mode dma needs the CUDA driver: %s\n", dlerror());
        exit(1);
    }
#define LOAD(var, name)                                                 \
    do {                                                                \
        *(void **)&var = dlsym(lib, name);                              \
        if (!var) {                                                     \
            fprintf(stderr, "libcuda.so.1 lacks %s\n", name);           \
            exit(1);                                                    \
        }                                                               \
    } while (0)
    LOAD(cu_init, "cuInit");
    LOAD(cu_device_get, "cuDeviceGet");
    LOAD(cu_primary_ctx_retain, "cuDevicePrimaryCtxRetain");
    LOAD(cu_ctx_set_current, "cuCtxSetCurrent");
    LOAD(cu_mem_alloc, "cuMemAlloc_v2");
    LOAD(cu_memset_d32, "cuMemsetD32_v2");
    LOAD(cu_mem_host_register, "cuMemHostRegister_v2");
    LOAD(cu_stream_create, "cuStreamCreate");
    LOAD(cu_event_create, "cuEventCreate");
    LOAD(cu_event_record, "cuEventRecord");
    LOAD(cu_event_query, "cuEventQuery");
    LOAD(cu_dtoh_async, "cuMemcpyDtoHAsync_v2");
    LOAD(cu_htod_async, "cuMemcpyHtoDAsync_v2");
    LOAD(cu_dtoh, "cuMemcpyDtoH_v2");
    LOAD(cu_ctx_synchronize, "cuCtxSynchronize");
#undef LOAD
}

// One direction: pieces are published (`filled`) and freed (`freed`) in order; a piece's slot is
// its index modulo the slot count.
struct ring {
    _Atomic uint64_t filled;
    char pad1[56];
    _Atomic uint64_t freed;
    char pad2[56];
};

struct shared {
    struct ring rings[2];  // rings[r]: rank r -> rank 1 - r
    _Atomic int ready;
};

struct config {
    int dma;
    size_t piece, slots, pieces;
    struct shared *shared;
    unsigned char *ring_data[2];
};

struct side {
    const struct config *cfg;
    int rank;
    void *ctx;
    cu_ptr device;          // dma: device source (producer) or destination (consumer)
    unsigned char *host;    // cpu: host source or destination
    double seconds;
};

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// A thread's copy engine queue: one stream, one event per slot (the piece's copy in it).
struct dma_queue {
    void *stream;
    void *events[SLOTS_MAX];
};

static void open_dma_queue(const struct side *s, struct dma_queue *q) {
    check(cu_ctx_set_current(s->ctx), "cuCtxSetCurrent");
    check(cu_stream_create(&q->stream, 1), "cuStreamCreate");
    for (size_t i = 0; i < s->cfg->slots; i++)
        check(cu_event_create(&q->events[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
}

// Publishes, in order, the pieces below `limit` whose copies have finished: `*done` counts them
// and `counter` (the ring's filled or freed count) follows it. With `wait`, spins until all are.
static void publish_finished(const struct config *c, struct dma_queue *q, uint64_t *done, uint64_t limit,
                             _Atomic uint64_t *counter, int wait) {
    while (*done < limit) {
        cu_result rc = cu_event_query(q->events[*done % c->slots]);
        if (rc == CU_SUCCESS)
            atomic_store_explicit(counter, ++*done, memory_order_release);
        else if (rc != CU_NOT_READY)
            check(rc, "cuEventQuery");
        else if (!wait)
            return;
    }
}

static void *produce(void *arg) {
    struct side *s = arg;
    const struct config *c = s->cfg;
    struct ring *ring = &c->shared->rings[s->rank];
    unsigned char *data = c->ring_data[s->rank];
    struct dma_queue q;
    if (c->dma) open_dma_queue(s, &q);
    double start = now_seconds();
    uint64_t done = 0;  // pieces whose copy finished and that are published
    for (uint64_t i = 0; i < c->pieces; i++) {
        while (i - atomic_load_explicit(&ring->freed, memory_order_acquire) >= c->slots)
            if (c->dma) publish_finished(c, &q, &done, i, &ring->filled, 0);
        unsigned char *slot = data + (i % c->slots) * c->piece;
        size_t offset = (i * c->piece) % BUFFER_BYTES;
        if (c->dma) {
            check(cu_dtoh_async(slot, s->device + offset, c->piece, q.stream), "cuMemcpyDtoHAsync");
            check(cu_event_record(q.events[i % c->slots], q.stream), "cuEventRecord");
            publish_finished(c, &q, &done, i + 1, &ring->filled, 0);
        } else {
            memcpy(slot, s->host + offset, c->piece);
            atomic_store_explicit(&ring->filled, ++done, memory_order_release);
        }
    }
    if (c->dma) publish_finished(c, &q, &done, c->pieces, &ring->filled, 1);
    s->seconds = now_seconds() - start;
    return NULL;
}

static void *consume(void *arg) {
    struct side *s = arg;
    const struct config *c = s->cfg;
    int from = 1 - s->rank;
    struct ring *ring = &c->shared->rings[from];
    unsigned char *data = c->ring_data[from];
    struct dma_queue q;
    if (c->dma) open_dma_queue(s, &q);
    double start = now_seconds();
    uint64_t done = 0;  // pieces copied out and freed
    for (uint64_t j = 0; j < c->pieces; j++) {
        while (atomic_load_explicit(&ring->filled, memory_order_acquire) <= j)
            if (c->dma) publish_finished(c, &q, &done, j, &ring->freed, 0);
        unsigned char *slot = data + (j % c->slots) * c->piece;
        size_t offset = (j * c->piece) % BUFFER_BYTES;
        if (c->dma) {
            check(cu_htod_async(s->device + offset, slot, c->piece, q.stream), "cuMemcpyHtoDAsync");
            check(cu_event_record(q.events[j % c->slots], q.stream), "cuEventRecord");
        } else {
            memcpy(s->host + offset, slot, c->piece);
            atomic_store_explicit(&ring->freed, ++done, memory_order_release);
        }
    }
    if (c->dma) publish_finished(c, &q, &done, c->pieces, &ring->freed, 1);
    s->seconds = now_seconds() - start;
    return NULL;
}

static unsigned pattern_of(int rank) {
    return 0x5a5a0000u + (unsigned)rank;
}

static int run_rank(const struct config *c, int rank) {
    struct side tx = {.cfg = c, .rank = rank}, rx = {.cfg = c, .rank = rank};
    if (c->dma) {
        int dev;
        void *ctx;
        check(cu_init(0), "cuInit");
        check(cu_device_get(&dev, rank), "cuDeviceGet (dma needs 2 GPUs)");
        check(cu_primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
        check(cu_ctx_set_current(ctx), "cuCtxSetCurrent");
        for (int r = 0; r < 2; r++)
            check(cu_mem_host_register(c->ring_data[r], c->slots * c->piece, CU_MEMHOSTREGISTER_PORTABLE),
                  "cuMemHostRegister of a ring");
        check(cu_mem_alloc(&tx.device, BUFFER_BYTES), "cuMemAlloc");
        check(cu_mem_alloc(&rx.device, BUFFER_BYTES), "cuMemAlloc");
        check(cu_memset_d32(tx.device, pattern_of(rank), BUFFER_BYTES / 4), "cuMemsetD32");
        check(cu_memset_d32(rx.device, 0, BUFFER_BYTES / 4), "cuMemsetD32");
        check(cu_ctx_synchronize(), "cuCtxSynchronize");
        tx.ctx = rx.ctx = ctx;
    } else {
        tx.host = malloc(BUFFER_BYTES);
        rx.host = malloc(BUFFER_BYTES);
        if (!tx.host || !rx.host) return 1;
        unsigned pattern = pattern_of(rank);
        for (size_t i = 0; i < BUFFER_BYTES / 4; i++) memcpy(tx.host + 4 * i, &pattern, 4);
        memset(rx.host, 0, BUFFER_BYTES);
    }
    atomic_fetch_add(&c->shared->ready, 1);
    while (atomic_load(&c->shared->ready) < 2) {
    }
    pthread_t producer, consumer;
    if (pthread_create(&producer, NULL, produce, &tx) || pthread_create(&consumer, NULL, consume, &rx)) return 1;
    pthread_join(producer, NULL);
    pthread_join(consumer, NULL);
    unsigned got = 0;
    size_t last = ((c->pieces - 1) * c->piece) % BUFFER_BYTES;
    if (c->dma) {
        check(cu_ctx_set_current(tx.ctx), "cuCtxSetCurrent");
        check(cu_dtoh(&got, rx.device + last, 4), "cuMemcpyDtoH");
    } else {
        memcpy(&got, rx.host + last, 4);
    }
    double bytes = (double)c->pieces * (double)c->piece;
    int ok = got == pattern_of(1 - rank);
    printf("%s rank %d: piece %zu slots %zu: sent %.2f GB/s, received %.2f GB/s, last piece %s\n",
           c->dma ? "dma" : "cpu", rank, c->piece, c->slots, bytes / tx.seconds / 1e9, bytes / rx.seconds / 1e9,
           ok ? "holds the peer's pattern" : "WRONG");
    fflush(stdout);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    struct config c = {0};
    char *end;
    double gib = argc == 5 ? strtod(argv[4], &end) : 0;
    c.dma = argc == 5 && strcmp(argv[1], "dma") == 0;
    c.piece = argc == 5 ? strtoull(argv[2], NULL, 0) : 0;
    c.slots = argc == 5 ? strtoull(argv[3], NULL, 0) : 0;
    if (argc != 5 || (!c.dma && strcmp(argv[1], "cpu") != 0) || c.piece == 0 || c.piece % 4096 ||
        BUFFER_BYTES % c.piece || c.slots < 2 || c.slots > SLOTS_MAX || gib <= 0 || gib > 1024) {
        fprintf(stderr, "usage: %s dma|cpu PIECE(4 KiB multiple dividing 256 MiB) SLOTS(2..%d) GIB(per direction)\n",
                argv[0], SLOTS_MAX);
        return 2;
    }
    c.pieces = (size_t)(gib * (double)(1ull << 30)) / c.piece;
    if (c.pieces == 0) c.pieces = 1;
    if (c.dma) load_cuda();
    size_t ring_bytes = c.slots * c.piece;
    void *mem = mmap(NULL, sizeof(struct shared) + 4096 + 2 * ring_bytes, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    c.shared = mem;
    c.ring_data[0] = (unsigned char *)mem + 4096;
    c.ring_data[1] = c.ring_data[0] + ring_bytes;
    pid_t children[2];
    for (int r = 0; r < 2; r++) {
        children[r] = fork();
        if (children[r] < 0) return 1;
        if (children[r] == 0) _exit(run_rank(&c, r));
    }
    int rc = 0;
    for (int r = 0; r < 2; r++) {
        int status;
        waitpid(children[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status)) rc = 1;
    }
    return rc;
}
