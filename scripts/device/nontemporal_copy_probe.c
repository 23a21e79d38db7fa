// Copy rate of plain memcpy against non-temporal (streaming) stores, in the pattern of the
// engine's shared-memory receive: each thread copies CHUNK-byte pieces out of a small source it
// reuses (a ring's entries, warm in the cache) into a large destination it walks once and never
// reads back (the registered region: NCCL's host buffer, which the GPU then reads by DMA).
//
// Why: with one process per GPU the NCCL plugin's host path copies every byte twice on the CPU
// (into a shared-memory ring and out of it), and its busbw stops where THREADS memcpy's stop
// (docs/results/2026-11-27-plugin-workers.md). A plain store of a line the cache does not hold
// first reads it from memory; a streaming store does not, so the copy out of the ring moves two
// thirds of the bytes through memory that memcpy moves.
//
// Build and run: cc -O2 -pthread -o nontemporal_copy_probe scripts/device/nontemporal_copy_probe.c
//                ./nontemporal_copy_probe THREADS CHUNK [CHUNK ...]   (e.g. 16 61440 524288)
// Prints per chunk size: total GB/s (1e9 bytes/s) of each way, one second each, and checks that
// both ways copied the same bytes.
#define _GNU_SOURCE
#include <emmintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SOURCE_BYTES ((size_t)2 << 20)
#define DEST_BYTES ((size_t)256 << 20)
#define THREADS_MAX 64

struct copier {
    unsigned char *src;
    unsigned char *dst;
    size_t chunk;
    int streaming;
    double bytes;
};

static volatile int stop_flag;

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// Streaming copy: plain stores up to the destination's first 16-byte boundary, 64 bytes a step
// of streaming stores, plain stores for the tail; a fence so the bytes are visible in order.
static void copy_streaming(unsigned char *dst, const unsigned char *src, size_t len) {
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (head > len) head = len;
    memcpy(dst, src, head);
    dst += head, src += head, len -= head;
    while (len >= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)src);
        __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
        dst += 64, src += 64, len -= 64;
    }
    memcpy(dst, src, len);
    _mm_sfence();
}

static void *run(void *arg) {
    struct copier *c = arg;
    size_t s = 0, d = 0;
    double bytes = 0;
    while (!stop_flag) {
        if (s + c->chunk > SOURCE_BYTES) s = 0;
        if (d + c->chunk > DEST_BYTES) d = 0;
        if (c->streaming) copy_streaming(c->dst + d, c->src + s, c->chunk);
        else memcpy(c->dst + d, c->src + s, c->chunk);
        s += c->chunk, d += c->chunk, bytes += (double)c->chunk;
    }
    c->bytes = bytes;
    return NULL;
}

static double measure(struct copier *cs, int threads, size_t chunk, int streaming) {
    pthread_t ids[THREADS_MAX];
    stop_flag = 0;
    for (int i = 0; i < threads; i++) {
        cs[i].chunk = chunk, cs[i].streaming = streaming, cs[i].bytes = 0;
        if (pthread_create(&ids[i], NULL, run, &cs[i]) != 0) { perror("pthread_create"); exit(1); }
    }
    double start = now_seconds();
    struct timespec second = {1, 0};
    nanosleep(&second, NULL);
    stop_flag = 1;
    double total = 0;
    for (int i = 0; i < threads; i++) pthread_join(ids[i], NULL), total += cs[i].bytes;
    return total / (now_seconds() - start) / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s THREADS CHUNK [CHUNK ...]\n", argv[0]); return 2; }
    int threads = atoi(argv[1]);
    if (threads < 1 || threads > THREADS_MAX) { fprintf(stderr, "THREADS must be 1..%d\n", THREADS_MAX); return 2; }
    struct copier cs[THREADS_MAX];
    for (int i = 0; i < threads; i++) {
        cs[i].src = aligned_alloc(4096, SOURCE_BYTES);
        cs[i].dst = aligned_alloc(4096, DEST_BYTES);
        if (!cs[i].src || !cs[i].dst) { perror("aligned_alloc"); return 1; }
        for (size_t j = 0; j < SOURCE_BYTES; j++) cs[i].src[j] = (unsigned char)(j * 131 + i);
        memset(cs[i].dst, 0, DEST_BYTES);
    }
    // Both ways must copy the same bytes, at an odd offset and length too.
    unsigned char *a = cs[0].dst, *b = cs[0].dst + (64 << 20);
    memcpy(a + 3, cs[0].src + 5, 100001);
    copy_streaming(b + 3, cs[0].src + 5, 100001);
    if (memcmp(a, b, 100010) != 0) { fprintf(stderr, "streaming copy differs from memcpy\n"); return 1; }
    printf("threads %d\n%10s %14s %14s %8s\n", threads, "chunk", "memcpy GB/s", "stream GB/s", "ratio");
    for (int k = 2; k < argc; k++) {
        size_t chunk = strtoull(argv[k], NULL, 10);
        if (chunk == 0 || chunk > SOURCE_BYTES) { fprintf(stderr, "CHUNK must be 1..%zu\n", SOURCE_BYTES); return 2; }
        double plain = measure(cs, threads, chunk, 0);
        double stream = measure(cs, threads, chunk, 1);
        printf("%10zu %14.2f %14.2f %8.2f\n", chunk, plain, stream, stream / plain);
    }
    return 0;
}
