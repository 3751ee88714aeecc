//! Resource limits that keep hostile programs and module files from exhausting the stack,
//! memory or time. Every limit is a `CompileError` that names it, never a crash or a hang.
//!
//! The passes and backends recurse on expression depth; the limits below keep that recursion
//! well inside the stack of the thread `build` and module loading run on (`COMPILE_STACK`).
//! Sizes are counted as trees (an expression shared twice counts twice), because that is the
//! work the passes do; counting stops at the limit, so checking is bounded too.

/// Deepest expression the DSL builds (`e = e + 1.0` applied this many times).
pub const MAX_EXPR_DEPTH: u32 = 1000;
/// Deepest expression in lowered IR (inlining and index arithmetic add depth to the DSL's).
pub const MAX_IR_DEPTH: u32 = 4000;
/// Deepest statement nesting in lowered IR (loops, ifs, lets, allocations, sequences). The
/// number of stages does not count: a program's root temporaries share one `Allocate`; what
/// nests is loops inside loops (`compute_at` chains nest each producer in its consumer).
pub const MAX_STMT_DEPTH: u32 = 2048;
/// Deepest statement nesting of the loop nest `build` makes from a schedule, before the
/// passes: `MAX_STMT_DEPTH` less the few levels the passes may add (vector strip-mining,
/// layout tests, outlining). A schedule past it is a `CompileError` naming `MAX_STMT_DEPTH`,
/// so the verifier's own limit is never reached by a program `build` accepted.
pub const MAX_NEST_DEPTH: u32 = MAX_STMT_DEPTH - 64;
/// Most expression and statement nodes, counted as a tree, in one lowered function.
pub const MAX_FUNC_NODES: usize = 2_000_000;
/// Most nodes, counted as a tree, of one shape dim or axis range of a stage. They are index
/// arithmetic (`n`, `2 * n + 1`); the passes simplify and substitute them into every bound
/// and check of the nest, so their cost multiplies (a shape of 6,561 tree nodes took 16 s to
/// build, one of 59,049 did not finish in a minute). Real programs stay far below.
pub const MAX_SHAPE_NODES: usize = 4096;
/// Largest module file `load_module` reads.
pub const MAX_MODULE_BYTES: usize = 64 << 20;
/// Stack of the thread that lowers and compiles (deep recursion stays far from its end).
pub const COMPILE_STACK: usize = 256 << 20;
/// Largest local buffer (temporary) a kernel allocates: the bound of rivet's tensors.
pub const MAX_ALLOC_BYTES: usize = rivet_runtime::MAX_ALLOC_BYTES;
