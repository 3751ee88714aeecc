//! Lowering: schedule -> verified, flattened `PrimFunc`. One pass per file; `lower` below is
//! the whole pipeline, top to bottom, with the verifier between passes and `RIVET_DUMP=dir`
//! writing the IR after each pass.

pub mod bounds;
pub mod flatten;
pub mod fma;
pub mod fuse_chunks;
pub mod fuse_rows;
pub mod nest;
pub mod outline;
pub mod overwrite;
pub mod partition;
pub mod row_locals;
pub mod sync;
pub mod tensorize;
pub mod tile_fold;
pub mod unroll;
pub mod unswitch;
pub mod vectorize;
pub mod work;
pub mod zero_init;

use crate::arith::simplify;
use crate::build_times::phase;
use crate::error::Result;
use crate::ir::stmt::PrimFunc;
use crate::ir::verify::{verify, verify_loaded};
use crate::schedule::Schedule;
use crate::target::Target;
use crate::te::Tensor;

/// Writes `text()` to `$RIVET_DUMP/<func>.<step>.<what>` when RIVET_DUMP is set (the text is
/// made only then: printing the IR after every pass cost more than some passes).
pub fn dump(func: &str, step: usize, what: &str, text: impl FnOnce() -> String) {
    if let Ok(dir) = std::env::var("RIVET_DUMP") {
        let dir = std::path::Path::new(&dir);
        let _ = std::fs::create_dir_all(dir);
        let _ = std::fs::write(dir.join(format!("{func}.{step:02}.{what}")), text());
    }
}

fn after(f: &PrimFunc, step: usize, pass: &str, flattened: bool) -> Result<()> {
    dump(&f.name, step, &format!("{pass}.ir"), || f.to_string());
    phase("verify", || verify(f, flattened))
}

/// How to lower and compile.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Options {
    /// Checked mode: every load and store is bounds-checked in the generated code and a
    /// violation is a `rivet.IndexError` naming the tensor, the index and the extent (CubeCL's
    /// checked launches). Slower; for tests, fuzzing and debugging a proof.
    pub checked: bool,
    /// Contract float `a * b + c` into fused multiply-adds (`lower::fma`): one rounding
    /// instead of two, as BLAS does, so results differ from unfused maths by rounding; every
    /// backend and the interpreter compute the same `Fma` nodes (bit-exact among them).
    /// Applies to functions built from a schedule; a saved module keeps what it was built
    /// with.
    pub fma: bool,
    /// The vector width `vectorize`d loops are strip-mined by, in bytes, instead of the
    /// target's (`Target::vectorize_bytes`): `Some(0)` keeps them scalar (`RIVET_VECTORIZE=0`),
    /// `Some(16)` with the interpreter runs the vector IR lane by lane (tests).
    pub vector_bytes: Option<u32>,
    /// Build a CPU schedule exactly as written: no default CPU schedule
    /// (`schedule::cpu_default`) for a schedule the user left untouched
    /// (`RIVET_DEFAULT_SCHEDULE=0`, `build(..., default_schedule=False)`).
    pub as_written: bool,
    /// Fuse consecutive root-level parallel loops over the same rows (`lower::fuse_rows`):
    /// set by `build` for a program under the default CPU schedule, never for a schedule the
    /// user wrote.
    pub fuse_rows: bool,
}

impl Options {
    /// The defaults, with `checked` on when the environment has `RIVET_CHECKED=1`.
    pub fn from_env() -> Options {
        Options {
            checked: std::env::var("RIVET_CHECKED").is_ok_and(|v| v == "1"),
            fma: false,
            vector_bytes: std::env::var("RIVET_VECTORIZE")
                .is_ok_and(|v| v == "0")
                .then_some(0),
            as_written: std::env::var("RIVET_DEFAULT_SCHEDULE").is_ok_and(|v| v == "0"),
            fuse_rows: false,
        }
    }
}

/// Where a function to lower comes from.
pub enum Source<'a> {
    /// A schedule and the tensors of the call (inputs, then outputs), from `build`.
    Schedule {
        sched: &'a Schedule,
        args: &'a [Tensor],
        name: &'a str,
    },
    /// A loop-nest function read from a saved module: untrusted, verified before anything
    /// reads it, and proven again (never trusting the checks it carries).
    Loaded(PrimFunc),
}

/// A lowered function: the loop nest (what modules save) and the function a backend compiles.
pub struct Lowered {
    pub nest: PrimFunc,
    pub func: PrimFunc,
}

/// The lowering pipeline, top to bottom; `build` and module loading both run it.
pub fn lower(src: Source<'_>, target: &Target, opts: Options) -> Result<Lowered> {
    // 1. The loop nest: bound inference, schedule, inlining, compute_at regions.
    let nest = match src {
        Source::Schedule { sched, args, name } => {
            let mut nest = phase("nest", || nest::build_nest(sched, args, name))?;
            dump(name, 0, "nest.ir", || nest.to_string());
            // 1b. Tensorize: marked nests become intrinsic calls (part of the saved nest, so
            //     a loaded module proves the calls again). Before FMA contraction, which
            //     would hide the `C + A * B` the intrinsics match.
            let marks: Vec<tensorize::Mark> = sched
                .stages
                .iter()
                .flat_map(|st| {
                    st.tensorize.iter().map(|(v, i)| tensorize::Mark {
                        var: v.clone(),
                        intrin: *i,
                        stage: st.tensor.name().to_string(),
                    })
                })
                .collect();
            phase("tensorize", || tensorize::apply(&mut nest, &marks))?;
            // 1c. FMA contraction where asked; part of the nest (what modules save), so a
            //     loaded module computes the same.
            if opts.fma {
                fma::contract_func(&mut nest);
            }
            // 1d. Row fusion of the default CPU schedule's parallel loops; part of the nest,
            //     so a loaded module runs (and proves) the fused loops.
            if opts.fuse_rows && target.kind == crate::target::TargetKind::Cpu {
                phase("fuse rows", || fuse_rows::fuse(&mut nest));
                // 1e. Locals that one fused loop touches only in its own row: one row each,
                //     allocated per iteration (they stay in the cache; small ones go on the
                //     stack).
                phase("row locals", || row_locals::shrink(&mut nest));
                // 1f. A row loop taken into a later column reduction's chunk loop: each chunk
                //     of rows read once for both (after 1e: a row's locals come with it).
                phase("fuse chunks", || fuse_chunks::fuse(&mut nest));
                dump(name, 0, "fused.ir", || nest.to_string());
            }
            nest
        }
        Source::Loaded(f) => {
            phase("verify loaded", || verify_loaded(&f))?;
            f
        }
    };
    let mut f = phase("clone nest", || nest.clone());
    after(&f, 1, "nest", false)?;
    // 2. The bounds proof: every access in bounds, every int64 node inside int64, or a
    //    per-call check, or a CompileError.
    f.checks.clear();
    phase("bounds proof", || bounds::prove(&mut f))?;
    after(&f, 2, "bounds", false)?;
    // 2b. Tile divisions folded where the loop ranges make it exact. After the proof, which
    //     reads split guards structurally (`j.o * 4 + j.i < n` bounds the index it guards;
    //     a folded `j.o` would lose that fact), like simplification below: both rewrite
    //     expressions into exactly equal ones.
    phase("tile fold", || tile_fold::fold(&mut f));
    // 3. Simplification.
    f.body = phase("simplify", || simplify::simplify_stmt(&f.body));
    after(&f, 3, "simplify", false)?;
    // 3b. Locals stored in full before any read are marked: on the CPU their `Allocate`
    //     skips the zeroing; the interpreter fills them with a poison pattern, so the oracle
    //     itself shows a wrong mark. (CUDA keeps zeroing: nothing marked there.)
    if target.kind != crate::target::TargetKind::Cuda {
        phase("overwrite marks", || overwrite::mark(&mut f));
    }
    // 4. Flattening to one element offset per access; checked mode keeps one index per dim,
    //    so the backends can check each against its extent.
    if !opts.checked {
        phase("flatten", || flatten::flatten(&mut f));
        f.body = phase("simplify", || simplify::simplify_stmt(&f.body));
        after(&f, 4, "flatten", true)?;
        // 4b. Vector IR: `vectorize`d loops strip-mined by the target's vector width. First
        //     each loop whose loading selects are guarded by bounds on its variable (padding,
        //     a ragged panel) split into guarded edges and an unguarded interior, then the
        //     selects on loop-invariant conditions taken out as branches around copies of
        //     the loop: an arm that loads would keep the loop scalar.
        let width = opts.vector_bytes.or(target.vectorize_bytes());
        // `RIVET_PARTITION=0` keeps such loops whole (for comparisons).
        if width.is_some_and(|w| w > 0) && !std::env::var("RIVET_PARTITION").is_ok_and(|v| v == "0")
        {
            phase("partition", || partition::partition(&mut f));
        }
        phase("unswitch selects", || unswitch::selects(&mut f));
        // A float32 loop computing `erf` gets 16 lanes off the GPU where the CPU has AVX-512:
        // one 16-lane computation of it instead of four 4-lane ones.
        phase("vectorize", || {
            vectorize::vectorize(
                &mut f,
                width.filter(|&w| w > 0),
                target.kind != crate::target::TargetKind::Cuda && crate::target::erf16_wide(),
            )
        });
        f.body = phase("simplify", || simplify::simplify_stmt(&f.body));
        after(&f, 4, "vectorize", true)?;
        // 4c. On the CPU, the layout tests of vector loops moved out of the serial loops around
        //     them, and short loops of vector stores unrolled (both let the code generator keep
        //     loop-carried vectors in registers); zero stores into locals that `Allocate` has
        //     just zeroed dropped.
        if target.kind == crate::target::TargetKind::Cpu {
            phase("unswitch", || unswitch::unswitch(&mut f));
            phase("unroll", || unroll::unroll(&mut f));
            phase("drop zero inits", || zero_init::drop_zero_inits(&mut f));
            f.body = phase("simplify", || simplify::simplify_stmt(&f.body));
            after(&f, 4, "unroll", true)?;
        }
    }
    // 5. The host/device split: parallel loops and GPU kernels outlined, with their captures.
    //    Every target runs the same passes; backends differ in how they run a `Launch`.
    phase("outline", || outline::outline(&mut f));
    // 6. Barriers in GPU kernels where shared memory is written and read by different threads.
    phase("barriers", || sync::insert_barriers(&mut f));
    after(&f, 5, "split", !opts.checked)?;
    Ok(Lowered { nest, func: f })
}
