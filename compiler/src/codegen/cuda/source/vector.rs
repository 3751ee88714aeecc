//! CUDA C of vector stores (vector IR, `lower::vectorize`): each lane is the scalar code of the
//! lane's scalar expression; contiguous stores and loads of a 16-byte CUDA vector type use
//! 16-byte accesses where a run-time test finds every address aligned.

use super::expr::{stored, strip_parens};
use super::types::value_type;
use super::KernelGen;
use crate::error::Result;
use crate::ir::expr::{BufId, Expr, ExprKind, Var};
use rivet_runtime::DType;

impl KernelGen<'_> {
    /// A vector store (vector IR, `lower::vectorize`). When the store and some loads under it
    /// are contiguous (`ramp(b, 1, n)`) of a 16-byte CUDA vector type (`float4`, `double2`,
    /// `int4`, ...), a run-time test of the addresses picks 16-byte accesses when every one of
    /// them is 16-byte aligned (a global pointer plus an offset is not known aligned at build
    /// time: foreign tensors and views may start anywhere), else the lanes one by one. Each
    /// lane is the scalar code of the lane's scalar expression (`lane_scalar`), so both paths
    /// compute the scalar results; all lanes are computed before any is stored.
    pub(super) fn vector_store(
        &mut self,
        buf: BufId,
        indices: &[Expr],
        value: &Expr,
    ) -> Result<()> {
        let [index] = indices else {
            return self.offset(indices).map(|_| ());
        };
        let dt = self.func.buffer(buf).dtype;
        let name = self.buf(buf)?;
        let n = value.lanes();
        self.line("{");
        self.indent += 1;
        let vty = cuda_vector_type(dt, n);
        if let (Some(vty), Some(base)) = (vty, contiguous_base(index)) {
            // The contiguous loads under the value that have a vector type too.
            let mut loads: Vec<Expr> = Vec::new();
            value.visit_unique(&mut |e| {
                if let ExprKind::Load { indices, .. } = e.kind() {
                    if e.is_vector()
                        && indices.len() == 1
                        && contiguous_base(&indices[0]).is_some()
                        && cuda_vector_type(e.dtype(), e.lanes()).is_some()
                        && !loads.iter().any(|l| l == e)
                    {
                        loads.push(e.clone());
                    }
                }
            });
            let sb = self.unique("vs");
            let bexpr = self.index_expr(base)?;
            self.line(&format!("const long long {sb} = {};", strip_parens(&bexpr)));
            let mut conds = vec![format!("rivet_aligned16({name} + {sb})")];
            let mut packed = Vec::new();
            for l in &loads {
                let ExprKind::Load {
                    buf: lb,
                    indices: li,
                } = l.kind()
                else {
                    unreachable!()
                };
                let lname = self.buf(*lb)?;
                let lbase = contiguous_base(&li[0]).expect("checked above");
                let v = self.unique("vb");
                let e = self.index_expr(lbase)?;
                self.line(&format!("const long long {v} = {};", strip_parens(&e)));
                conds.push(format!("rivet_aligned16({lname} + {v})"));
                packed.push((l.clone(), lname, v));
            }
            self.line(&format!("if ({}) {{", conds.join(" && ")));
            self.indent += 1;
            // Each packed load once, as a 16-byte load; its lanes are named variables.
            let mut names: Vec<(Expr, Vec<Var>)> = Vec::new();
            for (l, lname, v) in &packed {
                let lt = cuda_vector_type(l.dtype(), l.lanes()).expect("checked above");
                let t = self.unique("vl");
                self.line(&format!(
                    "const {lt} {t} = *reinterpret_cast<const {lt}*>({lname} + {v});"
                ));
                let lanes = (0..l.lanes())
                    .map(|k| {
                        let var = Var::new("lane");
                        self.vars
                            .insert(var.id, format!("{t}.{}", LANE_FIELDS[k as usize]));
                        var
                    })
                    .collect();
                names.push((l.clone(), lanes));
            }
            let r = self.unique("vr");
            self.line(&format!("{vty} {r};"));
            for k in 0..n {
                let e = lane_scalar(value, k, &names);
                let x = self.expr(&e, false)?;
                self.line(&format!(
                    "{r}.{} = {};",
                    LANE_FIELDS[k as usize],
                    strip_parens(&x)
                ));
            }
            self.line(&format!("*reinterpret_cast<{vty}*>({name} + {sb}) = {r};"));
            self.indent -= 1;
            self.line("} else {");
            self.indent += 1;
            self.store_lanes(&name, dt, index, value)?;
            self.indent -= 1;
            self.line("}");
        } else {
            self.store_lanes(&name, dt, index, value)?;
        }
        self.indent -= 1;
        self.line("}");
        Ok(())
    }

    /// A vector store lane by lane: every lane's value, then the stores.
    fn store_lanes(&mut self, name: &str, dt: DType, index: &Expr, value: &Expr) -> Result<()> {
        let mut vals = Vec::new();
        for k in 0..value.lanes() {
            let e = lane_scalar(value, k, &[]);
            let x = self.expr(&e, false)?;
            let t = self.unique("vv");
            self.line(&format!(
                "const {} {t} = {};",
                value_type(dt),
                strip_parens(&x)
            ));
            vals.push(t);
        }
        for (k, t) in vals.into_iter().enumerate() {
            let i = lane_scalar(index, k as u32, &[]);
            let i = self.index_expr(&i)?;
            self.line(&format!(
                "{name}[{}] = {};",
                strip_parens(&i),
                stored(dt, t)
            ));
        }
        Ok(())
    }
}

/// Member names of the lanes of CUDA's vector types.
const LANE_FIELDS: [&str; 4] = ["x", "y", "z", "w"];

/// CUDA's 16-byte vector type of `lanes` lanes of `dt` (elements of at least 4 bytes held as
/// themselves: not float16 / bfloat16, not bool).
fn cuda_vector_type(dt: DType, lanes: u32) -> Option<&'static str> {
    Some(match (dt, lanes) {
        (DType::F32, 4) => "float4",
        (DType::I32, 4) => "int4",
        (DType::U32, 4) => "uint4",
        (DType::F64, 2) => "double2",
        (DType::I64, 2) => "longlong2",
        (DType::U64, 2) => "ulonglong2",
        _ => return None,
    })
}

/// The base of a contiguous ramp (`ramp(b, 1, n)`).
fn contiguous_base(index: &Expr) -> Option<&Expr> {
    match index.kind() {
        ExprKind::Ramp { base, stride, .. } if stride.as_int() == Some(1) => Some(base),
        _ => None,
    }
}

/// Lane `l` of the vector expression `e` as a scalar expression (`ramp(b, s, n)` is
/// `b + s * l`, a broadcast its value), with the loads of `packed` replaced by the variables
/// naming their lanes.
fn lane_scalar(e: &Expr, l: u32, packed: &[(Expr, Vec<Var>)]) -> Expr {
    if !e.is_vector() {
        return e.clone();
    }
    if let Some((_, vars)) = packed.iter().find(|(p, _)| p == e) {
        return Expr::new(ExprKind::Var(vars[l as usize].clone()), e.dtype());
    }
    match e.kind() {
        ExprKind::Ramp { base, stride, .. } => match stride.as_int() {
            _ if l == 0 => base.clone(),
            // A constant step folded (the proof bounded every lane: no overflow).
            Some(k) => base.add(&Expr::int(k.wrapping_mul(i64::from(l)))),
            None => base.add(&stride.mul(&Expr::int(i64::from(l)))),
        },
        ExprKind::Broadcast { value, .. } => value.clone(),
        _ => e.map_children(&mut |c| lane_scalar(c, l, packed)),
    }
}
