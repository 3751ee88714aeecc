//! # rivet
//!
//! Write a tensor kernel once in a small compute DSL, compile it (Cranelift for the CPU, CUDA C
//! through NVRTC for NVIDIA GPUs) and run it on Rust data here, or on torch, JAX, NumPy, CuPy
//! and MXNet memory from Python through DLPack, with no copies.
//!
//! This crate is the front door: the runtime ([`runtime`], `rivet-runtime`) and the compiler
//! ([`compiler`], `rivet-compiler`) re-exported, and a [`prelude`] with what a kernel author
//! needs. The lower crates stay usable on their own. Feature `ndarray`: tensors from and to
//! `ndarray` arrays (`Tensor::from_ndarray`, `view_ndarray`, `to_ndarray`).
//!
//! A matrix product, built for the CPU and run on Rust-owned data:
//!
//! ```
//! use rivet::prelude::*;
//!
//! # fn main() -> rivet::Result<()> {
//! let n = te::var("n");
//! let a = te::placeholder([&n, &n], DType::F32, "A")?;
//! let b = te::placeholder([&n, &n], DType::F32, "B")?;
//! let k = te::reduce_axis(0, &n, "k")?;
//! let c = te::compute([&n, &n], |[i, j]| te::sum(a.at((i, &k)) * b.at((&k, j)), &k), "C")?;
//! let mm = build(&Schedule::new(&[&c])?, &[&a, &b, &c], "cpu", "mm")?.get_function("mm")?;
//!
//! // Rust-owned data, no copies: the tensors take the Vecs' buffers.
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let y = Tensor::from_vec(vec![5.0f32, 6.0, 7.0, 8.0], &[2, 2])?;
//! let z = Tensor::from_vec(vec![0.0f32; 4], &[2, 2])?;
//! mm.run(&[&x, &y, &z])?;
//! assert_eq!(z.into_vec::<f32>()?, [19.0, 22.0, 43.0, 50.0]);
//! # Ok(())
//! # }
//! ```
//!
//! The DSL ([`te`]): a kernel is placeholders (inputs), computes (a value per element, as a
//! closure over the element's indices) and reductions over reduce axes. Indices, dims and
//! bounds take expressions, axes and integers alike, borrowed or owned: an array when they are
//! of one kind (`a.at([i, j])`), a tuple when they differ (`a.at((i, &k))`). Arithmetic works
//! on expressions, axes and numbers (`&i * 2 + &k`), with the mixed-type rule of the Python
//! DSL (a float with an int expression is an error: `i * 0.5` is refused, `x * 0.5` with a
//! float `x` is fine). Errors inside a body (a wrong index, a mixed-type operation) are carried
//! in the expression and reported by [`te::compute`] as a [`Error::Compile`] naming the stage,
//! so closures return plain expressions and `?` handles the rest.
//!
//! Functions built here can be saved ([`Module::save`]) and loaded from Python
//! (`rivet.load_module`), or called in Rust ([`Run::run`]). `rivet/examples/` has the seed
//! GEMM, softmax, a 2-D convolution and a fused GEMM + bias + gelu, each checked from Python
//! against torch by the test suite.

pub use rivet_compiler as compiler;
pub use rivet_runtime as runtime;

pub use rivet_compiler::{build, Error, Module, Result, Schedule, Target};
pub use rivet_runtime::{DType, Function, Tensor, Value};

/// The backward (vector-Jacobian product) of a function built from a te program: it takes
/// the forward's inputs, one cotangent per output, and writes one gradient per float input
/// (derived with [`te::gradient()`], built for the forward's target, cached). Python's
/// `Function.backward()`; `rivet.torch.custom_op(f, name, backward=b)` takes it.
///
/// ```
/// use rivet::prelude::*;
///
/// # fn main() -> rivet::Result<()> {
/// let n = te::var("n");
/// let x = te::placeholder([&n], DType::F64, "X")?;
/// let y = te::compute([&n], |[i]| x.at([&i]) * x.at([&i]), "Y")?;
/// let square = build(&Schedule::new(&[&y])?, &[&x, &y], "cpu", "square")?
///     .get_function("square")?;
/// let grad = rivet::backward(&square)?; // (X, dY, dX): dX = 2 X dY
/// let (x, dy) = (Tensor::from_slice(&[3.0, -1.0], &[2])?, Tensor::from_slice(&[1.0, 0.5], &[2])?);
/// let dx = Tensor::zeros(&[2], DType::F64)?;
/// grad.run(&[&x, &dy, &dx])?;
/// assert_eq!(dx.to_vec::<f64>()?, [6.0, -1.0]);
/// # Ok(())
/// # }
/// ```
pub fn backward(f: &Function) -> Result<Function> {
    rivet_compiler::backward::backward(f)
}

/// The tensor-expression DSL: [`te::placeholder`], [`te::compute`], [`te::reduce_axis`],
/// reductions ([`te::sum`], [`te::max_over`], ...), math functions, [`te::gradient()`].
///
/// ```
/// use rivet::prelude::*;
///
/// # fn main() -> rivet::Result<()> {
/// let (n, m) = (te::var("n"), te::var("m"));
/// let x = te::placeholder([&n, &m], DType::F32, "X")?;
/// let r = te::reduce_axis(0, &m, "r")?;
/// // The row sums, and each element over its row's sum.
/// let s = te::compute([&n], |[i]| te::sum(x.at((&i, &r)), &r), "S")?;
/// let y = te::compute([&n, &m], |[i, j]| x.at([&i, &j]) / s.at([i]), "Y")?;
/// assert_eq!(y.shape().len(), 2);
/// // A float constant with an int expression is refused, naming the stage:
/// let bad = te::compute([&n], |[i]| x.at((&i, 0)) + i * 0.5, "Bad");
/// assert!(bad.unwrap_err().to_string().contains("Bad"));
/// # Ok(())
/// # }
/// ```
pub mod te {
    pub use rivet_compiler::te::*;
}

/// `use rivet::prelude::*;` brings what a kernel author needs: the [`te`] DSL module, its
/// conversion traits, [`build()`] and [`Schedule`], the runtime's [`Tensor`], [`Function`],
/// [`DType`] and [`Value`], and [`Run`] to call a function on tensors.
///
/// ```
/// use rivet::prelude::*;
///
/// # fn main() -> rivet::Result<()> {
/// // A scheduled kernel: y = a x + y over row blocks of 4, in parallel, 8-wide vectors.
/// let (n, m) = (te::var("n"), te::var("m"));
/// let x = te::placeholder([&n, &m], DType::F32, "X")?;
/// let y = te::placeholder([&n, &m], DType::F32, "Y")?;
/// let z = te::compute([&n, &m], |[i, j]| 3.0 * x.at([&i, &j]) + y.at([i, j]), "Z")?;
/// let mut s = Schedule::new(&[&z])?;
/// let [i, j] = [z.axis()[0].var.clone(), z.axis()[1].var.clone()];
/// let st = s.stage(&z)?;
/// let (io, _ii) = st.split_by(&i, 4)?;
/// st.parallel(&io)?;
/// let (_jo, ji) = st.split_by(&j, 8)?;
/// st.vectorize(&ji)?;
/// let f = build(&s, &[&x, &y, &z], "cpu", "axpy")?.get_function("axpy")?;
/// let a = Tensor::from_vec(vec![1.0f32; 30], &[3, 10])?;
/// let b = Tensor::from_vec(vec![0.5f32; 30], &[3, 10])?;
/// let c = Tensor::zeros(&[3, 10], DType::F32)?;
/// f.run(&[&a, &b, &c])?;
/// assert!(c.to_vec::<f32>()?.iter().all(|&v| v == 3.5));
/// # Ok(())
/// # }
/// ```
pub mod prelude {
    pub use crate::te;
    pub use crate::te::{Axes, Indices};
    pub use crate::{build, DType, Function, Module, Run, Schedule, Target, Tensor, Value};
}

/// Hands a crate's Rust-built functions to Python in one step: in a crate built as a `cdylib`,
/// `rivet::python_library!(f)` defines the entry point `rivet_library_init` that Python's
/// `rivet.load_library(path)` calls; `f` (a function or closure returning
/// `Result<Vec<(String, Function)>, E>` with `E: Display`) builds the functions, which are
/// registered under their names in the Python process's rivet (`rivet.get_global_func`).
/// They cross through the C ABI only (`rivet_runtime::capi::export`): each keeps its own
/// signature checks and runs in this library's runtime; on the Python side it keeps its typed
/// signature and output rule (C ABI 1.1, `RivetFunctionCreateTyped`), so plain calls,
/// `rivet.to_pytorch_func`, `rivet.torch.custom_op` and `rivet.jax.ffi_func` all take it (a
/// gradient crosses as a function of its own: hand over [`backward()`] of it too, and pass it
/// as `backward=`). `examples/rust_library` is
/// such a crate; `tests/python/test_rust_examples.py` loads it and checks it against torch.
///
/// ```
/// use rivet::prelude::*;
///
/// fn functions() -> rivet::Result<Vec<(String, Function)>> {
///     let n = te::var("n");
///     let x = te::placeholder([&n], DType::F32, "X")?;
///     let y = te::compute([&n], |[i]| te::exp(x.at([i])), "Y")?;
///     let f = build(&Schedule::new(&[&y])?, &[&x, &y], "cpu", "exp")?.get_function("exp")?;
///     Ok(vec![("mylib.exp".to_string(), f)])
/// }
///
/// rivet::python_library!(functions);
///
/// # fn main() {
/// // Python's rivet.load_library calls the entry point with its host API; without one it
/// // refuses (here, with a NULL host) and says why in the error buffer.
/// let mut err = [0 as std::ffi::c_char; 128];
/// let rc = unsafe { rivet_library_init(std::ptr::null(), err.as_mut_ptr(), err.len()) };
/// assert_ne!(rc, 0);
/// let msg = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) }.to_string_lossy();
/// assert!(msg.contains("host API is NULL"), "{msg}");
/// # }
/// ```
#[macro_export]
macro_rules! python_library {
    ($build:expr) => {
        /// The entry point `rivet.load_library` calls (`rivet::python_library!`).
        ///
        /// # Safety
        /// Called by rivet's host with a live `RivetHostApi` and an error buffer.
        #[no_mangle]
        pub unsafe extern "C" fn rivet_library_init(
            host: *const $crate::runtime::capi::RivetHostApi,
            err: *mut ::std::ffi::c_char,
            err_len: usize,
        ) -> i32 {
            // SAFETY: the host's promises, passed on.
            unsafe { $crate::runtime::capi::export::library_init(host, err, err_len, $build) }
        }
    };
}

/// Calling a function on tensors from Rust.
pub trait Run {
    /// Calls the function with `args` (inputs, then the outputs it writes in place), as Python's
    /// `f(a, b, c)`: every signature check applies (shapes, dtypes, devices, aliasing).
    ///
    /// ```
    /// use rivet::prelude::*;
    ///
    /// # fn main() -> rivet::Result<()> {
    /// let n = te::var("n");
    /// let x = te::placeholder([&n], DType::F64, "X")?;
    /// let y = te::compute([&n], |[i]| x.at([i]) * 2.0, "Y")?;
    /// let double = build(&Schedule::new(&[&y])?, &[&x, &y], "cpu", "double")?
    ///     .get_function("double")?;
    /// let (a, b) = (Tensor::from_slice(&[1.0, 2.5], &[2])?, Tensor::zeros(&[2], DType::F64)?);
    /// double.run(&[&a, &b])?;
    /// assert_eq!(b.to_vec::<f64>()?, [2.0, 5.0]);
    /// // A wrong dtype is an error naming the argument, not a crash:
    /// let ints = Tensor::from_slice(&[1i64, 2], &[2])?;
    /// assert!(double.run(&[&ints, &b]).is_err());
    /// # Ok(())
    /// # }
    /// ```
    fn run(&self, args: &[&Tensor]) -> Result<()>;
}

impl Run for Function {
    fn run(&self, args: &[&Tensor]) -> Result<()> {
        let vals: Vec<Value> = args.iter().map(|t| Value::Tensor((*t).clone())).collect();
        self.call(&vals)?;
        Ok(())
    }
}

/// The docs book's Rust blocks, compiled and run as doctests of this crate (`cargo test --doc
/// -p rivet`, part of `make test`): a page with a ```` ```rust ```` block is listed here, which
/// `tests/python/test_docs_examples.py` checks. Lines starting with `# ` are hidden by both
/// rustdoc and mdBook, so a page shows only the lines that matter.
#[cfg(doctest)]
mod docs_book {
    #[doc = include_str!("../../docs/rust.md")]
    struct RustTutorial;
    #[doc = include_str!("../../docs/rust_data.md")]
    struct RustData;
}
