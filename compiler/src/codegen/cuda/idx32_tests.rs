//! Tests of the index-width choice (`idx32`): the per-call predicate at hostile dims and
//! strides, kernels that only get one width, and a property test checking the analysis
//! against an independent enumeration of every index node's value (`enumerate_range`) on the
//! test suite's GPU kernels with random dims and hostile strides. The generated 32-bit
//! kernels themselves run under the host emulation in `tests.rs`, bit for bit against the
//! interpreter, and NVRTC compiles both widths there (`compiles_cleanly`).

use super::idx32::{analyse, endpoints, enumerate_range, eval_endpoint, Index32, Skip};
use super::source::{generate, KernelInfo};
use super::tests::{
    allreduce_kernels, bin, bound, cache_schedules, canonical, ceil_div, double, every_op, if_,
    int, library, looped, lt, prepare, st, v,
};
use crate::ir::expr::{BinOp, Expr, Var};
use crate::ir::stmt::{ForKind, PrimFunc, Stmt, ThreadTag};
use crate::ir::test_util::{func, input, output};
use proptest::prelude::*;
use rivet_runtime::DType;
use std::collections::HashMap;

const I32_MAX: i64 = i32::MAX as i64;
const I32_MIN: i64 = i32::MIN as i64;

/// The values of the captured variables at each launch of `f`'s host part, from the dims and
/// strides in `env` (host `let`s evaluated, temporaries' compact strides bound).
fn launches(f: &PrimFunc, env: &HashMap<u32, i64>) -> Vec<(usize, HashMap<u32, i64>)> {
    fn walk(
        f: &PrimFunc,
        s: &Stmt,
        env: &mut HashMap<u32, i64>,
        out: &mut Vec<(usize, HashMap<u32, i64>)>,
    ) {
        let eval = |e: &Expr, env: &HashMap<u32, i64>| {
            crate::arith::exact::eval_exact(e, &|v| env.get(&v.id).copied()).ok()
        };
        match s {
            Stmt::Seq(v) => v.iter().for_each(|s| walk(f, s, env, out)),
            Stmt::Let { var, value, body } => {
                if let Some(x) = eval(value, env) {
                    env.insert(var.id, x);
                    walk(f, body, env, out);
                }
            }
            Stmt::Allocate { bufs, body } => {
                for buf in bufs {
                    let b = f.buffer(*buf);
                    let mut count = Some(1i64);
                    for (e, v) in b.shape.iter().zip(&b.strides).rev() {
                        env.insert(v.id, count.unwrap_or(i64::MAX));
                        count = count
                            .zip(eval(e, env))
                            .and_then(|(c, n)| c.checked_mul(n.max(0)));
                    }
                }
                walk(f, body, env, out);
            }
            Stmt::Launch { kernel } => out.push((*kernel, env.clone())),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(f, &f.body, &mut env.clone(), &mut out);
    out
}

fn info(f: &PrimFunc) -> KernelInfo {
    let g = generate(f, "").unwrap();
    assert_eq!(g.kernels.len(), 1);
    g.kernels.into_iter().next().unwrap()
}

/// `double`'s captured values: n, A's stride, C's stride.
fn double_env(f: &PrimFunc, n: i64, a_s: i64, c_s: i64) -> HashMap<u32, i64> {
    let mut env = HashMap::new();
    env.insert(f.dims[0].id, n);
    env.insert(f.buffer(f.params[0]).strides[0].id, a_s);
    env.insert(f.buffer(f.params[1]).strides[0].id, c_s);
    env
}

#[test]
fn idx32_choice_at_hostile_dims_and_strides() {
    let f = double();
    let k = info(&f);
    assert!(matches!(k.index32, Index32::When(_)), "{:?}", k.index32);
    assert_eq!(k.entries(), vec![k.name.clone(), format!("{}_i32", k.name)]);
    const P31: i64 = 1 << 31;
    // (n, A stride, C stride, 32-bit?). `double` computes i = bx * 64 + tx for bx below
    // ceil(n / 64), whatever the guard `i < n` says afterwards, and offsets i * stride.
    let cases: &[(i64, i64, i64, bool)] = &[
        (1000, 1, 1, true),
        (0, 1, 1, true),
        (1, 1, 1, true),
        // The largest index is ceil(n / 64) * 64 - 1 = 2^31 - 1 exactly: fits.
        (P31 - 1, 1, 1, true),
        (P31 - 64, 1, 1, true),
        (P31, 1, 1, false),
        (P31 + 5, 1, 1, false), // e.g. a 1-byte dtype of more than 2^31 elements
        (1 << 32, 1, 1, false),
        (1 << 62, 1, 1, false),
        (i64::MAX, 1, 1, false), // the grid's own bound overflows int64: not 32-bit
        // 2^30 elements of stride 2: the last offset is 2^31 - 2; one more is over.
        (1 << 30, 2, 1, true),
        ((1 << 30) + 1, 2, 1, false),
        // Negative strides (numpy views): offsets down to (n' - 1) * stride.
        (1000, -1, -1, true),
        (1000, -1000, 1, true),
        (1 << 20, -2048, 1, true),
        (1 << 20, -2049, 1, false),
        (1000, I32_MIN, 1, false),
        (1, I32_MIN, 1, false), // i reaches 63 before the guard: 63 * -2^31
        // Strides that do not fit int32 themselves (the kernel's `int` parameters).
        (1000, P31, 1, false),
        (1000, 1, P31, false),
        (1000, 1, -P31 - 1, false),
        (0, 1, 1 << 40, false),
        (1000, P31 - 1, 1, false),
        // The largest i is 1023: 1023 * 2099202 = 2^31 - 2, 1023 * 2099203 > 2^31 - 1.
        (1000, 2099202, 1, true),
        (1000, 2099203, 1, false),
    ];
    for &(n, a, c, want) in cases {
        let env = double_env(&f, n, a, c);
        let got = k.index32.fits(&|v| env.get(&v.id).copied());
        assert_eq!(got, want, "n = {n}, A stride {a}, C stride {c}");
        let (entry, narrow) = k.entry(&|v| env.get(&v.id).copied());
        assert_eq!(narrow, want);
        assert_eq!(
            entry,
            if want {
                k.name32.as_str()
            } else {
                k.name.as_str()
            }
        );
        // Where the sizes can be enumerated, the enumeration agrees that it had to be so.
        if n <= 4096 {
            let (lo, hi) = enumerate_range(&f, &f.kernels[0], &env, u64::MAX)
                .unwrap()
                .all;
            let inside = lo >= I32_MIN as i128 && hi <= I32_MAX as i128;
            assert!(
                !want || inside,
                "n = {n}: picked 32-bit, but indices reach [{lo}, {hi}]"
            );
        }
    }
}

/// A kernel whose index is read from memory (a gather) has only the 64-bit entry.
#[test]
fn idx32_indices_read_from_memory_keep_64_bits() {
    let (n, bx, tx) = (Var::new("n"), Var::new("bx"), Var::new("tx"));
    let a = input(0, "A", DType::F32, vec![v(&n)]);
    let ix = input(1, "I", DType::I64, vec![v(&n)]);
    let c = output(2, "C", DType::F32, vec![v(&n)]);
    let i = v(&bx).mul(&int(64)).add(&v(&tx));
    let gathered = Expr::load(ix.id, vec![i.clone()], DType::I64);
    let body = bound(
        &bx,
        ceil_div(v(&n), 64),
        ThreadTag::BlockX,
        bound(
            &tx,
            int(64),
            ThreadTag::ThreadX,
            if_(
                lt(i.clone(), v(&n)),
                st(&c, vec![i], Expr::load(a.id, vec![gathered], DType::F32)),
            ),
        ),
    );
    // Built flattened by hand: the bounds proof would refuse an unchecked gather anyway; the
    // point is what the index-width analysis says of such a kernel.
    let f = prepare(func("gather", vec![a, ix, c], vec![n], body));
    let g = generate(&f, "").unwrap();
    let k = &g.kernels[0];
    assert!(
        matches!(&k.index32, Index32::Never(why) if why.contains("read from memory")),
        "{:?}",
        k.index32
    );
    assert_eq!(k.entries(), vec![k.name.clone()]);
    assert!(!g.source.contains("_i32"), "{}", g.source);
    assert!(
        g.source.contains("64-bit index arithmetic (the index"),
        "{}",
        g.source
    );
}

/// A constant loop of 2^32 iterations: its indices can never fit int32, statically.
#[test]
fn idx32_constant_indices_outside_int32_keep_64_bits() {
    let (bx, j) = (Var::new("bx"), Var::new("j"));
    let a = output(0, "A", DType::U8, vec![int(1 << 33)]);
    let body = bound(
        &bx,
        int(2),
        ThreadTag::BlockX,
        looped(
            &j,
            int(1 << 32),
            ForKind::Serial,
            st(
                &a,
                vec![v(&bx).mul(&int(1 << 32)).add(&v(&j))],
                Expr::const_int(1, DType::U8),
            ),
        ),
    );
    let f = prepare(func("big", vec![a], vec![], body));
    let k = info(&f);
    assert!(
        matches!(&k.index32, Index32::Never(why) if why.contains("outside int32")),
        "{:?}",
        k.index32
    );
}

/// A kernel touching no tensor (a local buffer only): every bound is a constant inside int32,
/// so the 32-bit entry is the only one.
#[test]
fn idx32_constant_indices_inside_int32_need_no_check() {
    let f = double();
    let k = &f.kernels[0];
    // Only the captured dims and strides make `double` call-dependent: without them (a body of
    // thread indices and constants), the analysis needs no per-call check.
    let mut local = k.clone();
    local.vars.clear();
    let (tx, j) = (Var::new("tx"), Var::new("j"));
    let buf = crate::ir::test_util::buffer(
        9,
        "L",
        DType::F32,
        vec![int(64)],
        crate::ir::stmt::BufKind::Param { output: true },
    );
    let mut g = f.clone();
    g.buffers.push(buf.clone());
    local.body = bound(
        &tx,
        int(64),
        ThreadTag::ThreadX,
        looped(
            &j,
            int(4),
            ForKind::Serial,
            st(
                &buf,
                vec![bin(BinOp::FloorMod, v(&tx).add(&v(&j)), int(64))],
                Expr::constant(1.0, DType::F32),
            ),
        ),
    );
    assert_eq!(analyse(&g, &local).0, Index32::Always);
}

/// Every GPU kernel of this test module, lowered: the canonical ones, the kernel library's
/// GPU schedules, the cache schedules, the cross-thread reductions.
fn pool() -> Vec<PrimFunc> {
    let mut v: Vec<PrimFunc> = canonical().into_iter().map(|(_, f)| f).collect();
    v.extend(library());
    v.extend(cache_schedules().into_iter().map(|(f, _)| f));
    v.extend(allreduce_kernels().into_iter().map(|(f, _, _)| f));
    // Every expression kind (fused multiply-adds of loads included), float32 and int64.
    v.extend([DType::F32, DType::I64].map(|dt| every_op(dt).0));
    v
}

thread_local! {
    static POOL: Vec<PrimFunc> = pool();
}

/// Dims: small (the enumeration visits every iteration) but ragged; strides: hostile.
fn stride() -> impl Strategy<Value = i64> {
    prop_oneof![
        2 => prop::sample::select(vec![0i64, 1, -1, 2, -3, 7, 64, -1000]),
        // Magnitudes whose products with the kernels' indices (up to a few hundred) land on
        // both sides of int32's edges, either sign, jittered.
        5 => (
            prop::sample::select(vec![
                1i64 << 20,
                1 << 23,
                1 << 24,
                1 << 25,
                1 << 26,
                1 << 27,
                (1 << 28) - 1,
                (1 << 29) + 3,
                1 << 30,
                I32_MAX,
            ]),
            any::<bool>(),
            -2i64..=2,
        )
            .prop_map(|(x, neg, d)| if neg { -x + d } else { x + d }),
        1 => prop::sample::select(vec![
            I32_MIN,
            I32_MAX + 1,
            I32_MIN - 1,
            1 << 32,
            1 << 40,
            i64::MAX,
            i64::MIN,
        ]),
        1 => any::<i64>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    /// Whenever the host's predicate picks the 32-bit kernel, every index node's value over
    /// every iteration lies in int32 (so the `int` arithmetic is exact); equivalently, the
    /// predicate picks 64 bits whenever the dims and strides make some index leave int32.
    #[test]
    fn idx32_predicate_is_sound_on_the_suites_gpu_kernels(
        which in any::<prop::sample::Index>(),
        dims in prop::collection::vec(prop::sample::select(vec![0i64, 1, 2, 3, 9, 17]), 8),
        strides in prop::collection::vec(stride(), 24),
    ) {
        POOL.with(|pool| -> Result<(), TestCaseError> {
            let f = &pool[which.index(pool.len())];
            let mut env = HashMap::new();
            for (d, x) in f.dims.iter().zip(dims.iter().cycle()) {
                env.insert(d.id, *x);
            }
            let svars = crate::codegen::int_slots(f).into_iter().filter(|s| !f.dims.contains(s));
            for (s, x) in svars.zip(strides.iter().cycle()) {
                env.insert(s.id, *x);
            }
            let g = generate(f, "").unwrap();
            for (kernel, env) in launches(f, &env) {
                let info = g.kernels.iter().find(|i| i.index == kernel).unwrap();
                let narrow = info.index32.fits(&|v| env.get(&v.id).copied());
                // (A budget of node evaluations keeps each case under a second or so.)
                let (lo, hi) = match enumerate_range(f, &f.kernels[kernel], &env, 3_000_000) {
                    Ok(r) => {
                        // What the 64-bit kernel computes in `int` fits int32 at any values.
                        let (nlo, nhi) = r.narrow;
                        prop_assert!(
                            nlo >= I32_MIN as i128 && nhi <= I32_MAX as i128,
                            "{} kernel {kernel}: nodes int in the 64-bit kernel reach [{nlo}, {nhi}] ({env:?})",
                            f.name
                        );
                        r.all
                    }
                    Err(Skip::TooBig) => continue,
                    Err(Skip::NotIndex) => {
                        prop_assert!(!narrow, "{}: 32-bit, yet not enumerable", f.name);
                        continue;
                    }
                };
                let inside = lo >= I32_MIN as i128 && hi <= I32_MAX as i128;
                prop_assert!(
                    !narrow || inside,
                    "{} kernel {kernel}: the 32-bit kernel was picked, but indices reach [{lo}, {hi}] ({env:?})",
                    f.name
                );
                // Threshold-free: the endpoints' extremes bound every value (int32 or not),
                // which is what makes the int32 test above exact at any edge.
                let ends = endpoints(f, &f.kernels[kernel]).expect("enumerable, so bounded");
                let vals: Option<Vec<i64>> = ends
                    .iter()
                    .map(|e| eval_endpoint(e, &|v| env.get(&v.id).copied()))
                    .collect();
                if let Some(vals) = vals {
                    let (elo, ehi) = (
                        *vals.iter().min().unwrap() as i128,
                        *vals.iter().max().unwrap() as i128,
                    );
                    prop_assert!(
                        elo <= lo && hi <= ehi,
                        "{} kernel {kernel}: index values reach [{lo}, {hi}], the bounds say [{elo}, {ehi}] ({env:?})",
                        f.name
                    );
                }
            }
            Ok(())
        })?;
    }
}

/// Both sides of the choice occur on the pool (so the property test above tests something):
/// compact small tensors give 32 bits everywhere, a parameter stride of 2^31 gives 64 bits to
/// every kernel that reads it.
#[test]
fn idx32_pool_kernels_pick_both_widths() {
    for f in pool() {
        let g = generate(&f, "").unwrap();
        for (small, want) in [(1i64, true), (1 << 31, false)] {
            let mut env = HashMap::new();
            for d in &f.dims {
                env.insert(d.id, 5);
            }
            for s in crate::codegen::int_slots(&f)
                .iter()
                .filter(|s| !f.dims.contains(s))
            {
                env.insert(s.id, small);
            }
            for (kernel, env) in launches(&f, &env) {
                let info = g.kernels.iter().find(|i| i.index == kernel).unwrap();
                if !info.index32.has32() || !info.index32.has64() {
                    continue;
                }
                // Kernels between temporaries (compact strides) do not see the parameters'.
                let params = crate::codegen::int_slots(&f);
                let sees = f.kernels[kernel]
                    .vars
                    .iter()
                    .any(|v| params.contains(v) && !f.dims.contains(v));
                assert_eq!(
                    info.index32.fits(&|v| env.get(&v.id).copied()),
                    want || !sees,
                    "{} kernel {kernel}, strides {small}: {:?}\n{}",
                    f.name,
                    f.kernels[kernel].vars,
                    g.source
                );
            }
        }
    }
}

/// The launch path's table of loaded-function positions (`CudaKernel::entry_pos`) names the
/// entry points `KernelInfo::entries` lists, kernel after kernel, so the function the host
/// launches is the one whose parameters it passes (`int` for the 32-bit entry).
#[test]
fn idx32_launch_positions_match_the_entry_points() {
    for f in library() {
        let g = generate(&f, "").unwrap();
        let names: Vec<String> = g.kernels.iter().flat_map(|k| k.entries()).collect();
        let pos = super::entry_positions(&g.kernels);
        for (k, [p64, p32]) in g.kernels.iter().zip(pos) {
            assert_eq!(
                p64.map(|p| names[p].clone()),
                k.index32.has64().then(|| k.name.clone())
            );
            assert_eq!(
                p32.map(|p| names[p].clone()),
                k.index32.has32().then(|| k.name32.clone())
            );
        }
    }
}
