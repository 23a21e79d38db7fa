/* The functions accord's Python module (crates/accord-py/src/torch_native.rs) gives
 * accord.torch's compiled backend, as a table whose address `accord._accord._torch_native_api()`
 * returns. The layout is the Rust `Api` struct's; `abi` changes with it. */
#ifndef ACCORD_TORCH_API_H
#define ACCORD_TORCH_API_H

#include <stddef.h>
#include <stdint.h>

#define ACCORD_TORCH_ABI 2u

/* What each function returns. */
#define ACCORD_DONE 0     /* ran (on the GPU: queued) */
#define ACCORD_DECLINED 1 /* not run: take the Python path, which does everything */
#define ACCORD_FAILED 2   /* failed: the accord_failure says why */

/* Why a call failed: the class of accord.errors to raise, and its message. */
typedef struct accord_failure {
  char class_name[32];
  char message[1024];
} accord_failure;

typedef struct accord_torch_api {
  uint32_t abi;
  /* In-place all_reduce of `count` elements at `ptr` on GpuCommunicator `comm`, queued on
   * `stream` behind the work queued on `after`; its mark into `*mark`. */
  int32_t (*gpu_all_reduce)(uintptr_t comm, uint64_t ptr, size_t count, const char* dtype,
                            const char* op, uint64_t stream, uint64_t after, uint64_t* mark,
                            accord_failure* failure);
  /* `stream` waits until the op of `mark` is done. */
  int32_t (*gpu_wait_mark)(uintptr_t comm, uint64_t stream, uint64_t mark, accord_failure* failure);
  /* Whether the op of `mark` is done on the GPU, into `*reached` (0 or 1). */
  int32_t (*gpu_mark_reached)(uintptr_t comm, uint64_t mark, int32_t* reached,
                              accord_failure* failure);
  /* The first error a GPU collective hit, if any. */
  int32_t (*gpu_check)(uintptr_t comm, accord_failure* failure);
  /* Synchronous in-place all_reduce of `nbytes` at `addr` on Communicator `comm`, memory an
   * earlier call registered; ACCORD_DECLINED where it is not, or the communicator is busy. */
  int32_t (*host_all_reduce)(uintptr_t comm, uint64_t addr, size_t nbytes, const char* dtype,
                             const char* op, accord_failure* failure);
  /* all_gather of `bytes_per_rank` at `input` into `output` (by rank) on GpuCommunicator
   * `comm`, queued on `stream` behind the work queued on `after`; its mark into `*mark`. */
  int32_t (*gpu_all_gather)(uintptr_t comm, uint64_t input, uint64_t output, size_t bytes_per_rank,
                            uint64_t stream, uint64_t after, uint64_t* mark,
                            accord_failure* failure);
  /* reduce_scatter of `count_per_rank` elements a rank from `input` into `output`, queued as
   * gpu_all_gather. */
  int32_t (*gpu_reduce_scatter)(uintptr_t comm, uint64_t input, uint64_t output,
                                size_t count_per_rank, const char* dtype, const char* op,
                                uint64_t stream, uint64_t after, uint64_t* mark,
                                accord_failure* failure);
  /* Synchronous all_gather of `bytes_per_rank` at `input` into `output` on Communicator `comm`
   * (in place where `input` is this rank's block of `output`); ACCORD_DECLINED where the memory
   * is not registered, the two overlap otherwise, or the communicator is busy. */
  int32_t (*host_all_gather)(uintptr_t comm, uint64_t input, uint64_t output, size_t bytes_per_rank,
                             const char* dtype, accord_failure* failure);
  /* Synchronous reduce_scatter of `input` (world size blocks of `output_bytes`) into `output`;
   * ACCORD_DECLINED as host_all_gather. */
  int32_t (*host_reduce_scatter)(uintptr_t comm, uint64_t input, uint64_t output,
                                 size_t output_bytes, const char* dtype, const char* op,
                                 accord_failure* failure);
  /* Synchronous all_to_allv: send_counts[j] elements of `input` (packed by rank) to rank j,
   * recv_counts[i] from rank i into `output` (packed), `ranks` entries each; ACCORD_DECLINED as
   * host_all_gather, for an empty side, and for counts that do not fit the tensors. */
  int32_t (*host_all_to_allv)(uintptr_t comm, uint64_t input, size_t input_bytes, uint64_t output,
                              size_t output_bytes, const char* dtype, const uint64_t* send_counts,
                              const uint64_t* recv_counts, size_t ranks, accord_failure* failure);
} accord_torch_api;

#endif
