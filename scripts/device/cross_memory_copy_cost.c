// Copy rate through process_vm_readv (the kernel's cross-memory copy, what Accord's pull route
// `ACCORD_CMA=1` uses) from another process, against plain memcpy of the same pieces, with
// THREADS copying at once (each its own 16 MiB source and destination).
//
// Why: the pull route moves each byte once instead of twice (into a shared-memory ring and out),
// yet NCCL through the plugin was no faster with it. This separates the kernel copy's own cost
// (one thread) from what many threads pulling from one process at once cost (page pinning and
// the source process's memory-map lock are shared).
//
// Build and run: cc -O2 -pthread -o cross_memory_copy_cost scripts/device/cross_memory_copy_cost.c
//                ./cross_memory_copy_cost THREADS CHUNK [CHUNK ...]   (e.g. 8 65536 524288)
// Prints per chunk size: total GB/s (1e9 bytes/s) of each way, one second each.
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define AREA_BYTES ((size_t)16 << 20)
#define THREADS_MAX 64

struct copier {
    pid_t source_pid;  // the process the sources are read from (0: memcpy in this process)
    unsigned char *src;
    unsigned char *dst;
    size_t chunk;
    double bytes;
    int failed;
};

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *copy_for_a_second(void *arg) {
    struct copier *c = arg;
    double start = now_seconds();
    size_t offset = 0;
    c->bytes = 0;
    while (now_seconds() - start < 1.0) {
        if (c->source_pid) {
            struct iovec local = {c->dst + offset, c->chunk}, remote = {c->src + offset, c->chunk};
            if (process_vm_readv(c->source_pid, &local, 1, &remote, 1, 0) != (ssize_t)c->chunk) {
                c->failed = errno ? errno : EIO;
                return NULL;
            }
        } else {
            memcpy(c->dst + offset, c->src + offset, c->chunk);
        }
        c->bytes += (double)c->chunk;
        offset += c->chunk;
        if (offset + c->chunk > AREA_BYTES) offset = 0;
    }
    return NULL;
}

// Runs `threads` copiers at once; returns total GB/s, or -1 with a message on failure.
static double run(struct copier *copiers, size_t threads, pid_t source_pid, size_t chunk) {
    pthread_t tids[THREADS_MAX];
    double start = now_seconds(), total = 0;
    for (size_t i = 0; i < threads; i++) {
        copiers[i].source_pid = source_pid;
        copiers[i].chunk = chunk;
        copiers[i].failed = 0;
        if (pthread_create(&tids[i], NULL, copy_for_a_second, &copiers[i])) return -1;
    }
    int failed = 0;
    for (size_t i = 0; i < threads; i++) {
        pthread_join(tids[i], NULL);
        total += copiers[i].bytes;
        if (copiers[i].failed) failed = copiers[i].failed;
    }
    if (failed) {
        fprintf(stderr, "process_vm_readv: %s\n", strerror(failed));
        return -1;
    }
    return total / (now_seconds() - start) / 1e9;
}

int main(int argc, char **argv) {
    char *end;
    unsigned long threads = argc > 2 ? strtoul(argv[1], &end, 0) : 0;
    if (argc < 3 || *end || threads == 0 || threads > THREADS_MAX) {
        fprintf(stderr, "usage: %s THREADS(1..%d) CHUNK [CHUNK ...]   (bytes, 1..%zu)\n", argv[0], THREADS_MAX,
                AREA_BYTES);
        return 2;
    }
    static struct copier copiers[THREADS_MAX];
    for (size_t i = 0; i < threads; i++) {
        copiers[i].src = aligned_alloc(4096, AREA_BYTES);
        copiers[i].dst = aligned_alloc(4096, AREA_BYTES);
        if (!copiers[i].src || !copiers[i].dst) return 1;
        memset(copiers[i].src, 1, AREA_BYTES);
        memset(copiers[i].dst, 2, AREA_BYTES);
    }
    // The child holds the same sources at the same addresses (fork) and waits to be read.
    pid_t child = fork();
    if (child < 0) return 1;
    if (child == 0) {
        for (size_t i = 0; i < threads; i++) memset(copiers[i].src, 3, AREA_BYTES);  // own pages, not shared
        pause();
        _exit(0);
    }
    usleep(200000);
    int rc = 0;
    for (int a = 2; a < argc; a++) {
        errno = 0;
        unsigned long long chunk = strtoull(argv[a], &end, 0);
        if (errno || *end || chunk == 0 || chunk > AREA_BYTES) {
            fprintf(stderr, "chunk %s: give 1..%zu bytes\n", argv[a], AREA_BYTES);
            rc = 2;
            break;
        }
        double cma = run(copiers, threads, child, chunk);
        double plain = run(copiers, threads, 0, chunk);
        if (cma < 0 || plain < 0) {
            rc = 1;
            break;
        }
        printf("threads %2lu chunk %8llu: process_vm_readv %7.2f GB/s, memcpy %7.2f GB/s, ratio %.2f\n", threads,
               chunk, cma, plain, cma / plain);
    }
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    return rc;
}
