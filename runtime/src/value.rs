//! `Value`: what packed functions take and return. Cheap to clone (tensors and functions
//! are reference-counted views).

use crate::device::Device;
use crate::dtype::DType;
use crate::function::Function;
use crate::tensor::Tensor;
use std::sync::Arc;

/// One argument or result of a packed function (tvm-ffi's `Any`): scalars by value, strings,
/// tensors and functions by reference.
///
/// ```
/// use rivet_runtime::{DType, Tensor, Value};
///
/// let args: Vec<Value> = vec![2.5.into(), 7i64.into(), "mode".into(), DType::F16.into()];
/// assert_eq!(args[0].as_f64(), Some(2.5));
/// assert_eq!(args[1].as_f64(), Some(7.0)); // ints read as floats, as in Python
/// assert_eq!(args[2].kind(), "str");
/// let t: Value = Tensor::zeros(&[2], DType::F32).unwrap().into();
/// assert_eq!(t.as_tensor().map(|t| t.numel()), Some(2));
/// ```
#[derive(Clone, Debug, Default)]
pub enum Value {
    #[default]
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Arc<str>),
    Bytes(Arc<[u8]>),
    DType(DType),
    Device(Device),
    Tensor(Tensor),
    Function(Function),
    /// Several values (e.g. the outputs a compiled function allocated); a tuple in Python.
    List(Arc<[Value]>),
}

impl Value {
    /// The kind's name, as used in error messages ("expected tensor, got str").
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::DType(_) => "dtype",
            Value::Device(_) => "device",
            Value::Tensor(_) => "tensor",
            Value::Function(_) => "function",
            Value::List(_) => "list",
        }
    }

    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// Floats and ints (and bools) read as a float, as Python's numeric tower allows.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Float(x) => Some(x),
            Value::Int(i) => Some(i as f64),
            Value::Bool(b) => Some(b as i64 as f64),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::Int(i) => Some(i),
            Value::Bool(b) => Some(b as i64),
            _ => None,
        }
    }
}

macro_rules! from_value {
    ($($t:ty => $v:ident),*) => { $(impl From<$t> for Value { fn from(x: $t) -> Value { Value::$v(x.into()) } })* };
}
from_value!(bool => Bool, i64 => Int, i32 => Int, f64 => Float, f32 => Float, &str => Str, String => Str,
            DType => DType, Device => Device, Tensor => Tensor, Function => Function);

impl From<()> for Value {
    fn from(_: ()) -> Value {
        Value::Null
    }
}
