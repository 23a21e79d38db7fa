// One core's copy rate through process_vm_readv (the kernel's cross-memory copy, what Accord's
// pull route `ACCORD_CMA=1` uses) against a plain memcpy of the same pieces, in one process.
//
// Why: the pull route moves each byte once instead of twice (into a shared-memory ring and out),
// yet NCCL through the plugin was no faster with it. If the kernel copy costs a core more than
// two memcpys, halving the copies does not pay on a CPU-bound transport.
//
// Build and run: cc -O2 -o cross_memory_copy_cost scripts/device/cross_memory_copy_cost.c
//                ./cross_memory_copy_cost CHUNK [CHUNK ...]   (e.g. 65536 524288 4194304)
// Prints per chunk size: GB/s (1e9 bytes/s) of each way over 16 MiB buffers, one second each.
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define AREA_BYTES ((size_t)16 << 20)

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// Copies `chunk`-byte pieces from src to dst for about a second; returns GB/s, or -1 on error.
static double rate(unsigned char *dst, unsigned char *src, size_t chunk, int cross_memory) {
    pid_t self = getpid();
    double bytes = 0, start = now_seconds();
    size_t offset = 0;
    while (now_seconds() - start < 1.0) {
        if (cross_memory) {
            struct iovec local = {dst + offset, chunk}, remote = {src + offset, chunk};
            if (process_vm_readv(self, &local, 1, &remote, 1, 0) != (ssize_t)chunk) {
                perror("process_vm_readv");
                return -1;
            }
        } else {
            memcpy(dst + offset, src + offset, chunk);
        }
        bytes += (double)chunk;
        offset += chunk;
        if (offset + chunk > AREA_BYTES) offset = 0;
    }
    return bytes / (now_seconds() - start) / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CHUNK [CHUNK ...]   (bytes, 1..%zu)\n", argv[0], AREA_BYTES);
        return 2;
    }
    unsigned char *src = aligned_alloc(4096, AREA_BYTES), *dst = aligned_alloc(4096, AREA_BYTES);
    if (!src || !dst) return 1;
    memset(src, 1, AREA_BYTES);
    memset(dst, 2, AREA_BYTES);
    for (int i = 1; i < argc; i++) {
        char *end;
        errno = 0;
        unsigned long long chunk = strtoull(argv[i], &end, 0);
        if (errno || *end || chunk == 0 || chunk > AREA_BYTES) {
            fprintf(stderr, "chunk %s: give 1..%zu bytes\n", argv[i], AREA_BYTES);
            return 2;
        }
        double cma = rate(dst, src, chunk, 1);
        if (cma < 0) return 1;
        double plain = rate(dst, src, chunk, 0);
        printf("chunk %8llu: process_vm_readv %6.2f GB/s, memcpy %6.2f GB/s, ratio %.2f\n", chunk, cma, plain,
               cma / plain);
    }
    return 0;
}
