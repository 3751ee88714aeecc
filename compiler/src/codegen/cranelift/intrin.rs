//! Intrinsic calls: `Stmt::Call` becomes a call of the micro-kernel entry of the variant this
//! process selected (`codegen::cpu_lib::microkernel::selected`), with each region's base address and
//! the element strides of its axes (the dims' stride variables) as arguments. The bounds
//! proof has shown every element of every region inside its tensor, so the call needs no
//! run-time check; in checked mode the base's indices are checked like any access.

use super::{FnGen, PTR};
use crate::codegen::cpu_lib::microkernel;
use crate::error::{Error, Result};
use crate::ir::intrin::{gemm_extents, Intrin, Region};
use crate::ir::{Expr, PrimFunc, Stmt};
use cranelift_codegen::ir::types;
use rivet_runtime::DType;

/// The micro-kernel symbols a kernel's JIT module binds: the selected variant's entries when
/// `func` calls an intrinsic (an error when `RIVET_MICROKERNEL` forces a variant this CPU
/// lacks), none otherwise.
pub(super) fn symbols(func: &PrimFunc) -> Result<Vec<(&'static str, *const u8)>> {
    let mut calls = false;
    func.visit_all(&mut |s| {
        calls |= matches!(
            s,
            Stmt::Call {
                intrin: Intrin::GemmUpdate,
                ..
            }
        )
    });
    if !calls {
        return Ok(vec![]);
    }
    let v = microkernel::selected().map_err(Error::Compile)?;
    Ok(vec![
        ("rivet_gemm_f32", v.entry_f32() as *const u8),
        ("rivet_gemm_f64", v.entry_f64() as *const u8),
    ])
}

impl FnGen<'_, '_> {
    fn int_arg(&mut self, e: &Expr) -> Result<cranelift_codegen::ir::Value> {
        let v = self.expr(e)?;
        Ok(self.index_i64(v, e.dtype()))
    }

    pub(super) fn call_intrin(&mut self, intrin: Intrin, regions: &[Region]) -> Result<()> {
        match intrin {
            Intrin::Callback(k) => self.call_callback(k, regions),
            Intrin::GemmUpdate => {
                let (m, n, k) = gemm_extents(regions);
                let mut args = vec![self.int_arg(&m)?, self.int_arg(&n)?, self.int_arg(&k)?];
                let mut dt = DType::F32;
                for r in regions {
                    let (addr, d) = self.address(r.buf, &r.base)?;
                    dt = d;
                    args.push(addr);
                    let strides = self.func.buffer(r.buf).strides.clone();
                    for a in &r.axes {
                        let s = strides.get(a.dim as usize).ok_or_else(|| {
                            Error::Internal(format!("region walks dim {} past the rank", a.dim))
                        })?;
                        args.push(self.int_arg(&Expr::var(s))?);
                    }
                }
                let name = match dt {
                    DType::F32 => "rivet_gemm_f32",
                    DType::F64 => "rivet_gemm_f64",
                    other => {
                        return Err(Error::Internal(format!("gemm_update of {other}")));
                    }
                };
                debug_assert_eq!(PTR, types::I64);
                self.call(name, &[types::I64; 12], &[], &args)?;
                Ok(())
            }
        }
    }
}
