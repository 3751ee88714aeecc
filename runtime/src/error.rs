//! The runtime's one error type.
//!
//! User errors (bad arguments, bad DLPack input, unknown names) are kept apart from
//! [`Error::Internal`], which always means a bug in rivet. Each user variant maps to one
//! Python exception class in the bindings (README "Errors", docs/python_api.md), so the variant is the
//! contract and the message is free text that names the argument, the expectation and what
//! came.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// An error raised by a foreign caller (e.g. a Python exception inside a callback),
/// carried through Rust untouched so the bindings can re-raise the very same object.
#[derive(Clone)]
pub struct ForeignError {
    /// Text for Rust callers who cannot interpret the payload.
    pub message: String,
    /// The foreign error object (the bindings downcast it back).
    pub payload: Arc<dyn Any + Send + Sync>,
}

impl fmt::Debug for ForeignError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForeignError")
            .field("message", &self.message)
            .finish()
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Wrong rank or shape, symbolic dims bound inconsistently.
    #[error("{0}")]
    Shape(String),
    /// Wrong or unsupported dtype.
    #[error("{0}")]
    DType(String),
    /// Wrong or unavailable device.
    #[error("{0}")]
    Device(String),
    /// Wrong number or kind of arguments.
    #[error("{0}")]
    Argument(String),
    /// A write to read-only memory was requested.
    #[error("{0}")]
    ReadOnly(String),
    /// Overlapping output elements, output partially aliasing an input.
    #[error("{0}")]
    Layout(String),
    /// Malformed, unsupported or already-consumed DLPack tensors; failed exports.
    #[error("{0}")]
    DLPack(String),
    /// No function registered under the name.
    #[error("{0}")]
    NotFound(String),
    /// Registry conflicts (name taken without override).
    #[error("{0}")]
    Registry(String),
    /// The compiler rejected a program.
    #[error("{0}")]
    Compile(String),
    /// An allocation over rivet's size limit, or one the system refused (never an abort).
    #[error("{0}")]
    Memory(String),
    /// An element access outside its tensor, caught at run time (checked mode, or a
    /// data-dependent index).
    #[error("{0}")]
    Index(String),
    /// A derivative was asked of something that has none: a function with no backward, a
    /// te program through a host callback or a construct with no derivative rule.
    #[error("{0}")]
    NotDifferentiable(String),
    /// Sharing a tensor with another process failed: memory that cannot be shared, a bad,
    /// stale or foreign handle, a sending process that is gone (`ipc`, `shm`).
    #[error("{0}")]
    Ipc(String),
    /// A function of another library (`RivetFunctionCreate`, `rivet.load_library`) failed
    /// with what it calls an internal error, or broke the C ABI's contract (a NULL string,
    /// an output rule's answer that does not fit the function's signature...): the library's
    /// bug, never rivet's, so never `Internal`.
    #[error("{0}")]
    Library(String),
    /// An error from a foreign callee (Python exception in a callback), passed through.
    #[error("{}", .0.message)]
    Foreign(ForeignError),
    /// A bug in rivet, never the user's fault.
    #[error("internal error (a bug in rivet, please report it): {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The kind's name: the Python exception class of `rivet.error` it maps to, and the kind
    /// string of the C ABI's last error (`capi`).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Error::Shape(_) => "ShapeError",
            Error::DType(_) => "DTypeError",
            Error::Device(_) => "DeviceError",
            Error::Argument(_) => "ArgumentError",
            Error::ReadOnly(_) => "ReadOnlyError",
            Error::Layout(_) => "LayoutError",
            Error::DLPack(_) => "DLPackError",
            Error::NotFound(_) => "FunctionNotFoundError",
            Error::Registry(_) => "RegistryError",
            Error::Compile(_) => "CompileError",
            Error::Memory(_) => "MemoryError",
            Error::Index(_) => "IndexError",
            Error::NotDifferentiable(_) => "NotDifferentiableError",
            Error::Ipc(_) => "IPCError",
            Error::Library(_) => "LibraryError",
            Error::Foreign(_) => "Error",
            Error::Internal(_) => "InternalError",
        }
    }

    /// The error of the kind named `kind` (`kind_name`'s inverse) with `message`; None for
    /// an unknown name. `Foreign` ("Error") maps to `Argument`: across a C boundary only the
    /// text survives.
    pub fn from_kind_name(kind: &str, message: String) -> Option<Error> {
        Some(match kind {
            "ShapeError" => Error::Shape(message),
            "DTypeError" => Error::DType(message),
            "DeviceError" => Error::Device(message),
            "ArgumentError" | "Error" => Error::Argument(message),
            "ReadOnlyError" => Error::ReadOnly(message),
            "LayoutError" => Error::Layout(message),
            "DLPackError" => Error::DLPack(message),
            "FunctionNotFoundError" => Error::NotFound(message),
            "RegistryError" => Error::Registry(message),
            "CompileError" => Error::Compile(message),
            "MemoryError" => Error::Memory(message),
            "IndexError" => Error::Index(message),
            "NotDifferentiableError" => Error::NotDifferentiable(message),
            "IPCError" => Error::Ipc(message),
            "LibraryError" => Error::Library(message),
            "InternalError" => Error::Internal(message),
            _ => return None,
        })
    }

    /// Prefixes the message with `ctx` (e.g. "testing.axpy: argument 2 ('y'): "), keeping the
    /// variant. Foreign errors pass through untouched so they can be re-raised as they were.
    pub fn context(self, ctx: &str) -> Error {
        let pre = |m: String| format!("{ctx}{m}");
        match self {
            Error::Shape(m) => Error::Shape(pre(m)),
            Error::DType(m) => Error::DType(pre(m)),
            Error::Device(m) => Error::Device(pre(m)),
            Error::Argument(m) => Error::Argument(pre(m)),
            Error::ReadOnly(m) => Error::ReadOnly(pre(m)),
            Error::Layout(m) => Error::Layout(pre(m)),
            Error::DLPack(m) => Error::DLPack(pre(m)),
            Error::NotFound(m) => Error::NotFound(pre(m)),
            Error::Registry(m) => Error::Registry(pre(m)),
            Error::Compile(m) => Error::Compile(pre(m)),
            Error::Memory(m) => Error::Memory(pre(m)),
            Error::Index(m) => Error::Index(pre(m)),
            Error::NotDifferentiable(m) => Error::NotDifferentiable(pre(m)),
            Error::Ipc(m) => Error::Ipc(pre(m)),
            Error::Library(m) => Error::Library(pre(m)),
            Error::Internal(m) => Error::Internal(pre(m)),
            Error::Foreign(f) => Error::Foreign(f),
        }
    }
}

/// Where an argument sits in a call: used to word errors as `argument 2 ('y')`.
#[derive(Debug, Clone, Copy)]
pub struct ArgName<'a> {
    pub index: usize,
    pub name: Option<&'a str>,
}

impl fmt::Display for ArgName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name {
            Some(n) => write!(f, "argument {} ('{}')", self.index, n),
            None => write!(f, "argument {}", self.index),
        }
    }
}
