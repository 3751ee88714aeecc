//! The signature check of an intrinsic call (`Stmt::Call`): region count, access kinds, axes,
//! extents, dtypes, a written buffer distinct from the ones read, and for callbacks the whole
//! buffer from element 0. The verifier, the bounds proof and `tensorize` all ask it, so an
//! intrinsic call is well-formed by one definition. It decides "the base is element 0" up to
//! simplification (`arith::simplify`), which is why it sits above the IR's data types rather
//! than beside them in `intrin`.

use crate::ir::callback::CallbackKind;
use crate::ir::expr::Expr;
use crate::ir::intrin::{Intrin, Region};
use crate::ir::stmt::PrimFunc;
use rivet_runtime::DType;

/// Checks the shape of a call against its intrinsic's signature: region count, access kinds,
/// axes, extents, dtypes, distinct written buffer; `Err` says what is wrong. Buffers must be
/// declared in `func`; `flat`: bases are one offset.
pub fn check_call(
    func: &PrimFunc,
    intrin: Intrin,
    regions: &[Region],
    scalars: &[Expr],
    flat: bool,
) -> Result<(), String> {
    let name = intrin.name();
    for r in regions {
        let Some(b) = func.buffers.iter().find(|b| b.id == r.buf) else {
            return Err(format!(
                "{name}: region of undeclared buffer id {}",
                r.buf.0
            ));
        };
        let nd = b.shape.len();
        let want = if flat { 1 } else { nd };
        if r.base.len() != want {
            return Err(format!(
                "{name}: region of `{}` has {} base indices, expected {want}",
                b.name,
                r.base.len()
            ));
        }
        for (k, a) in r.axes.iter().enumerate() {
            if a.dim as usize >= nd || r.axes[..k].iter().any(|x| x.dim == a.dim) {
                return Err(format!(
                    "{name}: region of `{}` (rank {nd}) walks dim {} (dims must be distinct and below the rank)",
                    b.name, a.dim
                ));
            }
        }
    }
    match intrin {
        Intrin::Callback(k) => check_callback(func, k, regions, scalars),
        Intrin::GemmUpdate => {
            if regions.len() != 3 || !scalars.is_empty() {
                return Err(format!(
                    "{name} takes 3 regions (C, A, B) and no scalar, got {} and {}",
                    regions.len(),
                    scalars.len()
                ));
            }
            let kinds: Vec<bool> = regions.iter().map(|r| r.write).collect();
            if kinds != [true, false, false] {
                return Err(format!(
                    "{name}: C is written, A and B are read; got writes {kinds:?}"
                ));
            }
            if regions.iter().any(|r| r.axes.len() != 2) {
                return Err(format!("{name}: every region has 2 axes"));
            }
            let (c, a, b) = (&regions[0], &regions[1], &regions[2]);
            let same = |x: &Expr, y: &Expr, what: &str| {
                if x == y {
                    Ok(())
                } else {
                    Err(format!(
                        "{name}: extent {what} differs between regions: {x} vs {y}"
                    ))
                }
            };
            same(&c.axes[0].extent, &a.axes[1].extent, "m")?;
            same(&c.axes[1].extent, &b.axes[1].extent, "n")?;
            same(&a.axes[0].extent, &b.axes[0].extent, "k")?;
            let dt = |r: &Region| func.buffers.iter().find(|x| x.id == r.buf).map(|x| x.dtype);
            let d = dt(c);
            if !matches!(d, Some(DType::F32 | DType::F64)) || dt(a) != d || dt(b) != d {
                return Err(format!(
                    "{name}: C, A and B must all be float32 or all float64, got {:?}, {:?}, {:?}",
                    d,
                    dt(a),
                    dt(b)
                ));
            }
            if c.buf == a.buf || c.buf == b.buf {
                return Err(format!("{name}: C must be another buffer than A and B"));
            }
            Ok(())
        }
    }
}

/// `check_call` for `Intrin::Callback(k)`: an entry of the table, regions of its kind (see
/// `Intrin::Callback`), each walking every dim of its buffer in order from element 0 (the whole
/// buffer: the verifier checks each extent equals the buffer's, and that each entry is called
/// exactly once, in `verify::callbacks`), an output distinct from the inputs, no scalar.
fn check_callback(
    func: &PrimFunc,
    k: u32,
    regions: &[Region],
    scalars: &[Expr],
) -> Result<(), String> {
    let Some(cb) = func.callbacks.get(k as usize) else {
        return Err(format!(
            "callback {k}: the function has {} callbacks",
            func.callbacks.len()
        ));
    };
    let what = format!("callback of stage '{}'", cb.stage);
    if !scalars.is_empty() {
        return Err(format!("{what}: takes no scalar"));
    }
    let writes: Vec<bool> = regions.iter().map(|r| r.write).collect();
    let ok = match cb.kind {
        CallbackKind::Extern => !writes.is_empty() && writes[0] && !writes[1..].contains(&true),
        CallbackKind::Tap => writes == [false],
    };
    if !ok {
        return Err(format!(
            "{what}: an extern callback writes its first region and reads the others, a tap reads one; got writes {writes:?}"
        ));
    }
    for r in regions {
        let b = func.buffer(r.buf);
        let whole = r.axes.iter().enumerate().all(|(d, a)| a.dim as usize == d)
            && r.axes.len() == b.shape.len()
            && r.base
                .iter()
                .all(|e| crate::arith::simplify::simplify(e).as_int() == Some(0));
        if !whole {
            return Err(format!(
                "{what}: the region of `{}` must be the whole buffer (base 0, every dim in order)",
                b.name
            ));
        }
    }
    if cb.kind == CallbackKind::Extern && regions[1..].iter().any(|r| r.buf == regions[0].buf) {
        return Err(format!("{what}: its output is also one of its inputs"));
    }
    Ok(())
}
