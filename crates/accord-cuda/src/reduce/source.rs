//! CUDA C++ of the reduction kernels: one template body, instantiated for
//! each (operation, element type) as an `extern "C"` kernel.

use super::{DType, ReduceOpKind};

/// Threads per block of every reduction kernel (also its `__launch_bounds__`).
pub const REDUCE_BLOCK_THREADS: u32 = 256;
/// Resident blocks per multiprocessor the grid is sized for (2048 threads / 256).
pub const REDUCE_BLOCKS_PER_SM: u32 = 8;
/// Bytes moved per vectorised load or store.
pub const REDUCE_VECTOR_BYTES: usize = 16;

/// The shared prelude: element traits and the grid-stride body.
const PRELUDE: &str = r#"
// accord-cuda reduction kernels (generated; do not edit).
#if ACCORD_WITH_HALF
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

#define ACCORD_OP_SUM 0
#define ACCORD_OP_PROD 1
#define ACCORD_OP_MIN 2
#define ACCORD_OP_MAX 3
#define ACCORD_OP_AVG 4

template <typename T> struct AccordTraits;
template <> struct AccordTraits<float> {
  typedef float C;
  static __device__ __forceinline__ C load(float x) { return x; }
  static __device__ __forceinline__ float store(C x) { return x; }
  static __device__ __forceinline__ C add(C a, C b) { return a + b; }
  static __device__ __forceinline__ C mul(C a, C b) { return a * b; }
};
#if ACCORD_WITH_HALF
template <> struct AccordTraits<__half> {
  typedef float C;
  static __device__ __forceinline__ C load(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half store(C x) { return __float2half_rn(x); }
  static __device__ __forceinline__ C add(C a, C b) { return a + b; }
  static __device__ __forceinline__ C mul(C a, C b) { return a * b; }
};
template <> struct AccordTraits<__nv_bfloat16> {
  typedef float C;
  static __device__ __forceinline__ C load(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 store(C x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ C add(C a, C b) { return a + b; }
  static __device__ __forceinline__ C mul(C a, C b) { return a * b; }
};
#endif
// Integers wrap on overflow (computed unsigned, so there is no undefined behaviour).
template <> struct AccordTraits<int> {
  typedef int C;
  static __device__ __forceinline__ C load(int x) { return x; }
  static __device__ __forceinline__ int store(C x) { return x; }
  static __device__ __forceinline__ C add(C a, C b) { return (int)((unsigned int)a + (unsigned int)b); }
  static __device__ __forceinline__ C mul(C a, C b) { return (int)((unsigned int)a * (unsigned int)b); }
};
template <> struct AccordTraits<long long> {
  typedef long long C;
  static __device__ __forceinline__ C load(long long x) { return x; }
  static __device__ __forceinline__ long long store(C x) { return x; }
  static __device__ __forceinline__ C add(C a, C b) {
    return (long long)((unsigned long long)a + (unsigned long long)b);
  }
  static __device__ __forceinline__ C mul(C a, C b) {
    return (long long)((unsigned long long)a * (unsigned long long)b);
  }
};

// min/max propagate NaN (x != x only for NaN; always false for integers).
template <typename T, int OP>
__device__ __forceinline__ T accord_apply(T x, T y, typename AccordTraits<T>::C divisor) {
  typedef AccordTraits<T> Tr;
  typename Tr::C a = Tr::load(x);
  typename Tr::C b = Tr::load(y);
  typename Tr::C r;
  if (OP == ACCORD_OP_SUM) { r = Tr::add(a, b); }
  else if (OP == ACCORD_OP_PROD) { r = Tr::mul(a, b); }
  else if (OP == ACCORD_OP_MIN) { r = (a != a || a < b) ? a : b; }
  else if (OP == ACCORD_OP_MAX) { r = (a != a || a > b) ? a : b; }
  else { r = Tr::add(a, b) / divisor; }
  return Tr::store(r);
}

template <typename T, int W> struct alignas(sizeof(T) * W) AccordVec { T v[W]; };

// dst[i] = a[i] op b[i] for i < count. dst may alias a or b exactly.
// 16-byte vectors when all three pointers are 16-byte aligned; grid-stride loops.
template <typename T, int OP>
__device__ __forceinline__ void accord_reduce_body(T* dst, const T* a, const T* b,
                                                   unsigned long long count, double divisor_f64) {
  typedef typename AccordTraits<T>::C C;
  const C divisor = (C)divisor_f64;
  constexpr int W = 16 / sizeof(T);
  typedef AccordVec<T, W> V;
  const unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const bool aligned =
      (((unsigned long long)dst | (unsigned long long)a | (unsigned long long)b) & 15ull) == 0ull;
  const unsigned long long vec_count = aligned ? count / W : 0ull;
  const V* va = reinterpret_cast<const V*>(a);
  const V* vb = reinterpret_cast<const V*>(b);
  V* vd = reinterpret_cast<V*>(dst);
  for (unsigned long long i = tid; i < vec_count; i += stride) {
    V x = va[i];
    V y = vb[i];
    V r;
#pragma unroll
    for (int k = 0; k < W; ++k) { r.v[k] = accord_apply<T, OP>(x.v[k], y.v[k], divisor); }
    vd[i] = r;
  }
  for (unsigned long long i = vec_count * W + tid; i < count; i += stride) {
    dst[i] = accord_apply<T, OP>(a[i], b[i], divisor);
  }
}
"#;

/// The instantiation line, with `{NAME}`, `{T}` and `{OP}` placeholders.
const INSTANCE: &str = "extern \"C\" __global__ void __launch_bounds__({BLOCK}) {NAME}({T}* dst, const {T}* a, \
                        const {T}* b, unsigned long long count, double divisor) \
                        {{ accord_reduce_body<{T}, {OP}>(dst, a, b, count, divisor); }}\n";

/// The `extern "C"` name of one reduction kernel, for example `accord_reduce_sum_bf16`.
pub fn reduce_kernel_name(op: ReduceOpKind, dtype: DType) -> String {
    format!("accord_reduce_{}_{}", op.name(), dtype.name())
}

/// Source of one module holding a kernel for every pair of `ops` x `dtypes`.
/// Half-precision headers are included only when an f16/bf16 kernel is asked for.
pub fn reduce_module_source(ops: &[ReduceOpKind], dtypes: &[DType]) -> String {
    let with_half = dtypes.iter().any(|d| matches!(d, DType::F16 | DType::BF16));
    let mut source = format!("#define ACCORD_WITH_HALF {}\n", u8::from(with_half));
    source.push_str(PRELUDE);
    for dtype in dtypes {
        for op in ops {
            let line = INSTANCE
                .replace("{{", "{")
                .replace("}}", "}")
                .replace("{BLOCK}", &REDUCE_BLOCK_THREADS.to_string())
                .replace("{NAME}", &reduce_kernel_name(*op, *dtype))
                .replace("{T}", dtype.c_type())
                .replace("{OP}", op.macro_name());
            source.push_str(&line);
        }
    }
    source
}

/// Blocks for `count` elements of `element_bytes`: one vector per thread,
/// capped at [`REDUCE_BLOCKS_PER_SM`] per multiprocessor (the grid-stride
/// loop covers the rest), at least one.
pub fn reduce_grid_blocks(count: u64, element_bytes: usize, multiprocessor_count: u32) -> u32 {
    let per_vector = (REDUCE_VECTOR_BYTES / element_bytes.max(1)).max(1) as u64;
    let vectors = count.div_ceil(per_vector);
    let wanted = vectors.div_ceil(u64::from(REDUCE_BLOCK_THREADS));
    let cap = u64::from(multiprocessor_count.max(1)) * u64::from(REDUCE_BLOCKS_PER_SM);
    wanted.clamp(1, cap) as u32
}
