// rivet ops' kernels in torch's dispatcher, in C++ (rivet/torch.py compiles this file against
// the installed torch on first use and caches the library; docs/torch.md "The native path").
//
// Why: a rivet op registered with Python kernels pays torch's Python dispatch on every call
// (about 14 us eager, 15 us more inside a torch.compile graph); these kernels run no Python on
// the common path:
// - the CompositeExplicitAutograd kernel (every backend key; the fake implementation stays in
//   Python, registered for Meta) allocates the outputs with empty_cpu from the op's output
//   table, and calls the rivet function through rivet's C ABI (runtime/include/rivet/c_api.h,
//   ABI 1.x) on borrowed DLTensor views of the tensors: inputs read-only, outputs writable;
// - the Autograd kernel redispatches below autograd when no gradient is needed (grad mode off,
//   or no tensor argument requires grad); when one is, it calls the op's Python autograd
//   formula (an autograd.Function in rivet/torch.py), holding the GIL only there;
// - `call(binding, *args)` runs the same kernel without the dispatcher: torch.compile's generated
//   code calls it (rivet/_torch_native.py installs the inductor code generator), because the
//   OpOverload's argument parsing and the boxed dispatch cost more than a small kernel and,
//   after the compiled call's own machinery has evicted them from the caches, twice that.
// Errors: a rivet failure, a tensor on a device other than the CPU or without strided storage
// (sparse, mkldnn, nested), or an output over rivet.MAX_ALLOC_BYTES calls the op's Python
// error hook (which rewords signature violations with the op's name and raises the rivet
// error class of the failure's kind); the Python exception crosses the dispatcher as torch's
// python_error, so callers see the same exception types as on the Python path (never torch's
// own: the checks come before every torch call here that could throw;
// tests/python/test_fuzz_torch_ops.py).
// Invariants: a kernel never reads a tensor it did not check is on the CPU; a slot always calls
// what the dispatcher would (its live registration, else the op's OpOverload); ops are never
// unregistered while a call runs (an op's state lives until its torch::Library is dropped,
// which rivet/torch.py does only when the op is replaced with override=True).

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/dlpack.h>
#include <ATen/core/stack.h>
#include <ATen/EmptyTensor.h>
#include <c10/util/SmallVector.h>
#include <Python.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

// The C ABI's value type, type codes and entry points: the package's copy of
// runtime/include/rivet/c_api.h (rivet/include, on the include path; it needs DLPack, which
// ATen/dlpack.h above already declared). This file does not link rivet: init receives the
// entry points' addresses (from rivet._native) and checks the major version before anything is
// called.
#include <rivet/c_api.h>

#include <algorithm>
#include <memory>
#include <unordered_map>
#include <string>
#include <vector>

typedef decltype(&RivetFunctionCall) CallFn;
typedef decltype(&RivetAnyFree) AnyFreeFn;
typedef decltype(&RivetGetLastError) LastErrorFn;
typedef decltype(&RivetAbiVersion) VersionFn;

namespace {

struct Api {
  CallFn call = nullptr;
  AnyFreeFn any_free = nullptr;
  LastErrorFn last_error = nullptr;
  // rivet.MAX_ALLOC_BYTES: the outputs are refused over it, as rivet's own allocations and
  // the Python kernel refuse them (rivet/torch.py `check_size`).
  int64_t max_alloc_bytes = 0;
};
Api api;

// What a parameter of the rivet function is, in call order.
enum class Kind : int { TensorIn = 0, TensorOut = 1, Int = 2, Float = 3, Bool = 4, Str = 5 };

struct OutSpec {
  c10::ScalarType dtype;
  // Per dim: {-1, size} for a fixed size, {arg, dim} for input `arg`'s size in `dim`.
  std::vector<std::pair<int64_t, int64_t>> dims;
};

struct OpState {
  void* func = nullptr;        // RivetFunctionHandle (owned: freed never, like the op)
  std::vector<Kind> params;    // rivet parameters in order
  std::vector<int64_t> arg_of; // per parameter: its position among the op's arguments, -1 for outputs
  std::vector<Kind> arg_kind;  // per op argument: its kind (the direct call's conversions)
  std::vector<OutSpec> outs;   // allocated outputs, in order
  int64_t num_args = 0;        // the op's schema arguments
  PyObject* autograd = nullptr; // Python: autograd(*args) -> output(s)
  PyObject* on_error = nullptr; // Python: on_error(kind, message, *args) raises
};

// rivet's dtype names (the signature's) and torch's.
constexpr std::pair<const char*, c10::ScalarType> kDTypes[] = {
    {"float32", c10::ScalarType::Float}, {"float64", c10::ScalarType::Double},
    {"float16", c10::ScalarType::Half},  {"bfloat16", c10::ScalarType::BFloat16},
    {"int32", c10::ScalarType::Int},     {"int64", c10::ScalarType::Long},
    {"int16", c10::ScalarType::Short},   {"int8", c10::ScalarType::Char},
    {"uint8", c10::ScalarType::Byte},    {"bool", c10::ScalarType::Bool},
    // rivet's unsigned types beyond uint8 (rivet_runtime::DType): without them a function
    // with a uint16 output could not be registered on this path at all.
    {"uint16", c10::ScalarType::UInt16}, {"uint32", c10::ScalarType::UInt32},
    {"uint64", c10::ScalarType::UInt64}};

bool parse_dtype(const std::string& name, c10::ScalarType* out) {
  for (const auto& [n, t] : kDTypes) {
    if (name == n) {
      *out = t;
      return true;
    }
  }
  return false;
}

std::string dtype_name(c10::ScalarType t) {
  for (const auto& [n, u] : kDTypes) {
    if (t == u) return n;
  }
  return c10::toString(t);
}

// Releases the GIL for a scope if this thread holds it (autograd's worker threads do not).
class ReleaseGil {
 public:
  ReleaseGil() : state_(PyGILState_Check() ? PyEval_SaveThread() : nullptr) {}
  ~ReleaseGil() {
    if (state_) PyEval_RestoreThread(state_);
  }

 private:
  PyThreadState* state_;
};

bool to_dl_dtype(c10::ScalarType t, DLDataType* out) {
  using S = c10::ScalarType;
  switch (t) {
    case S::Float: *out = {kDLFloat, 32, 1}; return true;
    case S::Double: *out = {kDLFloat, 64, 1}; return true;
    case S::Half: *out = {kDLFloat, 16, 1}; return true;
    case S::BFloat16: *out = {kDLBfloat, 16, 1}; return true;
    case S::Int: *out = {kDLInt, 32, 1}; return true;
    case S::Long: *out = {kDLInt, 64, 1}; return true;
    case S::Short: *out = {kDLInt, 16, 1}; return true;
    case S::Char: *out = {kDLInt, 8, 1}; return true;
    case S::Byte: *out = {kDLUInt, 8, 1}; return true;
    case S::UInt16: *out = {kDLUInt, 16, 1}; return true;
    case S::UInt32: *out = {kDLUInt, 32, 1}; return true;
    case S::UInt64: *out = {kDLUInt, 64, 1}; return true;
    case S::Bool: *out = {kDLBool, 8, 1}; return true;
    default: return false;
  }
}

PyObject* to_py(const c10::IValue& v) {
  if (v.isTensor()) return THPVariable_Wrap(v.toTensor());
  if (v.isInt()) return PyLong_FromLongLong(v.toInt());
  if (v.isDouble()) return PyFloat_FromDouble(v.toDouble());
  if (v.isBool()) return PyBool_FromLong(v.toBool());
  if (v.isString()) {
    const auto& s = v.toStringRef();
    return PyUnicode_FromStringAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
  }
  Py_RETURN_NONE;
}

// Calls `fn(*prefix, *args)` with the GIL; returns a new reference or throws python_error.
PyObject* call_python(PyObject* fn, std::vector<PyObject*> prefix, const c10::IValue* args, int64_t n) {
  const auto size = static_cast<Py_ssize_t>(prefix.size() + n);
  PyObject* tuple = PyTuple_New(size);
  if (!tuple) throw python_error();
  Py_ssize_t k = 0;
  for (PyObject* p : prefix) PyTuple_SET_ITEM(tuple, k++, p);  // steals
  for (int64_t i = 0; i < n; i++) {
    PyObject* o = to_py(args[i]);
    if (!o) {
      Py_DECREF(tuple);
      throw python_error();
    }
    PyTuple_SET_ITEM(tuple, k++, o);
  }
  PyObject* r = PyObject_Call(fn, tuple, nullptr);
  Py_DECREF(tuple);
  if (!r) throw python_error();
  return r;
}

// Hands the failure to the op's Python error hook, which raises; never returns.
[[noreturn]] void fail(const OpState& s, const char* kind, const std::string& msg, const c10::IValue* args) {
  pybind11::gil_scoped_acquire gil;
  PyObject* k = PyUnicode_FromString(kind);
  PyObject* m = PyUnicode_FromStringAndSize(msg.data(), static_cast<Py_ssize_t>(msg.size()));
  PyObject* r = call_python(s.on_error, {k, m}, args, s.num_args);
  Py_XDECREF(r);
  // The hook returned instead of raising: a bug in rivet/torch.py.
  PyErr_SetString(PyExc_RuntimeError, "rivet: the torch op's error hook did not raise");
  throw python_error();
}

// The op's kernel: checks the tensors are on the CPU, allocates the outputs, calls the rivet
// function; `args` are the op's schema arguments. Shared by the dispatcher's kernel and the
// direct entry that torch.compile's generated code calls (see py_call).
// The outputs of one call (rarely more than two).
using Outs = c10::SmallVector<at::Tensor, 2>;

Outs run_kernel(const OpState& s, const c10::IValue* args) {
  for (int64_t i = 0; i < s.num_args; i++) {
    if (args[i].isTensor() && args[i].toTensor().device().type() != c10::DeviceType::CPU) {
      fail(s, "DeviceError", "", args);
    }
  }
  Outs outs;
  for (size_t k = 0; k < s.outs.size(); k++) {
    const OutSpec& o = s.outs[k];
    c10::SmallVector<int64_t, 6> shape;
    for (auto [a, d] : o.dims) {
      if (a < 0) {
        shape.push_back(d);
        continue;
      }
      const at::Tensor& t = args[a].toTensor();
      // A wrong rank is the signature check's to word (the hook runs it).
      if (d >= t.dim()) fail(s, "ShapeError", "", args);
      shape.push_back(t.size(d));
    }
    // The size in bytes, checked: over rivet's limit is the same MemoryError, in the same
    // words, as the Python kernel's (an overflowing size would be torch's own error, and a
    // size under the overflow but over the limit an attempt to allocate terabytes).
    // A zero dim makes it empty whatever the others are (as the Python kernel's exact count).
    const bool empty = std::find(shape.begin(), shape.end(), int64_t{0}) != shape.end();
    int64_t nbytes = empty ? 0 : static_cast<int64_t>(c10::elementSize(o.dtype));
    bool overflow = false;
    for (int64_t d : shape) overflow = overflow || __builtin_mul_overflow(nbytes, d, &nbytes);
    if (overflow || nbytes > api.max_alloc_bytes) {
      fail(s, "MemoryError", "cannot allocate output " + std::to_string(k) + " of shape " +
               c10::str(c10::IntArrayRef(shape)) + " (" + dtype_name(o.dtype) + "): " +
               (overflow ? std::string("more than 2^63 bytes") : std::to_string(nbytes) + " bytes") +
               ", over rivet's limit of " + std::to_string(api.max_alloc_bytes) +
               " bytes (rivet.MAX_ALLOC_BYTES)", args);
    }
    try {
      // at::detail::empty_cpu: the CPU allocation without a trip through the dispatcher (the
      // kernel only ever runs on CPU tensors, checked above).
      outs.push_back(at::Tensor(at::detail::empty_cpu(shape, o.dtype)));
    } catch (const c10::Error& e) {
      fail(s, "MemoryError", "cannot allocate output " + std::to_string(k) + " of shape " +
               c10::str(c10::IntArrayRef(shape)) + ": " + e.what_without_backtrace(), args);
    }
  }
  const size_t n = s.params.size();
  c10::SmallVector<DLTensor, 8> dl(n);
  c10::SmallVector<RivetAny, 8> call(n);
  size_t next_out = 0;
  for (size_t i = 0; i < n; i++) {
    RivetAny& v = call[i];
    v.pad = 0;
    const Kind kind = s.params[i];
    if (kind == Kind::TensorIn || kind == Kind::TensorOut) {
      const at::Tensor& t = kind == Kind::TensorOut ? outs[next_out++] : args[s.arg_of[i]].toTensor();
      // Sparse, mkldnn and nested tensors have no strided storage for a DLTensor to view
      // (data_ptr() would throw torch's RuntimeError): rivet's DLPackError, as the Python
      // kernel gets from the export (the hook's signature check words it).
      if (t.layout() != c10::kStrided || t.is_nested() || !t.has_storage()) {
        fail(s, "DLPackError", std::string("a ") + c10::str(t.layout()) +
                 " tensor cannot be passed to rivet (DLPack describes dense strided tensors only)", args);
      }
      DLTensor& d = dl[i];
      if (!to_dl_dtype(t.scalar_type(), &d.dtype)) {
        fail(s, "DTypeError", std::string("unsupported dtype ") + c10::toString(t.scalar_type()), args);
      }
      d.data = t.data_ptr();
      d.device = {kDLCPU, 0};
      d.ndim = static_cast<int32_t>(t.dim());
      d.shape = const_cast<int64_t*>(t.sizes().data());
      d.strides = const_cast<int64_t*>(t.strides().data());
      d.byte_offset = 0;
      v.type_code = kind == Kind::TensorOut ? RIVET_DLTENSOR : RIVET_DLTENSOR_READONLY;
      v.value.v_ptr = &d;
      continue;
    }
    const c10::IValue& a = args[s.arg_of[i]];
    switch (kind) {
      case Kind::Int: v.type_code = RIVET_INT; v.value.v_int64 = a.toInt(); break;
      case Kind::Float: v.type_code = RIVET_FLOAT; v.value.v_float64 = a.toDouble(); break;
      case Kind::Bool: v.type_code = RIVET_BOOL; v.value.v_int64 = a.toBool() ? 1 : 0; break;
      default: v.type_code = RIVET_STR; v.value.v_ptr = const_cast<char*>(a.toStringRef().c_str()); break;
    }
  }
  RivetAny result{};
  int32_t rc;
  {
    // The kernel may run long; Python threads go on meanwhile (rivet takes the GIL itself
    // around host callbacks).
    ReleaseGil nogil;
    rc = api.call(s.func, call.data(), static_cast<int32_t>(n), &result);
  }
  if (rc != 0) {
    const char* kind = nullptr;
    const char* msg = api.last_error(&kind);
    fail(s, kind ? kind : "Error", msg ? msg : "", args);
  }
  api.any_free(&result);
  return outs;
}

class Kernel final : public c10::OperatorKernel {
 public:
  explicit Kernel(std::shared_ptr<OpState> s) : s_(std::move(s)) {}

  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const OpState& s = *s_;
    auto args = torch::jit::last(*stack, s.num_args);
    Outs outs = run_kernel(s, args.data());
    torch::jit::drop(*stack, s.num_args);
    for (auto& o : outs) stack->emplace_back(std::move(o));
  }

 private:
  std::shared_ptr<OpState> s_;
};

class Autograd final : public c10::OperatorKernel {
 public:
  explicit Autograd(std::shared_ptr<OpState> s) : s_(std::move(s)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const OpState& s = *s_;
    auto args = torch::jit::last(*stack, s.num_args);
    bool needs_grad = false;
    if (c10::GradMode::is_enabled()) {
      for (const auto& a : args) needs_grad = needs_grad || (a.isTensor() && a.toTensor().requires_grad());
    }
    if (!needs_grad) {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
      return;
    }
    pybind11::gil_scoped_acquire gil;
    PyObject* r = call_python(s.autograd, {}, args.data(), s.num_args);
    torch::jit::drop(*stack, s.num_args);
    const size_t n_out = s.outs.size();
    if (n_out == 1) {
      stack->emplace_back(THPVariable_Unpack(r));
    } else {
      for (size_t k = 0; k < n_out; k++) stack->emplace_back(THPVariable_Unpack(PyTuple_GET_ITEM(r, k)));
    }
    Py_DECREF(r);
  }

 private:
  std::shared_ptr<OpState> s_;
};

// One registration: the op's two torch::Library objects (dropping them unregisters).
struct Registration {
  std::unique_ptr<torch::Library> kernel, autograd;
  std::shared_ptr<OpState> state;
};
std::vector<std::unique_ptr<Registration>> registrations;

// A slot per op name: the registration torch.compile's generated code reaches through `call`,
// rebound when the op is replaced (override=True), and the op's OpOverload to call instead when
// no native registration is live (replaced by a Python-path op), so the generated code always
// calls what the dispatcher would. Slots live as long as the process (generated modules hold
// their numbers).
struct Slot {
  std::string name;  // "ns::op"
  long long reg = -1;
  PyObject* fallback = nullptr;  // owned
};
std::vector<Slot> slots;
std::unordered_map<std::string, size_t> slot_of;

// What one generated module calls: a slot and the output dtypes its graph was compiled for.
// Every call checks them (the size and strides are checked by the generated code's
// assert_size_stride): an op replaced after the compile with one of other dtypes would
// otherwise have its outputs read as the old dtype.
struct Binding {
  size_t slot;
  c10::SmallVector<c10::ScalarType, 2> dtypes;
};
std::vector<Binding> bindings;

bool live(long long reg) {
  return reg >= 0 && static_cast<size_t>(reg) < registrations.size() && registrations[reg] && registrations[reg]->kernel;
}

PyObject* py_init(PyObject*, PyObject* args) {
  unsigned long long call, any_free, last_error, version;
  long long max_alloc_bytes;
  if (!PyArg_ParseTuple(args, "KKKKL", &call, &any_free, &last_error, &version, &max_alloc_bytes)) return nullptr;
  const int32_t v = reinterpret_cast<VersionFn>(version)();
  if ((v >> 16) != RIVET_ABI_MAJOR) {
    PyErr_Format(PyExc_ImportError, "rivet's C ABI is version %d.%d; this torch bridge needs %d.x", v >> 16, v & 0xffff,
                 RIVET_ABI_MAJOR);
    return nullptr;
  }
  api.call = reinterpret_cast<CallFn>(call);
  api.any_free = reinterpret_cast<AnyFreeFn>(any_free);
  api.last_error = reinterpret_cast<LastErrorFn>(last_error);
  api.max_alloc_bytes = static_cast<int64_t>(max_alloc_bytes);
  Py_RETURN_NONE;
}

// register(ns, name, func_handle, params, arg_of, outs, num_args, autograd, on_error) -> id
// outs: a list of (rivet dtype name, [(arg, dim) or (-1, size)]).
PyObject* py_register(PyObject*, PyObject* args) {
  const char *ns, *name;
  unsigned long long func;
  PyObject *params, *arg_of, *outs, *autograd, *on_error;
  long long num_args;
  if (!PyArg_ParseTuple(args, "ssKOOOLOO", &ns, &name, &func, &params, &arg_of, &outs, &num_args, &autograd, &on_error)) {
    return nullptr;
  }
  if (!api.call) {
    PyErr_SetString(PyExc_RuntimeError, "rivet torch bridge: init was not called");
    return nullptr;
  }
  HANDLE_TH_ERRORS
  auto s = std::make_shared<OpState>();
  s->func = reinterpret_cast<void*>(func);
  for (Py_ssize_t i = 0; i < PyList_Size(params); i++) {
    s->params.push_back(static_cast<Kind>(PyLong_AsLong(PyList_GET_ITEM(params, i))));
    s->arg_of.push_back(PyLong_AsLongLong(PyList_GET_ITEM(arg_of, i)));
  }
  for (Py_ssize_t i = 0; i < PyList_Size(outs); i++) {
    PyObject* o = PyList_GET_ITEM(outs, i);
    OutSpec spec;
    const char* dt = PyUnicode_AsUTF8(PyTuple_GET_ITEM(o, 0));
    if (!dt || !parse_dtype(dt, &spec.dtype)) {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "rivet torch bridge: unknown dtype %s", dt);
      return nullptr;
    }
    PyObject* dims = PyTuple_GET_ITEM(o, 1);
    for (Py_ssize_t d = 0; d < PyList_Size(dims); d++) {
      PyObject* pair = PyList_GET_ITEM(dims, d);
      spec.dims.emplace_back(PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 0)), PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 1)));
    }
    s->outs.push_back(std::move(spec));
  }
  if (PyErr_Occurred()) return nullptr;
  s->num_args = num_args;
  s->arg_kind.assign(static_cast<size_t>(num_args), Kind::TensorIn);
  for (size_t i = 0; i < s->params.size(); i++) {
    if (s->arg_of[i] >= 0 && s->arg_of[i] < num_args) s->arg_kind[s->arg_of[i]] = s->params[i];
  }
  Py_INCREF(autograd);
  Py_INCREF(on_error);
  s->autograd = autograd;
  s->on_error = on_error;
  auto reg = std::make_unique<Registration>();
  reg->state = s;
  reg->kernel = std::make_unique<torch::Library>(
      torch::Library::IMPL, ns, c10::DispatchKey::CompositeExplicitAutograd, __FILE__, __LINE__);
  reg->kernel->impl(name, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Kernel>(s)));
  reg->autograd = std::make_unique<torch::Library>(
      torch::Library::IMPL, ns, c10::DispatchKey::Autograd, __FILE__, __LINE__);
  reg->autograd->impl(name, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Autograd>(s)));
  registrations.push_back(std::move(reg));
  return PyLong_FromSize_t(registrations.size() - 1);
  END_HANDLE_TH_ERRORS
}

// unregister(id): drops the op's kernels (override=True replaces an op).
PyObject* py_unregister(PyObject*, PyObject* args) {
  long long id;
  if (!PyArg_ParseTuple(args, "L", &id)) return nullptr;
  if (id >= 0 && static_cast<size_t>(id) < registrations.size() && registrations[id]) {
    // The Python hooks stay referenced: a graph compiled before the replacement may still
    // hold the old kernel's state through a running call.
    registrations[id]->kernel.reset();
    registrations[id]->autograd.reset();
    for (Slot& slot : slots) {
      if (slot.reg == id) slot.reg = -1;
    }
  }
  Py_RETURN_NONE;
}

// slot(name, fallback) -> slot: the slot of op `name` (made on first use); `fallback` (the op's
// OpOverload) replaces the one kept.
PyObject* py_slot(PyObject*, PyObject* args) {
  const char* name;
  PyObject* fallback;
  if (!PyArg_ParseTuple(args, "sO", &name, &fallback)) return nullptr;
  HANDLE_TH_ERRORS
  auto [it, fresh] = slot_of.try_emplace(name, slots.size());
  if (fresh) slots.emplace_back().name = name;
  Slot& slot = slots[it->second];
  Py_INCREF(fallback);
  Py_XDECREF(slot.fallback);
  slot.fallback = fallback;
  return PyLong_FromSize_t(it->second);
  END_HANDLE_TH_ERRORS
}

// bind(slot, id): `call(slot, ...)` runs registration `id` from now on.
PyObject* py_bind(PyObject*, PyObject* args) {
  long long slot, id;
  if (!PyArg_ParseTuple(args, "LL", &slot, &id)) return nullptr;
  if (slot < 0 || static_cast<size_t>(slot) >= slots.size() || !live(id)) {
    PyErr_Format(PyExc_ValueError, "rivet torch bridge: bind(%lld, %lld): no such slot or live registration", slot, id);
    return nullptr;
  }
  slots[slot].reg = id;
  Py_RETURN_NONE;
}

// binding(slot, dtypes) -> binding: `dtypes` are rivet dtype names, one per op output.
PyObject* py_binding(PyObject*, PyObject* args) {
  long long slot;
  PyObject* dtypes;
  if (!PyArg_ParseTuple(args, "LO!", &slot, &PyTuple_Type, &dtypes)) return nullptr;
  if (slot < 0 || static_cast<size_t>(slot) >= slots.size()) {
    PyErr_Format(PyExc_ValueError, "rivet torch bridge: binding(%lld, ...): no such slot", slot);
    return nullptr;
  }
  HANDLE_TH_ERRORS
  Binding b{static_cast<size_t>(slot), {}};
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(dtypes); i++) {
    const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(dtypes, i));
    c10::ScalarType t;
    if (!name || !parse_dtype(name, &t)) {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "rivet torch bridge: unknown dtype %s", name);
      return nullptr;
    }
    b.dtypes.push_back(t);
  }
  bindings.push_back(std::move(b));
  return PyLong_FromSize_t(bindings.size() - 1);
  END_HANDLE_TH_ERRORS
}

// Raises rivet.DTypeError: output k of the op is `got`, not what its graph was compiled for.
[[noreturn]] void wrong_output(const Binding& b, size_t k, const std::string& got) {
  pybind11::gil_scoped_acquire gil;
  const std::string want = k < b.dtypes.size() ? "a " + dtype_name(b.dtypes[k]) + " tensor"
                                                 : "no output " + std::to_string(k);
  const std::string msg = slots[b.slot].name + ": output " + std::to_string(k) + " is " + got +
      ", but the torch.compile graph calling the op expects " + want + " (" +
      std::to_string(b.dtypes.size()) + " outputs): the op was replaced (override=True) after "
      "the graph was compiled; compile it again (torch._dynamo.reset())";
  PyObject* mod = PyImport_ImportModule("rivet.error");
  PyObject* cls = mod ? PyObject_GetAttrString(mod, "DTypeError") : nullptr;
  Py_XDECREF(mod);
  if (cls) {
    PyErr_SetString(cls, msg.c_str());
    Py_DECREF(cls);
  }
  throw python_error();
}

// The fallback's result checked against the binding's dtypes (a new reference, or throws).
PyObject* checked(const Binding& b, PyObject* r) {
  if (!r) throw python_error();
  const size_t n = b.dtypes.size();
  // What is wrong with output k of `r`, or "" (the words are made before `r` is released).
  auto wrong = [&](PyObject* t) -> std::string {
    if (!THPVariable_Check(t)) return std::string("a ") + Py_TYPE(t)->tp_name;
    return "a " + dtype_name(THPVariable_Unpack(t).scalar_type()) + " tensor";
  };
  std::string got;
  size_t k = 0;
  if (n == 1) {
    if (!THPVariable_Check(r) || THPVariable_Unpack(r).scalar_type() != b.dtypes[0]) got = wrong(r);
  } else if (!PyTuple_Check(r) || static_cast<size_t>(PyTuple_GET_SIZE(r)) != n) {
    got = std::string("a ") + Py_TYPE(r)->tp_name + ", not a tuple of " + std::to_string(n) + " tensors";
  } else {
    for (; k < n; k++) {
      PyObject* t = PyTuple_GET_ITEM(r, static_cast<Py_ssize_t>(k));
      if (!THPVariable_Check(t) || THPVariable_Unpack(t).scalar_type() != b.dtypes[k]) {
        got = wrong(t);
        break;
      }
    }
  }
  if (got.empty()) return r;
  Py_DECREF(r);
  wrong_output(b, k, got);
}

// call(binding, *args): the op's kernel called directly, without torch's dispatcher: what the
// code torch.compile generates calls in place of `torch.ops.ns.op.default(*args)`
// (rivet/_torch_native.py, `compiled_kernel`). Compiled graphs call it below autograd
// (AOTAutograd has taken the gradient apart), as inductor's own kernels are; `args` are the
// schema's arguments. With no live native registration in the slot, the op's OpOverload is
// called instead. Either way the outputs' dtypes are checked against the binding's.
PyObject* py_call(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  HANDLE_TH_ERRORS
  const long long bi = argc < 1 ? -1 : PyLong_AsLongLong(argv[0]);
  if (bi == -1 && PyErr_Occurred()) return nullptr;
  if (bi < 0 || static_cast<size_t>(bi) >= bindings.size()) {
    PyErr_Format(PyExc_ValueError, "rivet torch bridge: call(binding, *args): no binding %lld", bi);
    return nullptr;
  }
  // Copies: the GIL is released while the kernel runs (and the fallback runs Python), and
  // another thread may add bindings or slots meanwhile, moving the vectors' elements.
  const Binding b = bindings[bi];
  const long long reg = slots[b.slot].reg;
  if (!live(reg)) {
    PyObject* fallback = slots[b.slot].fallback;
    Py_INCREF(fallback);  // py_slot may replace it while it runs
    PyObject* r = PyObject_Vectorcall(fallback, argv + 1, static_cast<size_t>(argc - 1), nullptr);
    Py_DECREF(fallback);
    return checked(b, r);
  }
  // Held for the call: the GIL is released while the kernel runs, and another thread may
  // replace the op meanwhile.
  const std::shared_ptr<OpState> keep = registrations[reg]->state;
  const OpState& s = *keep;
  if (argc - 1 != s.num_args) {
    PyErr_Format(PyExc_TypeError, "rivet torch bridge: the op takes %lld arguments, got %zd",
                 static_cast<long long>(s.num_args), argc - 1);
    return nullptr;
  }
  c10::SmallVector<c10::IValue, 8> args(static_cast<size_t>(s.num_args));
  for (int64_t i = 0; i < s.num_args; i++) {
    PyObject* o = argv[i + 1];
    switch (s.arg_kind[i]) {
      case Kind::TensorIn:
        if (!THPVariable_Check(o)) {
          PyErr_Format(PyExc_TypeError, "rivet torch bridge: argument %lld must be a Tensor", static_cast<long long>(i));
          return nullptr;
        }
        args[i] = THPVariable_Unpack(o);
        break;
      case Kind::Int: {
        const long long v = PyLong_AsLongLong(o);
        if (v == -1 && PyErr_Occurred()) return nullptr;
        args[i] = static_cast<int64_t>(v);
        break;
      }
      case Kind::Float: {
        const double v = PyFloat_AsDouble(o);
        if (v == -1.0 && PyErr_Occurred()) return nullptr;
        args[i] = v;
        break;
      }
      case Kind::Bool: args[i] = PyObject_IsTrue(o) == 1; break;
      default: {
        Py_ssize_t len = 0;
        const char* str = PyUnicode_AsUTF8AndSize(o, &len);
        if (!str) return nullptr;
        args[i] = std::string(str, static_cast<size_t>(len));
        break;
      }
    }
  }
  Outs outs = run_kernel(s, args.data());
  for (size_t k = 0; k < outs.size(); k++) {
    if (k >= b.dtypes.size() || outs[k].scalar_type() != b.dtypes[k]) {
      wrong_output(b, k, "a " + dtype_name(outs[k].scalar_type()) + " tensor");
    }
  }
  if (outs.size() != b.dtypes.size()) wrong_output(b, outs.size(), "missing");
  if (outs.size() == 1) return THPVariable_Wrap(std::move(outs[0]));
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(outs.size()));
  if (!tuple) return nullptr;
  for (size_t k = 0; k < outs.size(); k++) {
    PyObject* t = THPVariable_Wrap(std::move(outs[k]));
    if (!t) {
      Py_DECREF(tuple);
      return nullptr;
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(k), t);
  }
  return tuple;
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"init", py_init, METH_VARARGS, "init(call, any_free, last_error, abi_version, max_alloc_bytes): rivet's C ABI entry points and allocation limit"},
    {"register", py_register, METH_VARARGS, "register a rivet op's CPU and Autograd kernels"},
    {"unregister", py_unregister, METH_VARARGS, "drop a registration's kernels"},
    {"slot", py_slot, METH_VARARGS, "slot(name, fallback) -> the op's slot for call"},
    {"bind", py_bind, METH_VARARGS, "bind(slot, id): call(slot, ...) runs registration id"},
    {"binding", py_binding, METH_VARARGS, "binding(slot, dtypes) -> what call takes first"},
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_call)), METH_FASTCALL,
     "call(binding, *args): the op's kernel without the dispatcher (torch.compile's generated code)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "rivet_torch_native", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_rivet_torch_native() { return PyModule_Create(&module); }
