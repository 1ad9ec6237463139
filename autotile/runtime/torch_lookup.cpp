// The compiled lookup of repeated calls on torch tensors (autotile/runtime/torch_lookup.py builds and loads it).
//
// A repeated `autotile.matmul` or `matvec` call on torch tensors is found by its signature: each operand's
// sizes, strides, dtype and device, `out`'s where given, and the precision setting. Read in Python, that
// signature costs a dozen reads through torch's Python bindings (1.4-4.2 us a call on H100 hosts); here it is
// read from the tensors themselves (about 0.2 us). An entry holds what the Python path memoized for the
// same signature: its repeated call (a Python callable, which launches a generated kernel), and where
// cuBLAS won and torch's own operator computes the same thing, that operator, called here through ATen
// without a trip through Python. Anything this table does not know returns None: the Python path decides.
//
// Only exact torch.Tensor and nn.Parameter objects on CUDA devices are read (a subclass may override
// __torch_function__); a call that autograd must see, or made while a torch function mode is active, goes
// back to Python; so does a stream named by the caller. All of it runs with the GIL held, but for the ATen
// operator, which runs without it, as torch's own Python binding does.

#include <Python.h>

#include <ATen/Context.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mv.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <unordered_map>

#ifndef AUTOTILE_TORCH_VERSION  // major * 100 + minor, defined by the build
#define AUTOTILE_TORCH_VERSION 0
#endif

namespace {

constexpr int kMaxDims = 8;  // operands of more dimensions are left to Python
constexpr int kPerOperand = 2 * kMaxDims + 3;
constexpr int kKeyLength = 2 + 3 * kPerOperand;

// What an entry runs where no Python is needed: torch's operator (see torch_lookup.py's OPS).
enum Op : int { kCallOnly = 0, kMm = 1, kBmm = 2, kMv = 3, kMatmul = 4 };
// torch's switches that, when on, make its operator compute something else (torch_lookup.py's GUARDS).
enum Guard : int { kNoGuard = 0, kTf32 = 1, kFp16Accumulation = 2 };

struct Key {
  int length = 0;
  std::array<int64_t, kKeyLength> values{};
  void push(int64_t v) { values[length++] = v; }
  bool operator==(const Key& other) const {
    return length == other.length && std::memcmp(values.data(), other.values.data(), length * sizeof(int64_t)) == 0;
  }
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
    for (int i = 0; i < key.length; ++i) {
      h ^= static_cast<uint64_t>(key.values[i]);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

struct Entry {
  PyObject* call;  // the Python path's repeated call: (A, B, out, stream) -> result (a strong reference)
  int op;
  int guard;
};

std::unordered_map<Key, Entry, KeyHash> table;
PyObject* tensor_types[2] = {nullptr, nullptr};  // torch.Tensor, torch.nn.Parameter (strong references)
PyObject* settings[8] = {};                       // the precision settings' names, a key's code is the index
int setting_count = 0;

int setting_code(PyObject* name) {
  for (int i = 0; i < setting_count; ++i) {
    if (settings[i] == name) return i;
  }
  if (!PyUnicode_Check(name)) return -1;
  for (int i = 0; i < setting_count; ++i) {
    int same = PyUnicode_Compare(settings[i], name);
    if (same == 0) return i;
    if (same == -1 && PyErr_Occurred()) PyErr_Clear();
  }
  return -1;
}

// One operand read from the tensor itself; false where it is not one this table serves.
bool push_tensor(Key& key, PyObject* obj, bool& needs_grad) {
  PyTypeObject* type = Py_TYPE(obj);
  if (reinterpret_cast<PyObject*>(type) != tensor_types[0] && reinterpret_cast<PyObject*>(type) != tensor_types[1]) {
    return false;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  const int64_t dims = t.dim();
  if (dims > kMaxDims || !t.is_cuda()) return false;
  key.push(dims);
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  for (int64_t i = 0; i < dims; ++i) key.push(sizes[i]);
  for (int64_t i = 0; i < dims; ++i) key.push(strides[i]);
  key.push(static_cast<int64_t>(t.scalar_type()));
  key.push(t.get_device());
  needs_grad = needs_grad || t.requires_grad();
  return true;
}

// One operand read from the Python path's signature: (shape, strides, dtype, device), as
// `TorchFramework.signature` makes it.
bool push_signature(Key& key, PyObject* shape, PyObject* strides, PyObject* dtype, PyObject* device) {
  if (!PyTuple_Check(shape) || !PyTuple_Check(strides) || !THPDtype_Check(dtype) || !PyLong_Check(device)) {
    return false;
  }
  const Py_ssize_t dims = PyTuple_GET_SIZE(shape);
  if (dims > kMaxDims || PyTuple_GET_SIZE(strides) != dims) return false;
  key.push(dims);
  for (PyObject* tuple : {shape, strides}) {
    for (Py_ssize_t i = 0; i < dims; ++i) {
      int64_t v = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
      if (v == -1 && PyErr_Occurred()) return false;
      key.push(v);
    }
  }
  key.push(static_cast<int64_t>(reinterpret_cast<THPDtype*>(dtype)->scalar_type));
  int64_t index = PyLong_AsLongLong(device);
  if (index == -1 && PyErr_Occurred()) return false;
  key.push(index);
  return true;
}

// Whether torch's switches now make `guard`'s operator compute something other than autotile's call would.
bool arithmetic_changed(int guard) {
  try {
    if (guard == kTf32) return at::globalContext().allowTF32CuBLAS();
#if AUTOTILE_TORCH_VERSION >= 207
    if (guard == kFp16Accumulation) return at::globalContext().allowFP16AccumulationCuBLAS();
#else
    if (guard == kFp16Accumulation) return false;  // the switch came with torch 2.7
#endif
  } catch (...) {  // torch 2.9+ refuses the legacy TF32 read once its fp32_precision API set TF32
    return true;
  }
  return false;
}

// torch's operator for `op` on (a, b), into `out` where it is defined; false where it threw (then the
// Python path runs the call and raises what torch raises).
bool run_operator(int op, const at::Tensor& a, const at::Tensor& b, const at::Tensor* out, at::Tensor& result) {
  bool ok = true;
  Py_BEGIN_ALLOW_THREADS
  try {
    if (out != nullptr) {
      at::Tensor o = *out;
      switch (op) {
        case kMm: at::mm_out(o, a, b); break;
        case kBmm: at::bmm_out(o, a, b); break;
        case kMv: at::mv_out(o, a, b); break;
        default: at::matmul_out(o, a, b); break;
      }
    } else {
      switch (op) {
        case kMm: result = at::mm(a, b); break;
        case kBmm: result = at::bmm(a, b); break;
        case kMv: result = at::mv(a, b); break;
        default: result = at::matmul(a, b); break;
      }
    }
  } catch (...) {
    ok = false;
  }
  Py_END_ALLOW_THREADS
  return ok;
}

PyObject* init(PyObject*, PyObject* args) {
  PyObject *types, *names;
  if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &types, &PyTuple_Type, &names)) return nullptr;
  if (PyTuple_GET_SIZE(types) != 2 || PyTuple_GET_SIZE(names) > 8) {
    PyErr_SetString(PyExc_ValueError, "init takes (Tensor, Parameter) and at most 8 settings");
    return nullptr;
  }
  for (int i = 0; i < 2; ++i) {
    Py_XDECREF(tensor_types[i]);
    tensor_types[i] = PyTuple_GET_ITEM(types, i);
    Py_INCREF(tensor_types[i]);
  }
  for (int i = 0; i < setting_count; ++i) Py_DECREF(settings[i]);
  setting_count = static_cast<int>(PyTuple_GET_SIZE(names));
  for (int i = 0; i < setting_count; ++i) {
    settings[i] = PyTuple_GET_ITEM(names, i);
    Py_INCREF(settings[i]);
  }
  Py_RETURN_NONE;
}

// register(kernel, pair, out_signature, setting, call, op, guard): `pair` is `TorchFramework.read_pair`'s
// flat tuple (A's shape, strides, dtype, device, then B's, then whether autograd must see the call), as the
// Python path keys the call; `out_signature` is out's (shape, strides, dtype, device), or None. Returns
// whether the entry was taken (an operand of more than kMaxDims dimensions is not).
PyObject* register_call(PyObject*, PyObject* args) {
  int kernel, op, guard;
  PyObject *pair, *out, *setting, *call;
  if (!PyArg_ParseTuple(args, "iO!OOOii", &kernel, &PyTuple_Type, &pair, &out, &setting, &call, &op, &guard)) {
    return nullptr;
  }
  if (!PyCallable_Check(call) || PyTuple_GET_SIZE(pair) != 9 || op < kCallOnly || op > kMatmul || guard < kNoGuard ||
      guard > kFp16Accumulation) {
    PyErr_SetString(PyExc_ValueError, "register takes a callable, a pair of 9 and a known op and guard");
    return nullptr;
  }
  int code = setting_code(setting);
  if (code < 0) Py_RETURN_FALSE;
  Key key;
  key.push(kernel);
  key.push(code);
  auto item = [pair](int i) { return PyTuple_GET_ITEM(pair, i); };
  if (!push_signature(key, item(0), item(1), item(2), item(3)) ||
      !push_signature(key, item(4), item(5), item(6), item(7))) {
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  if (out == Py_None) {
    key.push(-1);
  } else if (!PyTuple_Check(out) || PyTuple_GET_SIZE(out) != 4 ||
             !push_signature(key, PyTuple_GET_ITEM(out, 0), PyTuple_GET_ITEM(out, 1), PyTuple_GET_ITEM(out, 2),
                             PyTuple_GET_ITEM(out, 3))) {
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  Py_INCREF(call);
  auto found = table.find(key);
  if (found != table.end()) {
    PyObject* old = found->second.call;
    found->second = Entry{call, op, guard};
    Py_DECREF(old);
  } else {
    table.emplace(key, Entry{call, op, guard});
  }
  Py_RETURN_TRUE;
}

// call(kernel, A, B, out, setting, stream): the call's result, or None where the table does not know it.
PyObject* call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "call takes (kernel, A, B, out, setting, stream)");
    return nullptr;
  }
  if (tensor_types[0] == nullptr) Py_RETURN_NONE;
  const long kernel = PyLong_AsLong(args[0]);
  if (kernel == -1 && PyErr_Occurred()) return nullptr;
  const int code = setting_code(args[4]);
  if (code < 0) Py_RETURN_NONE;  // not a setting's name: the Python path says so
  Key key;
  key.push(kernel);
  key.push(code);
  bool needs_grad = false;
  PyObject* out = args[3];
  if (!push_tensor(key, args[1], needs_grad) || !push_tensor(key, args[2], needs_grad)) Py_RETURN_NONE;
  if (out == Py_None) {
    key.push(-1);
  } else {
    bool ignored = false;
    if (!push_tensor(key, out, ignored)) Py_RETURN_NONE;
  }
  if (needs_grad && c10::GradMode::is_enabled()) Py_RETURN_NONE;  // the differentiable operator's call
  auto found = table.find(key);
  if (found == table.end()) Py_RETURN_NONE;
  const Entry entry = found->second;
  Py_INCREF(entry.call);  // the entry may be replaced or dropped while the operator runs without the GIL
  if (entry.op != kCallOnly && args[5] == Py_None && !at::impl::torch_function_mode_enabled() &&
      !arithmetic_changed(entry.guard)) {
    const at::Tensor& a = THPVariable_Unpack(args[1]);
    const at::Tensor& b = THPVariable_Unpack(args[2]);
    at::Tensor result;
    const at::Tensor* out_tensor = out == Py_None ? nullptr : &THPVariable_Unpack(out);
    if (run_operator(entry.op, a, b, out_tensor, result)) {
      Py_DECREF(entry.call);
      if (out_tensor != nullptr) {
        Py_INCREF(out);
        return out;
      }
      return THPVariable_Wrap(std::move(result));
    }
  }
  PyObject* call_args[4] = {args[1], args[2], out, args[5]};
  PyObject* result = PyObject_Vectorcall(entry.call, call_args, 4, nullptr);
  Py_DECREF(entry.call);
  return result;
}

PyObject* clear(PyObject*, PyObject*) {
  std::unordered_map<Key, Entry, KeyHash> dropped;
  dropped.swap(table);  // the references go after the table is empty: a finalizer may call in again
  for (auto& item : dropped) Py_DECREF(item.second.call);
  Py_RETURN_NONE;
}

PyObject* size(PyObject*, PyObject*) { return PyLong_FromSize_t(table.size()); }

PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "init((Tensor, Parameter), settings): the types and settings the keys read"},
    {"register", register_call, METH_VARARGS, "register(kernel, pair, out_signature, setting, call, op, guard)"},
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(call)), METH_FASTCALL,
     "call(kernel, A, B, out, setting, stream): the result, or None"},
    {"clear", clear, METH_NOARGS, "drop every entry"},
    {"size", size, METH_NOARGS, "the number of entries"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "autotile_torch_lookup", "autotile's compiled lookup of repeated calls", -1,
                      methods};

}  // namespace

PyMODINIT_FUNC PyInit_autotile_torch_lookup(void) { return PyModule_Create(&module); }
