//! Convolutions under the default CPU schedule (`schedule::cpu_default`, rule 2): a sum over
//! several reduction axes of a product of two factors is the packed GEMM with its depth over
//! the reduction axes (an implicit GEMM: the packs gather the windows), a depthwise one a
//! direct loop of output columns.
//!
//! - The CPU build of the untouched schedule against the interpreter running the program as
//!   written, within the bound of a reassociated, fused sum (`(K + 2) * eps * sum |x w|` each
//!   side, docs/cpu.md), and against float64 maths within the same bound; the CPU build also
//!   equals, bit for bit, the interpreter running the same defaulted schedule (same fused
//!   multiply-adds in the same order).
//! - NCHW and NHWC, 1x1 / 3x3 / 7x7 kernels, stride 1 and 2, padding by `if_then_else` in the
//!   body or in a padded stage the default inlines, depthwise, channels 1, 3 and 17, images 1,
//!   5, 9 and 17, float32 and float64, a constant or symbolic batch.
//! - Each checks the path taken: a packed stage (`C.A_packed`) exists for a GEMM-like one, and
//!   none for a depthwise one, so a regression of the match fails here.
//! - Hostile: a factor that is a shared DAG of 2^60 tree nodes is matched in time linear in
//!   its distinct nodes; constant sizes whose products overflow are refused, never wrapped.

use rivet_compiler::ir::Expr;
use rivet_compiler::schedule::cpu_default::apply_default_cpu;
use rivet_compiler::schedule::cpu_default::contraction::match_matmul;
use rivet_compiler::te::{self, compute_dyn, placeholder, Tensor as TeTensor};
use rivet_compiler::{build, Schedule, Target};
use rivet_runtime::{DType, Value};
use rivet_tests::floats::{tensor_of as tensor, values_f64 as to_f64};

fn data(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    Nchw,
    Nhwc,
}

/// How the zero padding is written.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Pad {
    /// `if_then_else(in bounds, X[..], 0)` inside the convolution's body.
    Inline,
    /// A padded stage of its own (the default inlines it).
    Stage,
}

#[derive(Debug, Clone)]
struct Conv {
    layout: Layout,
    depthwise: bool,
    batch: i64,
    cin: i64,
    /// Output channels (the channel count again for a depthwise one).
    cout: i64,
    /// Image height and width.
    hw: i64,
    k: i64,
    stride: i64,
    pad: i64,
    pad_how: Pad,
    symbolic: bool,
    f64: bool,
}

impl Conv {
    fn dtype(&self) -> DType {
        if self.f64 {
            DType::F64
        } else {
            DType::F32
        }
    }
    fn out_hw(&self) -> i64 {
        (self.hw + 2 * self.pad - self.k) / self.stride + 1
    }
    fn x_shape(&self) -> Vec<i64> {
        let (n, c, s) = (self.batch, self.cin, self.hw);
        match self.layout {
            Layout::Nchw => vec![n, c, s, s],
            Layout::Nhwc => vec![n, s, s, c],
        }
    }
    fn w_shape(&self) -> Vec<i64> {
        let (ci, co, k) = (self.cin, self.cout, self.k);
        match (self.layout, self.depthwise) {
            (Layout::Nchw, false) => vec![co, ci, k, k],
            (Layout::Nhwc, false) => vec![k, k, ci, co],
            (Layout::Nchw, true) => vec![ci, k, k],
            (Layout::Nhwc, true) => vec![k, k, ci],
        }
    }
    fn out_shape(&self) -> Vec<i64> {
        let (n, c, s) = (self.batch, self.cout, self.out_hw());
        match self.layout {
            Layout::Nchw => vec![n, c, s, s],
            Layout::Nhwc => vec![n, s, s, c],
        }
    }

    /// `[X, W, Out]`.
    fn program(&self) -> Vec<TeTensor> {
        let dt = self.dtype();
        let nb = if self.symbolic {
            te::var("n")
        } else {
            Expr::int(self.batch)
        };
        let with_batch = |s: Vec<i64>| {
            let mut v = vec![nb.clone()];
            v.extend(s[1..].iter().map(|&x| Expr::int(x)));
            v
        };
        let x = placeholder(&with_batch(self.x_shape()), dt, "X").unwrap();
        let w = placeholder(&self.w_shape(), dt, "W").unwrap();
        let (hw, p) = (self.hw, self.pad);
        let inside = |y: &Expr, z: &Expr| {
            te::all(
                te::all(te::ge(y, 0), te::lt(y, hw)),
                te::all(te::ge(z, 0), te::lt(z, hw)),
            )
        };
        // Image element at channel c, row y, column z of batch b, y and z in padded coordinates.
        let padded: Option<TeTensor> = (self.pad_how == Pad::Stage && p > 0).then(|| {
            let mut shape = with_batch(self.x_shape());
            let (yd, zd) = match self.layout {
                Layout::Nchw => (2, 3),
                Layout::Nhwc => (1, 2),
            };
            shape[yd] = Expr::int(hw + 2 * p);
            shape[zd] = Expr::int(hw + 2 * p);
            let layout = self.layout;
            compute_dyn(
                &shape,
                |a| {
                    let (y, z) = (a[yd].clone() - p, a[zd].clone() - p);
                    let idx = match layout {
                        Layout::Nchw => vec![a[0].clone(), a[1].clone(), y.clone(), z.clone()],
                        Layout::Nhwc => vec![a[0].clone(), y.clone(), z.clone(), a[3].clone()],
                    };
                    te::if_then_else(inside(&y, &z), x.at(idx), te::constant(0.0, dt))
                },
                "Xpad",
            )
            .unwrap()
        });
        let layout = self.layout;
        let pixel = |b: &Expr, c: &Expr, y: Expr, z: Expr| -> Expr {
            let at = |y: Expr, z: Expr| match layout {
                Layout::Nchw => vec![b.clone(), c.clone(), y, z],
                Layout::Nhwc => vec![b.clone(), y, z, c.clone()],
            };
            match &padded {
                Some(xp) => xp.at(at(y, z)),
                None if p == 0 => x.at(at(y, z)),
                None => {
                    let (y, z) = (y - p, z - p);
                    te::if_then_else(inside(&y, &z), x.at(at(y, z)), te::constant(0.0, dt))
                }
            }
        };
        let kh = te::reduce_axis(0, self.k, "kh").unwrap();
        let kw = te::reduce_axis(0, self.k, "kw").unwrap();
        let rc = te::reduce_axis(0, self.cin, "rc").unwrap();
        let (s, depthwise) = (self.stride, self.depthwise);
        let out = compute_dyn(
            &with_batch(self.out_shape()),
            |a| {
                let (b, c, oy, ox) = match layout {
                    Layout::Nchw => (&a[0], &a[1], &a[2], &a[3]),
                    Layout::Nhwc => (&a[0], &a[3], &a[1], &a[2]),
                };
                let (ekh, ekw, erc) = (Expr::from(&kh), Expr::from(&kw), Expr::from(&rc));
                let y = oy.clone() * s + ekh.clone();
                let z = ox.clone() * s + ekw.clone();
                if depthwise {
                    let wv = match layout {
                        Layout::Nchw => w.at([c.clone(), ekh, ekw]),
                        Layout::Nhwc => w.at([ekh, ekw, c.clone()]),
                    };
                    return te::sum(pixel(b, c, y, z) * wv, [&kh, &kw]);
                }
                let wv = match layout {
                    Layout::Nchw => w.at([c.clone(), erc.clone(), ekh.clone(), ekw.clone()]),
                    Layout::Nhwc => w.at([ekh.clone(), ekw.clone(), erc.clone(), c.clone()]),
                };
                let axes = match layout {
                    Layout::Nchw => [&rc, &kh, &kw],
                    Layout::Nhwc => [&kh, &kw, &rc],
                };
                te::sum(pixel(b, &erc, y, z) * wv, axes)
            },
            "Conv",
        )
        .unwrap();
        vec![x, w, out]
    }

    /// The float64 convolution of the logical inputs and, per output, `sum |x w|`.
    fn maths(&self, xv: &[f64], wv: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let round = |v: f64| if self.f64 { v } else { v as f32 as f64 };
        let (n, ci, co, h, k, s, p) = (
            self.batch,
            self.cin,
            self.cout,
            self.hw,
            self.k,
            self.stride,
            self.pad,
        );
        let oh = self.out_hw();
        let xat = |b: i64, c: i64, y: i64, z: i64| -> f64 {
            if y < 0 || y >= h || z < 0 || z >= h {
                return 0.0;
            }
            round(match self.layout {
                Layout::Nchw => xv[(((b * ci + c) * h + y) * h + z) as usize],
                Layout::Nhwc => xv[(((b * h + y) * h + z) * ci + c) as usize],
            })
        };
        let wat = |o: i64, c: i64, a: i64, e: i64| -> f64 {
            round(match (self.layout, self.depthwise) {
                (Layout::Nchw, false) => wv[(((o * ci + c) * k + a) * k + e) as usize],
                (Layout::Nhwc, false) => wv[(((a * k + e) * ci + c) * co + o) as usize],
                (Layout::Nchw, true) => wv[((o * k + a) * k + e) as usize],
                (Layout::Nhwc, true) => wv[((a * k + e) * ci + o) as usize],
            })
        };
        let (mut out, mut mag) = (Vec::new(), Vec::new());
        let oidx = |b: i64, o: i64, y: i64, z: i64| match self.layout {
            Layout::Nchw => (((b * co + o) * oh + y) * oh + z) as usize,
            Layout::Nhwc => (((b * oh + y) * oh + z) * co + o) as usize,
        };
        let total = (n * co * oh * oh) as usize;
        out.resize(total, 0.0);
        mag.resize(total, 0.0);
        for b in 0..n {
            for o in 0..co {
                for y in 0..oh {
                    for z in 0..oh {
                        let (mut acc, mut m) = (0f64, 0f64);
                        let chans: Vec<i64> = if self.depthwise {
                            vec![o]
                        } else {
                            (0..ci).collect()
                        };
                        for &c in &chans {
                            for a in 0..k {
                                for e in 0..k {
                                    let t =
                                        xat(b, c, y * s + a - p, z * s + e - p) * wat(o, c, a, e);
                                    acc += t;
                                    m += t.abs();
                                }
                            }
                        }
                        out[oidx(b, o, y, z)] = acc;
                        mag[oidx(b, o, y, z)] = m;
                    }
                }
            }
        }
        (out, mag)
    }
}

/// Whether the defaulted schedule of `out` holds a packed stage (`<name>.A_packed`).
fn packed(s: &Schedule) -> bool {
    s.stages
        .iter()
        .any(|st| st.tensor.name().ends_with(".A_packed"))
}

/// `check`, and whether the default ran the product row by row.
fn check_rows(c: &Conv) -> bool {
    check(c);
    let mut s = Schedule::new(&c.program()[2..]).unwrap();
    apply_default_cpu(&mut s).unwrap();
    rivet_tests::packs_by_rows(&s)
}

fn check(c: &Conv) {
    let dt = c.dtype();
    let args = c.program();
    let (xs, ws) = (c.x_shape(), c.w_shape());
    let seed = (c.cin * 131 + c.cout * 17 + c.hw * 7 + c.k) as u64;
    let xv = data(xs.iter().product::<i64>() as usize, seed);
    let wv = data(ws.iter().product::<i64>() as usize, seed + 1);
    let plain = Schedule::new(&args[2..]).unwrap();
    let mut defaulted = plain.clone();
    apply_default_cpu(&mut defaulted).unwrap();
    let run = |s: &Schedule, target: &Target| {
        let m = build(s, &args, target, "conv").unwrap_or_else(|e| panic!("{c:?}: {e}"));
        let out = m
            .get_function("conv")
            .unwrap()
            .call(&[
                Value::Tensor(tensor(&xv, &xs, dt)),
                Value::Tensor(tensor(&wv, &ws, dt)),
            ])
            .unwrap_or_else(|e| panic!("{c:?} on {target}: {e}"));
        to_f64(out.as_tensor().unwrap(), dt)
    };
    let cpu = run(&plain, &Target::cpu());
    let written = run(&plain, &Target::interp());
    let same = run(&defaulted, &Target::interp());
    assert_eq!(cpu.len(), written.len());
    for (x, y) in cpu.iter().zip(&same) {
        assert_eq!(
            x.to_bits(),
            y.to_bits(),
            "{c:?}: cpu != interp of the default"
        );
    }
    let (exact, mag) = c.maths(&xv, &wv);
    let eps = if c.f64 {
        f64::EPSILON
    } else {
        f32::EPSILON as f64
    };
    let terms = if c.depthwise { 1 } else { c.cin } * c.k * c.k;
    for q in 0..cpu.len() {
        let tol = (terms as f64 + 2.0) * eps * mag[q] + 1e-300;
        assert!(
            (cpu[q] - written[q]).abs() <= 2.0 * tol,
            "{c:?}: out[{q}] = {}, as written {} (tolerance {})",
            cpu[q],
            written[q],
            2.0 * tol
        );
        assert!(
            (cpu[q] - exact[q]).abs() <= tol,
            "{c:?}: out[{q}] = {}, float64 maths {} (tolerance {tol})",
            cpu[q],
            exact[q]
        );
    }
    let work = c.batch * c.cout * c.out_hw() * c.out_hw() * terms;
    let big = c.symbolic || work >= rivet_compiler::schedule::cpu_default::MIN_GEMM_WORK;
    if c.depthwise {
        assert!(!packed(&defaulted), "{c:?}: a depthwise one packed");
    } else if big {
        assert!(packed(&defaulted), "{c:?}: not packed");
    }
}

fn base(cin: i64, cout: i64, hw: i64, k: i64) -> Conv {
    Conv {
        layout: Layout::Nchw,
        depthwise: false,
        batch: 2,
        cin,
        cout,
        hw,
        k,
        stride: 1,
        pad: k / 2,
        pad_how: Pad::Inline,
        symbolic: true,
        f64: false,
    }
}

#[test]
fn conv_nchw_ragged_sizes() {
    for &(ci, co) in &[(1i64, 3i64), (3, 17), (17, 1), (17, 17)] {
        for &hw in &[1i64, 5, 9, 17] {
            for &k in &[1i64, 3] {
                if k > hw + 2 * (k / 2) {
                    continue;
                }
                check(&base(ci, co, hw, k));
            }
        }
    }
}

#[test]
fn conv_nchw_strides_kernels_padding() {
    for &stride in &[1i64, 2] {
        for &(k, pad) in &[(1i64, 0i64), (3, 1), (3, 0), (7, 3)] {
            for &hw in &[5i64, 9, 17] {
                for pad_how in [Pad::Inline, Pad::Stage] {
                    check(&Conv {
                        stride,
                        pad,
                        pad_how,
                        ..base(3, 17, hw, k)
                    });
                }
            }
        }
    }
}

#[test]
fn conv_nhwc() {
    for &stride in &[1i64, 2] {
        for &(ci, co, hw, k) in &[(3i64, 17i64, 9i64, 3i64), (17, 3, 5, 1), (1, 17, 17, 7)] {
            for pad_how in [Pad::Inline, Pad::Stage] {
                check(&Conv {
                    layout: Layout::Nhwc,
                    stride,
                    pad_how,
                    ..base(ci, co, hw, k)
                });
            }
        }
    }
}

#[test]
fn conv_float64_and_constant_batch() {
    for layout in [Layout::Nchw, Layout::Nhwc] {
        for symbolic in [true, false] {
            for &(ci, co, hw, k, stride) in &[(3i64, 17i64, 9i64, 3i64, 1i64), (17, 17, 17, 3, 2)] {
                check(&Conv {
                    layout,
                    symbolic,
                    f64: true,
                    stride,
                    ..base(ci, co, hw, k)
                });
                check(&Conv {
                    layout,
                    symbolic,
                    stride,
                    batch: 1,
                    ..base(ci, co, hw, k)
                });
            }
        }
    }
}

#[test]
fn conv_depthwise() {
    for layout in [Layout::Nchw, Layout::Nhwc] {
        for &(c, hw, k, stride) in &[
            (1i64, 5i64, 3i64, 1i64),
            (3, 9, 3, 2),
            (17, 17, 3, 1),
            (17, 40, 3, 1),
            (3, 17, 7, 2),
        ] {
            for f64 in [false, true] {
                check(&Conv {
                    layout,
                    depthwise: true,
                    f64,
                    stride,
                    ..base(c, c, hw, k)
                });
            }
        }
    }
}

/// A factor that is a shared DAG of 2^60 tree nodes (`e = e + e`, 60 times) is matched by
/// walking its distinct nodes once, and the default schedule's rewrite of it stays cheap.
#[test]
fn hostile_shared_dag_factor_is_cheap() {
    let x = placeholder([4i64, 8, 8], DType::F32, "X").unwrap();
    let w = placeholder([8i64, 4, 3], DType::F32, "W").unwrap();
    let rc = te::reduce_axis(0, 4, "rc").unwrap();
    let kw = te::reduce_axis(0, 3, "kw").unwrap();
    let out = compute_dyn(
        [te::var("n"), Expr::int(8), Expr::int(6)],
        |a| {
            let mut e = x.at([
                a[0].clone(),
                Expr::from(&rc),
                a[2].clone() + Expr::from(&kw),
            ]);
            for _ in 0..60 {
                e = e.clone() + e;
            }
            let wv = w.at([a[1].clone(), Expr::from(&rc), Expr::from(&kw)]);
            te::sum(wv * e, [&rc, &kw])
        },
        "Deep",
    )
    .unwrap();
    let m = match_matmul(&out).expect("a GEMM-like contraction");
    // Columns: w (6 wide, mostly padding in a panel of 32) fused with the symbolic batch.
    assert_eq!((m.rows.len(), m.cols.len(), m.red.len()), (1, 2, 2));
    let mut s = Schedule::new(std::slice::from_ref(&out)).unwrap();
    apply_default_cpu(&mut s).unwrap();
    assert!(packed(&s));
}

/// Constant sizes whose products overflow are refused by the match (the plain schedule then
/// takes the stage), never wrapped; axes whose product would be too large are not fused.
#[test]
fn hostile_huge_extents_are_refused() {
    let big = 1i64 << 40;
    let x = placeholder([big, big, big], DType::F32, "X").unwrap();
    let w = placeholder([8i64, big, big], DType::F32, "W").unwrap();
    let r1 = te::reduce_axis(0, big, "r1").unwrap();
    let r2 = te::reduce_axis(0, big, "r2").unwrap();
    let out = compute_dyn(
        [Expr::int(8), Expr::int(big)],
        |a| {
            te::sum(
                w.at([a[0].clone(), Expr::from(&r1), Expr::from(&r2)])
                    * x.at([a[1].clone(), Expr::from(&r1), Expr::from(&r2)]),
                [&r1, &r2],
            )
        },
        "Huge",
    )
    .unwrap();
    assert!(match_matmul(&out).is_none(), "a depth of 2^80 matched");
    // Columns over (h, w) = (2^40, 7): a row of 7 is mostly padding, but 7 * 2^40 is past the
    // fusing limit, so w stays alone.
    let x = placeholder([big, 7, 5], DType::F32, "X").unwrap();
    let w = placeholder([3i64, 5], DType::F32, "W").unwrap();
    let r = te::reduce_axis(0, 5, "r").unwrap();
    let out = compute_dyn(
        [Expr::int(3), Expr::int(big), Expr::int(7)],
        |a| {
            te::sum(
                w.at([a[0].clone(), Expr::from(&r)])
                    * x.at([a[1].clone(), a[2].clone(), Expr::from(&r)]),
                &r,
            )
        },
        "Wide",
    )
    .unwrap();
    let m = match_matmul(&out).expect("matched");
    assert_eq!(m.cols, vec![2]);
    // Nine reduction axes: more than the depth takes.
    let axes: Vec<_> = (0..9)
        .map(|q| te::reduce_axis(0, 2, &format!("r{q}")).unwrap())
        .collect();
    let x = placeholder([4i64, 2, 2, 2, 2, 2, 2, 2, 2, 2], DType::F32, "X").unwrap();
    let w = placeholder([2i64, 2, 2, 2, 2, 2, 2, 2, 2, 4], DType::F32, "W").unwrap();
    let out = compute_dyn(
        [Expr::int(4), Expr::int(4)],
        |a| {
            let rs: Vec<Expr> = axes.iter().map(Expr::from).collect();
            let mut xi = vec![a[0].clone()];
            xi.extend(rs.iter().cloned());
            let mut wi = rs.clone();
            wi.push(a[1].clone());
            te::sum(x.at(xi) * w.at(wi), &axes)
        },
        "Many",
    )
    .unwrap();
    assert!(match_matmul(&out).is_none());
    let mut s = Schedule::new(std::slice::from_ref(&out)).unwrap();
    apply_default_cpu(&mut s).unwrap();
    assert!(!packed(&s));
}

/// The printed IR of the CPU build of `c`'s untouched schedule.
fn cpu_ir(c: &Conv) -> String {
    let args = c.program();
    let s = Schedule::new(&args[2..]).unwrap();
    build(&s, &args, &Target::cpu(), "conv")
        .unwrap()
        .get_source("ir")
        .unwrap()
}

/// The image pack of a padded convolution with a ragged last panel, and a depthwise one's
/// output rows, are partitioned (`lower::partition`): guarded edges (`.lo`, `.hi` bounds) and
/// an interior whose loads are vector loads (`ramp`), not a scalar loop of guarded loads;
/// at stride 2 too (the window's `x * 2 + kw - 1` bounds `x` by a ceiling division).
#[test]
fn guarded_rows_are_partitioned() {
    for (depthwise, stride) in [(false, 1), (true, 1), (false, 2), (true, 2)] {
        let c = Conv {
            depthwise,
            stride,
            symbolic: false,
            ..base(8, 8, 56, 3)
        };
        let ir = cpu_ir(&c);
        if std::env::var("SHOW_IR").is_ok() {
            eprintln!("{ir}");
        }
        assert!(
            ir.contains(".lo") && ir.contains(".hi"),
            "{c:?}: no partition\n{ir}"
        );
        assert!(ir.contains("ramp"), "{c:?}: no vector loop\n{ir}");
    }
}

/// The GEMM's cache blocks (`packed_gemm::Blocks`, which the default gives only deep
/// constant reductions) forced small in child processes: K blocks of 9 products (one input
/// channel's 3 x 3 window; 1 x 1 and 7 x 7 kernels leave K unblocked where 9 does not divide
/// it), row blocks of 2 panels and column chunks of 2, their ragged ends guarded around the
/// call. Each case keeps its checks: the same bits as the interpreter running the same
/// blocked schedule, and within the bound of the program as written.
#[test]
fn convolutions_with_forced_blocks() {
    for name in [
        "conv_nhwc",
        "conv_float64_and_constant_batch",
        "conv_nchw_strides_kernels_padding",
    ] {
        rivet_tests::run_in_child(name, &[("RIVET_GEMM_BLOCKS", "9x2x2")]);
    }
}

/// Constant batches of images whose rows fill a panel (`packed_gemm::Rows`): the product runs
/// row by row (its parallel loop over `(n, y)`), each image row's panels packed inside it
/// (`lower::fuse_rows`) into a per-iteration buffer (`lower::row_locals`). NCHW packs the
/// image as B, NHWC as A; 1x1 and 3x3 kernels, stride 1 and 2, ragged channel counts, float32
/// and float64. Each is checked as above (the CPU's fused loop bit for bit against the
/// interpreter running the unfused default), and that the path was taken; a symbolic batch
/// or too few rows keep the product parallel over its column panels.
#[test]
fn conv_row_by_row() {
    for f64 in [false, true] {
        for &(layout, hw, k, stride) in &[
            (Layout::Nchw, 25i64, 3i64, 1i64),
            (Layout::Nchw, 25, 1, 1),
            (Layout::Nchw, 49, 3, 2),
            (Layout::Nhwc, 24, 3, 1),
            (Layout::Nhwc, 24, 1, 1),
        ] {
            let c = Conv {
                layout,
                symbolic: false,
                f64,
                stride,
                pad: k / 2,
                ..base(3, 17, hw, k)
            };
            assert!(check_rows(&c), "{c:?}: not row by row");
        }
    }
    // A symbolic batch, and too few rows (2 x 9 < 32): the column-panel schedule.
    assert!(!check_rows(&base(3, 17, 25, 3)));
    assert!(!check_rows(&Conv {
        symbolic: false,
        ..base(3, 17, 9, 3)
    }));
}
