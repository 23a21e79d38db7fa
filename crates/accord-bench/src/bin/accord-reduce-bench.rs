//! The host reduction kernels' throughput (`accord_coll::reduce::reduce_into`), per dtype and
//! size, against a baseline measured in the same run: the per-block `half` slice conversions
//! that reduced bfloat16 and float16 before the vectorised paths, and f32's own sum over the
//! same bytes as the ceiling of one core. Prints a table; `--csv` for machines.
//!
//! `accord-reduce-bench [--sizes-kib 128,1024,65536] [--reps 5] [--ops sum,max] [--csv]`

use std::time::Instant;

use accord_coll::reduce::reduce_into;
use accord_coll::{DType, ReduceOp};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Bytes each timed run reduces (dst and src each this size over the iterations), so small
/// sizes repeat enough to be timed and large ones run a few times.
const BYTES_PER_RUN: usize = 1 << 30;

struct Args {
    sizes: Vec<usize>,
    reps: usize,
    ops: Vec<ReduceOp>,
    csv: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args { sizes: vec![128 << 10, 1 << 20, 64 << 20], reps: 5, ops: vec![ReduceOp::Sum], csv: false };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--sizes-kib" => {
                a.sizes = value()?
                    .split(',')
                    .map(|s| s.trim().parse::<usize>().map(|k| k << 10).map_err(|e| format!("--sizes-kib {s}: {e}")))
                    .collect::<Result<_, _>>()?;
            }
            "--reps" => a.reps = value()?.parse().map_err(|e| format!("--reps: {e}"))?,
            "--ops" => {
                a.ops = value()?
                    .split(',')
                    .map(|s| s.parse::<ReduceOp>().map_err(|e| e.to_string()))
                    .collect::<Result<_, _>>()?;
            }
            "--csv" => a.csv = true,
            "-h" | "--help" => {
                println!("accord-reduce-bench [--sizes-kib 128,1024,65536] [--reps 5] [--ops sum,max] [--csv]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.sizes.iter().any(|&s| s == 0 || s % 8 != 0) || a.reps == 0 {
        return Err("sizes must be positive multiples of 8 bytes, --reps at least 1".into());
    }
    Ok(a)
}

/// Best-of-`reps` throughput of `f` over `bytes`, counting both operands read (GB/s).
fn gbps(bytes: usize, reps: usize, mut f: impl FnMut()) -> f64 {
    let iters = (BYTES_PER_RUN / bytes).max(1);
    f(); // warm the pages and the caches
    let best = (0..reps)
        .map(|_| {
            let t = Instant::now();
            (0..iters).for_each(|_| f());
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min);
    (2 * bytes * iters) as f64 / best / 1e9
}

macro_rules! half_baseline {
    ($name:ident, $t:ty) => {
        fn $name(d: &mut [$t], s: &[$t], op: ReduceOp) {
            const BLOCK: usize = 256;
            let (mut wd, mut ws) = ([0f32; BLOCK], [0f32; BLOCK]);
            for (dc, sc) in d.chunks_mut(BLOCK).zip(s.chunks(BLOCK)) {
                let k = dc.len();
                dc.convert_to_f32_slice(&mut wd[..k]);
                sc.convert_to_f32_slice(&mut ws[..k]);
                // The f32 combine is the library's own, as it was in the old kernel.
                reduce_into(bytemuck::cast_slice_mut(&mut wd[..k]), bytemuck::cast_slice(&ws[..k]), DType::F32, op)
                    .unwrap_or(());
                dc.convert_from_f32_slice(&wd[..k]);
            }
        }
    };
}
half_baseline!(baseline_f16, f16);
half_baseline!(baseline_bf16, bf16);

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("accord-reduce-bench: {e}");
            std::process::exit(2);
        }
    };
    #[cfg(target_arch = "x86_64")]
    let features = format!(
        "avx2 {}, f16c {}",
        std::arch::is_x86_feature_detected!("avx2"),
        std::arch::is_x86_feature_detected!("f16c")
    );
    #[cfg(not(target_arch = "x86_64"))]
    let features = String::from("not x86-64");
    if args.csv {
        println!("dtype,op,bytes,accord_gbps,baseline_gbps,ratio,f32_sum_gbps");
    } else {
        println!("# host reduction kernels, one core; GB/s counts both operands read; {features}");
        println!("# baseline: per-block `half` slice conversions (the kernel before); f32 sum: the same bytes as f32");
        println!(
            "{:>6} {:>5} {:>10} {:>12} {:>12} {:>8} {:>12}",
            "dtype", "op", "bytes", "accord GB/s", "baseline", "ratio", "f32 sum"
        );
    }
    for &bytes in &args.sizes {
        let ones: Vec<u8> = (0..bytes / 4).flat_map(|i| (1.0f32 + (i % 97) as f32 / 128.0).to_le_bytes()).collect();
        let mut dst = ones.clone();
        let f32_sum = gbps(bytes, args.reps, || reduce_into(&mut dst, &ones, DType::F32, ReduceOp::Sum).unwrap_or(()));
        for &op in &args.ops {
            for dtype in [DType::BF16, DType::F16] {
                // Normal values near 1, so no operand is subnormal (a penalty on some cores).
                let bits: Vec<u16> = (0..bytes / 2)
                    .map(|i| {
                        let v = 1.0 + (i % 97) as f32 / 128.0;
                        if dtype == DType::BF16 {
                            bf16::from_f32(v).to_bits()
                        } else {
                            f16::from_f32(v).to_bits()
                        }
                    })
                    .collect();
                let as_bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
                let mut d = as_bytes.clone();
                let ours = gbps(bytes, args.reps, || reduce_into(&mut d, &as_bytes, dtype, op).unwrap_or(()));
                let theirs = if dtype == DType::BF16 {
                    let s: Vec<bf16> = bits.iter().map(|&b| bf16::from_bits(b)).collect();
                    let mut d = s.clone();
                    gbps(bytes, args.reps, || baseline_bf16(&mut d, &s, op))
                } else {
                    let s: Vec<f16> = bits.iter().map(|&b| f16::from_bits(b)).collect();
                    let mut d = s.clone();
                    gbps(bytes, args.reps, || baseline_f16(&mut d, &s, op))
                };
                let name = if dtype == DType::BF16 { "bf16" } else { "f16" };
                if args.csv {
                    println!("{name},{op},{bytes},{ours:.2},{theirs:.2},{:.3},{f32_sum:.2}", ours / theirs);
                } else {
                    println!(
                        "{name:>6} {op:>5} {bytes:>10} {ours:>12.1} {theirs:>12.1} {:>8.2} {f32_sum:>12.1}",
                        ours / theirs
                    );
                }
            }
        }
    }
}
