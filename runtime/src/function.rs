//! Packed functions: `Arc<dyn Fn(&[Value]) -> Result<Value>>` plus an optional typed
//! signature. When a signature is present, `Function::call` checks every argument against
//! it before the body runs, so bodies may assume the kinds, dtypes, ranks, fixed and
//! symbolic dims, devices and writability it declares; errors name the function, the
//! argument (position and name), what was expected and what came.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{ArgName, Error, Result};
use crate::value::Value;
use std::fmt;
use std::sync::Arc;

type Body = dyn Fn(&[Value]) -> Result<Value> + Send + Sync;

/// The shapes and dtypes of the outputs a function would allocate for inputs of the given
/// shapes (in parameter order), without running it.
pub type OutputRule = dyn Fn(&[&[i64]]) -> Result<Vec<(Vec<i64>, DType)>> + Send + Sync;

/// A packed function: called with a slice of `Value`s, returns a `Value` (tvm-ffi's model).
/// Compiled kernels, the native `testing.*` functions, Python callables and functions of
/// another library are all `Function`s; typed ones check their arguments against a
/// `Signature` first, so a wrong call is an error that names the argument.
///
/// ```
/// use rivet_runtime::{registry, Error, Function, Value};
///
/// let twice = Function::new("my.twice", |args| match args {
///     [Value::Int(v)] => v
///         .checked_mul(2)
///         .map(Value::Int)
///         .ok_or_else(|| Error::Argument(format!("my.twice: {v} * 2 overflows"))),
///     _ => Err(Error::Argument("my.twice: expected one int".into())),
/// });
/// assert!(matches!(twice.call(&[Value::Int(21)]), Ok(Value::Int(42))));
/// assert!(twice.call(&[Value::Int(i64::MIN)]).is_err());
/// registry::register("my.twice", twice, false).unwrap();
/// assert!(registry::get("my.twice").is_ok());
/// // A second registration under the same name is refused unless it overrides.
/// assert!(registry::register("my.twice", Function::new("x", |_| Ok(Value::Null)), false).is_err());
/// ```
#[derive(Clone)]
pub struct Function {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    signature: Option<Signature>,
    /// `call` checks the arguments against the signature before the body runs.
    checked: bool,
    body: Box<Body>,
    /// What `output_shapes` answers; functions that allocate outputs from their inputs'
    /// shapes (compiled functions) have one. Frameworks that trace shapes ahead of running
    /// (XLA, torch's fake tensors) ask it.
    outputs: Option<Box<OutputRule>>,
    /// What the body computes with, made visible (`with_parts`).
    parts: Option<Parts>,
    /// The body and output rule are another library's (`capi::import`): an output rule
    /// whose answer breaks the signature is that library's bug (`Error::Library`), not
    /// rivet's (`Error::Internal`).
    foreign: bool,
}

/// The object a function's body works with (a wrapped Python callable, a compiled function),
/// shown to whoever must account for what a function keeps alive: the Python bindings tell
/// Python's garbage collector which Python objects a rivet object owns (`bindings/src/gc.rs`).
/// The body's closures hold `hidden` handles of `object` besides the one here, so the
/// function as a whole holds `hidden + 1`.
#[derive(Clone)]
pub struct Parts {
    pub object: Arc<dyn std::any::Any + Send + Sync>,
    pub hidden: usize,
}

impl Function {
    /// The one place an `Inner` is built; each public constructor says only what differs
    /// (signature, whether `call` checks it, output rule). `parts` and the foreign mark are
    /// set afterwards, on a function no one else holds yet (`with_parts`, `into_foreign`).
    fn make(
        name: String,
        signature: Option<Signature>,
        checked: bool,
        body: Box<Body>,
        outputs: Option<Box<OutputRule>>,
    ) -> Function {
        Function {
            inner: Arc::new(Inner {
                name,
                signature,
                checked,
                body,
                outputs,
                parts: None,
                foreign: false,
            }),
        }
    }

    /// An untyped function: the body checks its own arguments.
    pub fn new(
        name: impl Into<String>,
        body: impl Fn(&[Value]) -> Result<Value> + Send + Sync + 'static,
    ) -> Function {
        Function::make(name.into(), None, false, Box::new(body), None)
    }

    /// A typed function: `call` checks the arguments against `signature` first.
    pub fn with_signature(
        name: impl Into<String>,
        signature: Signature,
        body: impl Fn(&[Value]) -> Result<Value> + Send + Sync + 'static,
    ) -> Function {
        Function::make(name.into(), Some(signature), true, Box::new(body), None)
    }

    /// A function that checks its own arguments but carries a signature for introspection
    /// and error wording (e.g. compiled functions, which also accept inputs-only calls).
    pub fn with_described_signature(
        name: impl Into<String>,
        signature: Signature,
        body: impl Fn(&[Value]) -> Result<Value> + Send + Sync + 'static,
    ) -> Function {
        Function::make(name.into(), Some(signature), false, Box::new(body), None)
    }

    /// `with_described_signature` plus the rule that says which outputs a call with inputs
    /// of given shapes allocates (`output_shapes`).
    pub fn with_output_rule(
        name: impl Into<String>,
        signature: Signature,
        body: impl Fn(&[Value]) -> Result<Value> + Send + Sync + 'static,
        outputs: impl Fn(&[&[i64]]) -> Result<Vec<(Vec<i64>, DType)>> + Send + Sync + 'static,
    ) -> Function {
        let outputs: Box<OutputRule> = Box::new(outputs);
        Function::make(
            name.into(),
            Some(signature),
            false,
            Box::new(body),
            Some(outputs),
        )
    }

    /// The shapes and dtypes of the outputs a call with inputs of `input_shapes` (the
    /// tensor inputs, in parameter order) would allocate and return. An error when the
    /// shapes do not fit the signature, or when the function has no such rule.
    /// With `dtypes` (one per tensor input), each is checked against the signature first, so
    /// a tracer learns of a wrong dtype before anything runs.
    pub fn output_shapes(
        &self,
        input_shapes: &[&[i64]],
        dtypes: Option<&[DType]>,
    ) -> Result<Vec<(Vec<i64>, DType)>> {
        if let (Some(dtypes), Some(sig)) = (dtypes, &self.inner.signature) {
            let inputs = sig
                .params
                .iter()
                .enumerate()
                .filter_map(|(i, p)| match &p.kind {
                    ParamKind::Tensor(t) if !t.output => Some((i, p, t)),
                    _ => None,
                });
            for ((i, p, t), &d) in inputs.zip(dtypes) {
                if !t.dtypes.is_empty() && !t.dtypes.contains(&d) {
                    return Err(Error::DType(format!(
                        "{}: {} has dtype {d} but the function takes {}",
                        self.inner.name,
                        ArgName {
                            index: i,
                            name: Some(&p.name)
                        },
                        one_of(&t.dtypes)
                    )));
                }
            }
        }
        match &self.inner.outputs {
            Some(rule) => {
                let outs = rule(input_shapes)?;
                self.check_rule_answer(input_shapes, &outs)?;
                Ok(outs)
            }
            None => Err(Error::Argument(format!(
                "{}: this function cannot say the shapes of its outputs ahead of a call (only compiled rivet functions can); give the output shapes explicitly",
                self.inner.name
            ))),
        }
    }

    /// The gate every rule's answer passes before it leaves rivet (XLA's result types, a
    /// foreign library's answer, Python's `Function.output_shapes`): the answer
    /// fits the signature (as many outputs, each of its rank, fixed dims, symbolic dims bound
    /// as the inputs bind them, an allowed dtype) and each output's element count and byte
    /// size are representable (`alloc::tensor_bytes`: over 2^63 elements or
    /// `MAX_ALLOC_BYTES` is an `Error::Memory`, as the eager call's allocation would be).
    fn check_rule_answer(&self, inputs: &[&[i64]], outs: &[(Vec<i64>, DType)]) -> Result<()> {
        let name = &self.inner.name;
        let broken = |what: String| {
            let msg = format!("{name}: the output rule {what}");
            if self.inner.foreign {
                Error::Library(msg)
            } else {
                Error::Internal(msg)
            }
        };
        if let Some(sig) = &self.inner.signature {
            let tensors = || {
                sig.params.iter().filter_map(|p| match &p.kind {
                    ParamKind::Tensor(t) => Some((p, t)),
                    _ => None,
                })
            };
            // Symbolic dims as the inputs bind them (inputs that fit their declared rank).
            let mut env: std::collections::HashMap<&str, i64> = Default::default();
            for ((_, t), shape) in tensors().filter(|(_, t)| !t.output).zip(inputs) {
                if let Some(dims) = t.shape.as_ref().filter(|d| d.len() == shape.len()) {
                    for (d, &s) in dims.iter().zip(shape.iter()) {
                        if let Dim::Var(v) = d {
                            env.entry(v.as_str()).or_insert(s);
                        }
                    }
                }
            }
            let wanted: Vec<_> = tensors().filter(|(_, t)| t.output).collect();
            if wanted.len() != outs.len() {
                return Err(broken(format!(
                    "answered {} output{}, but the signature has {}",
                    outs.len(),
                    if outs.len() == 1 { "" } else { "s" },
                    wanted.len()
                )));
            }
            for ((p, t), (shape, dtype)) in wanted.into_iter().zip(outs) {
                if !t.dtypes.is_empty() && !t.dtypes.contains(dtype) {
                    return Err(broken(format!(
                        "answered dtype {dtype} for output '{}', whose signature allows {}",
                        p.name,
                        one_of(&t.dtypes)
                    )));
                }
                let Some(dims) = &t.shape else { continue };
                if dims.len() != shape.len() {
                    return Err(broken(format!(
                        "answered the shape {shape:?} for output '{}', of rank {}; its signature has rank {}",
                        p.name,
                        shape.len(),
                        dims.len()
                    )));
                }
                for (k, (d, &s)) in dims.iter().zip(shape.iter()).enumerate() {
                    let want = match d {
                        Dim::Fixed(n) => Some(*n),
                        Dim::Var(v) => env.get(v.as_str()).copied(),
                        Dim::Any => None,
                    };
                    if want.is_some_and(|w| w != s) {
                        return Err(broken(format!(
                            "answered size {s} in dim {k} of output '{}', where its signature says {d:?} = {}",
                            p.name,
                            want.unwrap_or_default()
                        )));
                    }
                }
            }
        }
        for (i, (shape, dtype)) in outs.iter().enumerate() {
            if let Some(d) = shape.iter().position(|&d| d < 0) {
                return Err(broken(format!(
                    "answered the negative size {} in dim {d} of output {i}",
                    shape[d]
                )));
            }
            if shape.len() > crate::layout::MAX_NDIM {
                return Err(broken(format!(
                    "answered {} dims for output {i}; at most {}",
                    shape.len(),
                    crate::layout::MAX_NDIM
                )));
            }
            crate::alloc::tensor_bytes(shape, *dtype)
                .map_err(|e| e.context(&format!("{name}: output {i}: ")))?;
        }
        Ok(())
    }

    /// This function marked as another library's (`capi::import`), before anyone else holds
    /// it: a broken output rule is then `Error::Library`, not `Error::Internal`.
    pub(crate) fn into_foreign(mut self) -> Function {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.foreign = true;
        }
        self
    }

    /// Whether `output_shapes` can answer (the function was made `with_output_rule`).
    pub fn has_output_rule(&self) -> bool {
        self.inner.outputs.is_some()
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn signature(&self) -> Option<&Signature> {
        self.inner.signature.as_ref()
    }

    pub fn call(&self, args: &[Value]) -> Result<Value> {
        if let (true, Some(sig)) = (self.inner.checked, &self.inner.signature) {
            sig.check(&self.inner.name, args)?;
        }
        (self.inner.body)(args)
    }

    /// True when both handles are the same function object.
    pub fn same(&self, other: &Function) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// This function with `object`, of which its body's closures hold `hidden` handles,
    /// made visible as its `parts`. Only a function no one else holds yet can take them
    /// (right after it is made); otherwise it is returned unchanged (parts only inform, so
    /// lacking them makes accounting conservative, never wrong).
    pub fn with_parts(
        mut self,
        object: Arc<dyn std::any::Any + Send + Sync>,
        hidden: usize,
    ) -> Function {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.parts = Some(Parts { object, hidden });
        }
        self
    }

    /// What the body works with, when the function was given it (`with_parts`).
    pub fn parts(&self) -> Option<&Parts> {
        self.inner.parts.as_ref()
    }

    /// How many handles of this function object exist (clones of it, anywhere).
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// An identity of the function object, equal for every handle of it.
    pub fn key(&self) -> usize {
        Arc::as_ptr(&self.inner) as *const () as usize
    }
}

impl fmt::Debug for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner.signature {
            Some(sig) => write!(f, "Function({}{sig})", self.inner.name),
            None => write!(f, "Function({}(...))", self.inner.name),
        }
    }
}

/// One dim of a declared tensor shape.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Dim {
    Fixed(i64),
    /// A symbolic dim: every occurrence across the arguments must bind the same value.
    Var(String),
    Any,
}

/// Where a tensor parameter's memory may live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum DeviceSpec {
    /// Any memory CPU code can read (cpu, cuda_host): native CPU functions.
    #[default]
    Host,
    /// Exactly this device.
    Exactly(Device),
    /// Any device: the function checks devices itself (the compiler's call path for CUDA
    /// functions, which also requires all tensors on one device).
    Any,
}

#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    /// Accepted dtypes; empty means any.
    pub dtypes: Vec<DType>,
    /// Declared shape (its length is the rank); `None` means any rank.
    pub shape: Option<Vec<Dim>>,
    /// Where the tensor may live.
    pub device: DeviceSpec,
    /// The function writes this tensor: it must be writable and free of self-overlap.
    pub output: bool,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum ParamKind {
    Any,
    Bool,
    Int,
    /// A float; ints and bools are accepted too (Python's numeric tower).
    Float,
    Str,
    Function,
    Tensor(TensorSpec),
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Param {
    pub name: String,
    pub kind: ParamKind,
}

impl Param {
    pub fn new(name: impl Into<String>, kind: ParamKind) -> Param {
        Param {
            name: name.into(),
            kind,
        }
    }
}

/// Serialised (serde) as the C ABI's signature JSON (docs/c_abi.md, "Typed functions"):
/// `{"params": [{"name": "x", "kind": {"tensor": {"dtypes": ["float32"], "shape":
/// [{"var": "n"}, {"fixed": 4}, "any"], "device": "host", "output": false}}}, ...]}`.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    pub params: Vec<Param>,
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Var(v) => f.write_str(v),
            Dim::Any => f.write_str("?"),
        }
    }
}

impl fmt::Display for ParamKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamKind::Any => f.write_str("any"),
            ParamKind::Bool => f.write_str("bool"),
            ParamKind::Int => f.write_str("int"),
            ParamKind::Float => f.write_str("float"),
            ParamKind::Str => f.write_str("str"),
            ParamKind::Function => f.write_str("function"),
            ParamKind::Tensor(t) => {
                f.write_str("Tensor[")?;
                let dts: Vec<&str> = t.dtypes.iter().map(|d| d.name()).collect();
                f.write_str(if dts.is_empty() { "any" } else { "" })?;
                f.write_str(&dts.join("|"))?;
                if let Some(shape) = &t.shape {
                    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
                    write!(f, ", ({})", dims.join(", "))?;
                }
                f.write_str("]")
            }
        }
    }
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ps: Vec<String> = self
            .params
            .iter()
            .map(|p| format!("{}: {}", p.name, p.kind))
            .collect();
        write!(f, "({})", ps.join(", "))
    }
}

fn one_of(dtypes: &[DType]) -> String {
    let names: Vec<&str> = dtypes.iter().map(|d| d.name()).collect();
    match names.len() {
        1 => names[0].to_string(),
        _ => format!("one of {}", names.join(", ")),
    }
}

impl Signature {
    pub fn new(params: Vec<Param>) -> Signature {
        Signature { params }
    }

    /// Checks `args` against the declared parameters; `func` words the errors.
    pub fn check(&self, func: &str, args: &[Value]) -> Result<()> {
        if args.len() != self.params.len() {
            return Err(Error::Argument(format!(
                "{func}{self} takes {} argument{} but {} were given",
                self.params.len(),
                if self.params.len() == 1 { "" } else { "s" },
                args.len()
            )));
        }
        // Symbolic dims bound so far: (name, value, argument index, argument name).
        let mut bound: smallvec::SmallVec<[(&str, i64, usize, &str); 8]> =
            smallvec::SmallVec::new();
        for (i, (p, a)) in self.params.iter().zip(args).enumerate() {
            let arg = ArgName {
                index: i,
                name: Some(&p.name),
            };
            let mismatch = || {
                Error::Argument(format!(
                    "{func}: {arg} expected {}, got {}",
                    p.kind,
                    a.kind()
                ))
            };
            match (&p.kind, a) {
                (ParamKind::Any, _) => {}
                (ParamKind::Bool, Value::Bool(_)) => {}
                (ParamKind::Int, Value::Int(_) | Value::Bool(_)) => {}
                (ParamKind::Float, Value::Float(_) | Value::Int(_) | Value::Bool(_)) => {}
                (ParamKind::Str, Value::Str(_)) => {}
                (ParamKind::Function, Value::Function(_)) => {}
                (ParamKind::Tensor(spec), Value::Tensor(t)) => {
                    if !spec.dtypes.is_empty() && !spec.dtypes.contains(&t.dtype()) {
                        return Err(Error::DType(format!(
                            "{func}: {arg} expected dtype {}, got {}",
                            one_of(&spec.dtypes),
                            t.dtype()
                        )));
                    }
                    match spec.device {
                        DeviceSpec::Exactly(d) if d != t.device() => {
                            return Err(Error::Device(format!(
                                "{func}: {arg} expected a tensor on {d}, got one on {}",
                                t.device()
                            )))
                        }
                        DeviceSpec::Host if !t.device().is_host() => {
                            return Err(Error::Device(format!(
                                "{func}: {arg} expected a CPU tensor, got one on {}",
                                t.device()
                            )))
                        }
                        _ => {}
                    }
                    if let Some(shape) = &spec.shape {
                        if shape.len() != t.ndim() {
                            return Err(Error::Shape(format!(
                                "{func}: {arg} expected a {}-d tensor, got {}-d of shape {:?}",
                                shape.len(),
                                t.ndim(),
                                t.shape()
                            )));
                        }
                        for (d, (want, &got)) in shape.iter().zip(t.shape()).enumerate() {
                            match want {
                                Dim::Any => {}
                                Dim::Fixed(n) if *n == got => {}
                                Dim::Fixed(n) => {
                                    return Err(Error::Shape(format!(
                                        "{func}: {arg} expected size {n} in dim {d}, got shape {:?}",
                                        t.shape()
                                    )))
                                }
                                Dim::Var(v) => match bound.iter().find(|b| b.0 == v) {
                                    Some(&(_, val, _, _)) if val == got => {}
                                    Some(&(_, val, j, jname)) => {
                                        return Err(Error::Shape(format!(
                                            "{func}: dim '{v}' is {val} from argument {j} ('{jname}') but {got} from {arg} (dim {d} of shape {:?})",
                                            t.shape()
                                        )))
                                    }
                                    None => bound.push((v, got, i, &p.name)),
                                },
                            }
                        }
                    }
                    if spec.output {
                        t.check_writable(arg, func)?;
                    }
                }
                _ => return Err(mismatch()),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;

    fn mm_sig() -> Signature {
        let t = |dims: [&str; 2], output| {
            ParamKind::Tensor(TensorSpec {
                dtypes: vec![DType::F32],
                shape: Some(dims.iter().map(|d| Dim::Var(d.to_string())).collect()),
                device: DeviceSpec::Host,
                output,
            })
        };
        Signature::new(vec![
            Param::new("A", t(["m", "k"], false)),
            Param::new("B", t(["k", "n"], false)),
            Param::new("C", t(["m", "n"], true)),
        ])
    }

    #[test]
    fn binds_symbolic_dims_and_names_conflicts() {
        let f = Function::with_signature("mm", mm_sig(), |_| Ok(Value::Null));
        let z = |s: &[i64]| Value::Tensor(Tensor::zeros(s, DType::F32).unwrap());
        assert!(f.call(&[z(&[2, 3]), z(&[3, 4]), z(&[2, 4])]).is_ok());
        let e = f.call(&[z(&[2, 3]), z(&[5, 4]), z(&[2, 4])]).unwrap_err();
        assert!(matches!(e, Error::Shape(_)));
        assert_eq!(
            e.to_string(),
            "mm: dim 'k' is 3 from argument 0 ('A') but 5 from argument 1 ('B') (dim 0 of shape [5, 4])"
        );
        let e = f.call(&[z(&[2, 3]), z(&[3, 4])]).unwrap_err();
        assert!(
            matches!(e, Error::Argument(_))
                && e.to_string().contains("takes 3 arguments but 2 were given")
        );
        let e = f
            .call(&[z(&[2, 3]), Value::from("x"), z(&[2, 4])])
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("argument 1 ('B') expected Tensor[float32, (k, n)], got str"),
            "{e}"
        );
        let i = Value::Tensor(Tensor::zeros(&[2, 3], DType::I32).unwrap());
        let e = f.call(&[i, z(&[3, 4]), z(&[2, 4])]).unwrap_err();
        assert!(
            matches!(e, Error::DType(_))
                && e.to_string().contains("expected dtype float32, got int32")
        );
    }
}
