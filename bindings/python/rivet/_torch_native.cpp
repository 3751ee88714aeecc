// rivet ops' kernels in torch's dispatcher, in C++ (rivet/torch.py compiles this file against
// the installed torch on first use and caches the library; docs/torch.md "The native path").
//
// Why: a rivet op registered with Python kernels pays torch's Python dispatch on every call
// (about 14 us eager, 15 us more inside a torch.compile graph); these kernels run no Python on
// the common path:
// - the CompositeExplicitAutograd kernel (every backend key; the fake implementation stays in
//   Python, registered for Meta) allocates the outputs with at::empty from the op's output
//   table, and calls the rivet function through rivet's C ABI (runtime/include/rivet/c_api.h,
//   ABI 1.x) on borrowed DLTensor views of the tensors: inputs read-only, outputs writable;
// - the Autograd kernel redispatches below autograd when no gradient is needed (grad mode off,
//   or no tensor argument requires grad); when one is, it calls the op's Python autograd
//   formula (an autograd.Function in rivet/torch.py), holding the GIL only there.
// Errors: a rivet failure, or a tensor on a device other than the CPU, calls the op's Python
// error hook (which rewords signature violations with the op's name and raises the rivet
// error class of the failure's kind); the Python exception crosses the dispatcher as torch's
// python_error, so callers see the same exception types as on the Python path.
// Invariants: a kernel never reads a tensor it did not check is on the CPU; ops are never
// unregistered while a call runs (an op's state lives until its torch::Library is dropped,
// which rivet/torch.py does only when the op is replaced with override=True).

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/dlpack.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <Python.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <vector>

// The C ABI's value type and entry points (runtime/include/rivet/c_api.h, ABI 1.x: init
// checks the major version before anything is called).
extern "C" {
typedef struct {
  int32_t type_code;
  int32_t pad;
  union {
    int64_t v_int64;
    double v_float64;
    void* v_ptr;
  } value;
} RivetAny;
}
enum { kRivetInt = 1, kRivetFloat = 2, kRivetBool = 3, kRivetStr = 4, kRivetTensor = 5, kRivetTensorRO = 6 };
typedef int32_t (*CallFn)(void*, const RivetAny*, int32_t, RivetAny*);
typedef int32_t (*AnyFreeFn)(RivetAny*);
typedef const char* (*LastErrorFn)(const char**);
typedef int32_t (*VersionFn)();

namespace {

struct Api {
  CallFn call = nullptr;
  AnyFreeFn any_free = nullptr;
  LastErrorFn last_error = nullptr;
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
  std::vector<OutSpec> outs;   // allocated outputs, in order
  int64_t num_args = 0;        // the op's schema arguments
  PyObject* autograd = nullptr; // Python: autograd(*args) -> output(s)
  PyObject* on_error = nullptr; // Python: on_error(kind, message, *args) raises
};

// rivet's dtype names (the signature's) to torch's.
bool parse_dtype(const std::string& name, c10::ScalarType* out) {
  using S = c10::ScalarType;
  static const std::pair<const char*, S> table[] = {
      {"float32", S::Float}, {"float64", S::Double}, {"float16", S::Half}, {"bfloat16", S::BFloat16},
      {"int32", S::Int},     {"int64", S::Long},     {"int16", S::Short},  {"int8", S::Char},
      {"uint8", S::Byte},    {"bool", S::Bool}};
  for (const auto& [n, t] : table) {
    if (name == n) {
      *out = t;
      return true;
    }
  }
  return false;
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

class Kernel final : public c10::OperatorKernel {
 public:
  explicit Kernel(std::shared_ptr<OpState> s) : s_(std::move(s)) {}

  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const OpState& s = *s_;
    auto args = torch::jit::last(*stack, s.num_args);
    for (int64_t i = 0; i < s.num_args; i++) {
      if (args[i].isTensor() && args[i].toTensor().device().type() != c10::DeviceType::CPU) {
        fail(s, "DeviceError", "", args.data());
      }
    }
    std::vector<at::Tensor> outs;
    outs.reserve(s.outs.size());
    for (size_t k = 0; k < s.outs.size(); k++) {
      const OutSpec& o = s.outs[k];
      std::vector<int64_t> shape;
      shape.reserve(o.dims.size());
      for (auto [a, d] : o.dims) {
        if (a < 0) {
          shape.push_back(d);
          continue;
        }
        const at::Tensor& t = args[a].toTensor();
        // A wrong rank is the signature check's to word (the hook runs it).
        if (d >= t.dim()) fail(s, "ShapeError", "", args.data());
        shape.push_back(t.size(d));
      }
      try {
        outs.push_back(at::empty(shape, at::TensorOptions().dtype(o.dtype)));
      } catch (const c10::Error& e) {
        fail(s, "MemoryError", "cannot allocate output " + std::to_string(k) + " of shape " +
                 c10::str(c10::IntArrayRef(shape)) + ": " + e.what_without_backtrace(), args.data());
      }
    }
    const size_t n = s.params.size();
    std::vector<DLTensor> dl(n);
    std::vector<RivetAny> call(n);
    size_t next_out = 0;
    for (size_t i = 0; i < n; i++) {
      RivetAny& v = call[i];
      v.pad = 0;
      const Kind kind = s.params[i];
      if (kind == Kind::TensorIn || kind == Kind::TensorOut) {
        const at::Tensor& t = kind == Kind::TensorOut ? outs[next_out++] : args[s.arg_of[i]].toTensor();
        DLTensor& d = dl[i];
        if (!to_dl_dtype(t.scalar_type(), &d.dtype)) {
          fail(s, "DTypeError", std::string("unsupported dtype ") + c10::toString(t.scalar_type()), args.data());
        }
        d.data = t.data_ptr();
        d.device = {kDLCPU, 0};
        d.ndim = static_cast<int32_t>(t.dim());
        d.shape = const_cast<int64_t*>(t.sizes().data());
        d.strides = const_cast<int64_t*>(t.strides().data());
        d.byte_offset = 0;
        v.type_code = kind == Kind::TensorOut ? kRivetTensor : kRivetTensorRO;
        v.value.v_ptr = &d;
        continue;
      }
      const c10::IValue& a = args[s.arg_of[i]];
      switch (kind) {
        case Kind::Int: v.type_code = kRivetInt; v.value.v_int64 = a.toInt(); break;
        case Kind::Float: v.type_code = kRivetFloat; v.value.v_float64 = a.toDouble(); break;
        case Kind::Bool: v.type_code = kRivetBool; v.value.v_int64 = a.toBool() ? 1 : 0; break;
        default: v.type_code = kRivetStr; v.value.v_ptr = const_cast<char*>(a.toStringRef().c_str()); break;
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
      fail(s, kind ? kind : "Error", msg ? msg : "", args.data());
    }
    api.any_free(&result);
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

PyObject* py_init(PyObject*, PyObject* args) {
  unsigned long long call, any_free, last_error, version;
  if (!PyArg_ParseTuple(args, "KKKK", &call, &any_free, &last_error, &version)) return nullptr;
  const int32_t v = reinterpret_cast<VersionFn>(version)();
  if ((v >> 16) != 1) {
    PyErr_Format(PyExc_ImportError, "rivet's C ABI is version %d.%d; this torch bridge needs 1.x", v >> 16, v & 0xffff);
    return nullptr;
  }
  api.call = reinterpret_cast<CallFn>(call);
  api.any_free = reinterpret_cast<AnyFreeFn>(any_free);
  api.last_error = reinterpret_cast<LastErrorFn>(last_error);
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
  }
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"init", py_init, METH_VARARGS, "init(call, any_free, last_error, abi_version): rivet's C ABI entry points"},
    {"register", py_register, METH_VARARGS, "register a rivet op's CPU and Autograd kernels"},
    {"unregister", py_unregister, METH_VARARGS, "drop a registration's kernels"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "rivet_torch_native", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_rivet_torch_native() { return PyModule_Create(&module); }
