// Aggregate memcpy bandwidth of this host: how fast THREADS cores together copy CHUNK-byte pieces
// from one AREA-byte buffer of their own to another, for SECONDS.
//
// Why: on one host, a transport between two processes copies each byte twice through shared
// memory (into a ring, out of it), as does the kernel for TCP; with both directions busy its
// ceiling is this host's copy bandwidth, and that moves between device calls with the load of
// other tenants (the 2xH200 host gave 113 GB/s for 12 threads in one call and 65 in another).
// The NCCL plugin scripts print it before and after their runs so each table carries it.
//
// Build and run: cc -O2 -pthread -o copy_bandwidth scripts/device/copy_bandwidth.c
//                ./copy_bandwidth THREADS AREA CHUNK SECONDS   (e.g. 12 16777216 65536 1)
// Prints one line: threads, area, chunk, total GB/s (1e9 bytes/s), GB/s per thread.
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define THREADS_MAX 256

struct copier {
    unsigned char *src;
    unsigned char *dst;
    size_t area;
    size_t chunk;
    double bytes;
};

static atomic_int stop_copying;

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *copy_loop(void *arg) {
    struct copier *c = arg;
    size_t offset = 0;
    double bytes = 0;
    while (!atomic_load_explicit(&stop_copying, memory_order_relaxed)) {
        memcpy(c->dst + offset, c->src + offset, c->chunk);
        bytes += (double)c->chunk;
        offset += c->chunk;
        if (offset + c->chunk > c->area) offset = 0;
    }
    c->bytes = bytes;
    return NULL;
}

static int parse_size(const char *text, size_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 0);
    if (errno || *end || v == 0) return -1;
    *out = (size_t)v;
    return 0;
}

int main(int argc, char **argv) {
    size_t threads, area, chunk;
    double seconds = argc == 5 ? atof(argv[4]) : 0;
    if (argc != 5 || parse_size(argv[1], &threads) || parse_size(argv[2], &area) || parse_size(argv[3], &chunk) ||
        threads > THREADS_MAX || chunk > area || seconds <= 0 || seconds > 60) {
        fprintf(stderr, "usage: %s THREADS(1..%d) AREA CHUNK(<= AREA) SECONDS(0..60]\n", argv[0], THREADS_MAX);
        return 2;
    }
    static struct copier copiers[THREADS_MAX];
    static pthread_t tids[THREADS_MAX];
    for (size_t i = 0; i < threads; i++) {
        copiers[i] = (struct copier){.area = area, .chunk = chunk};
        copiers[i].src = aligned_alloc(4096, (area + 4095) / 4096 * 4096);
        copiers[i].dst = aligned_alloc(4096, (area + 4095) / 4096 * 4096);
        if (!copiers[i].src || !copiers[i].dst) {
            fprintf(stderr, "out of memory for %zu areas of %zu bytes\n", 2 * threads, area);
            return 1;
        }
        memset(copiers[i].src, 1, area);  // touch every page before timing
        memset(copiers[i].dst, 2, area);
    }
    double start = now_seconds();
    for (size_t i = 0; i < threads; i++) {
        if (pthread_create(&tids[i], NULL, copy_loop, &copiers[i])) {
            fprintf(stderr, "pthread_create failed\n");
            return 1;
        }
    }
    struct timespec nap = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&nap, NULL);
    atomic_store(&stop_copying, 1);
    double total = 0;
    for (size_t i = 0; i < threads; i++) {
        pthread_join(tids[i], NULL);
        total += copiers[i].bytes;
    }
    double elapsed = now_seconds() - start;
    printf("copy bandwidth: threads %zu area %zu chunk %zu: %.2f GB/s total, %.2f per thread\n", threads, area,
           chunk, total / elapsed / 1e9, total / elapsed / 1e9 / (double)threads);
    return 0;
}
