//! The user's workflow for the GPU, Rust half: define `C = A @ B` with the Rust DSL, build it
//! for `target="cuda"` with no schedule (the default GPU schedule gives it the shared-memory
//! tiled GEMM: 64 x 64 outputs per block of 16 x 16 threads, 4 x 4 per thread, k tiles in
//! shared memory; `schedule::gpu_default`) and save the module. `compiler/examples/use_gemm_cuda.py` loads it from
//! Python and runs it on torch CUDA tensors against `torch.mm`, or, on a machine without a
//! GPU, runs the same IR on the interpreter against numpy.
//!
//! Building needs no GPU: the CUDA C is generated here and, where NVRTC is found (the torch
//! wheel ships it; `RIVET_NVRTC_PATH` points at it), compiled to PTX and a cubin. The module
//! file holds the loop IR, not the binaries: loading proves and compiles it again (NVRTC's
//! outputs come from the disk cache, `RIVET_CACHE_DIR`, when they were compiled before).
//!
//! Run: `RIVET_NVRTC_PATH=.../nvidia/cu13/lib cargo run --release -p rivet-compiler --example gemm_cuda -- gemm_cuda.rivet`

use rivet_compiler::te;
use rivet_compiler::{build, Schedule};
use rivet_runtime::DType;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "gemm_cuda.rivet".into());

    // C[i, j] = sum_r A[i, r] * B[r, j], for any m, k, n (symbolic, bound at call time).
    let [m, k, n] = ["m", "k", "n"].map(te::var);
    let a = te::placeholder([&m, &k], DType::F32, "A")?;
    let b = te::placeholder([&k, &n], DType::F32, "B")?;
    let r = te::reduce_axis(0, &k, "r")?;
    let c = te::compute(
        [&m, &n],
        |[i, j]| te::sum(a.at((i, &r)) * b.at((&r, j)), &r),
        "C",
    )?;

    // The GPU schedule (what `rivet.kernels.matmul(target="cuda")` uses, written out; a
    // correct baseline, not a fast one: no shared-memory tiles yet, see docs/cuda.md):
    // rows and columns split into TILE-sized tiles; a block per tile (blockIdx.y, blockIdx.x),
    // a thread per output of the tile (threadIdx.y, threadIdx.x); each thread runs the whole
    // reduction serially, in order, so its result is the interpreter's bit for bit. Ragged
    // edges (m or n not a multiple of TILE) are guarded by the generated code.
    // No binding: `build` for "cuda" applies the default GPU schedule.
    let s = Schedule::new(&[&c])?;
    let args = [a, b, c];
    let module = build(&s, &args, "cuda", "mm")?;
    module.save(&path)?;
    println!(
        "built 'mm' (C = A @ B, float32, any m, k, n) for target 'cuda' and saved it to {path}"
    );
    // Two kernels: the reduction's initialisation (C = 0) and the tiled product; the comment
    // above each in the source says what it reads, writes and its block shape.
    let cuda = module.get_source("cuda")?;
    println!("  CUDA C: {} bytes", cuda.len());
    for l in cuda.lines().filter(|l| l.starts_with("// kernel ")) {
        println!("    {}", l.trim_start_matches("// "));
    }
    for arch in ["sm_80", "sm_90"] {
        let m = build(&s, &args, &format!("cuda -arch={arch}"), "mm")?;
        match m.get_source("ptx") {
            Ok(ptx) => println!(
                "  {arch}: NVRTC compiled it, {} bytes of PTX ({})",
                ptx.len(),
                ptx.lines()
                    .find(|l| l.starts_with(".target"))
                    .unwrap_or("?")
            ),
            Err(e) => println!("  {arch}: source only, no PTX: {e}"),
        }
    }
    Ok(())
}
