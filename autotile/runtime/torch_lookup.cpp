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
// Where cuBLAS won, an entry may hold autotile's own cuBLAS call, packed (`CublasCall.packed`): the routine's
// address and arguments, called here on the compiled lookup's cuBLAS handle (its stream and that stream's
// workspace set here, with the GIL held), on torch's current stream; torch's operator is then not needed.
// Where a generated kernel won, an entry may also hold its launch, packed (`KernelRunner.packed_launch`):
// the kernel's driver handle, grid, block, shared memory and parameter image, whose first three slots take
// the operands' and the output's addresses per call. Such a call allocates its output through ATen (torch's
// caching allocator, on the current stream), writes three addresses and calls cuLaunchKernel on torch's
// current stream: no Python runs. Anything that launch cannot do (another current device, a failed launch)
// goes to the entry's Python call.
//
// Only exact torch.Tensor and nn.Parameter objects on CUDA devices are read (a subclass may override
// __torch_function__); a call that autograd must see goes back to Python, and so does a stream named by the
// caller; torch's operator is not called while a torch function mode is active (a packed launch or cuBLAS call,
// no torch operator, still runs). All of it runs with the GIL held, but for the ATen operator, which runs
// without it, as torch's own Python binding does.

#include <Python.h>

#include <ATen/Context.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mv.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

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

// The CUDA driver's entry points a packed launch calls, found in the process's libcuda (loaded by then:
// the kernel was compiled and launched through it). Declared here, so the build needs no CUDA headers.
using LaunchKernel = int (*)(void* function, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                             unsigned block_y, unsigned block_z, unsigned shared_bytes, void* stream, void** params,
                             void** extra);
using MemsetAsync = int (*)(uint64_t address, unsigned char value, size_t bytes, void* stream);
LaunchKernel launch_kernel = nullptr;
MemsetAsync memset_async = nullptr;

bool driver_found() {
  static bool tried = false;
  if (!tried) {
    tried = true;
    if (void* cuda = dlopen("libcuda.so.1", RTLD_LAZY)) {
      launch_kernel = reinterpret_cast<LaunchKernel>(dlsym(cuda, "cuLaunchKernel"));
      memset_async = reinterpret_cast<MemsetAsync>(dlsym(cuda, "cuMemsetD8Async"));
    }
  }
  return launch_kernel != nullptr && memset_async != nullptr;
}

// What a packed launch or cuBLAS call writes: the output it allocates where the call gives none, on its device.
struct Output {
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::ScalarType::Float;
  int device = 0;
};

// A generated kernel's launch for one signature: everything but three addresses and the stream, fixed.
struct Launch {
  void* function = nullptr;  // CUfunction, owned by the module the entry's Python call keeps alive
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shared_bytes = 0;
  std::unique_ptr<uint64_t[]> image;  // the parameters' values, 8-byte aligned (slots of 8 bytes)
  std::vector<void*> params;          // the driver's array of pointers into `image`, one per parameter
  uint64_t* slot_a = nullptr;         // where the first operand's address goes (the second, when swapped)
  uint64_t* slot_b = nullptr;
  uint64_t* slot_out = nullptr;
  size_t zero_bytes = 0;  // a split-K kernel that adds into its output: the bytes zeroed before it runs
  Output output;
};

// ---- cuBLAS called on the compiled lookup's own handle ----

// A routine called with its arguments held as 64-bit words, each converted to the routine's declared type.
template <typename T>
T as_argument(uint64_t word) {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<T>(static_cast<uintptr_t>(word));
  } else {
    return static_cast<T>(static_cast<int64_t>(word));  // two's complement: -1 (CUBLAS_GEMM_DEFAULT) stays -1
  }
}

template <typename... Args, size_t... I>
int invoke_words(void* routine, const uint64_t* words, std::index_sequence<I...>) {
  return reinterpret_cast<int (*)(Args...)>(routine)(as_argument<Args>(words[I])...);
}

template <typename... Args>
int invoke(void* routine, const uint64_t* words) {
  return invoke_words<Args...>(routine, words, std::index_sequence_for<Args...>{});
}

using P = void*;
using I = int;
using L = long long;
using Invoker = int (*)(void*, const uint64_t*);

// The signatures autotile/runtime/cublas.py calls (its _SIGNATURES, handle first), by their kinds' letters.
const std::pair<const char*, Invoker> kBlasSignatures[] = {
    {"PIIIIIPPIPIPPI", invoke<P, I, I, I, I, I, P, P, I, P, I, P, P, I>},                      // S/Dgemm
    {"PIIIIIPPILPILPPILI", invoke<P, I, I, I, I, I, P, P, I, L, P, I, L, P, P, I, L, I>},  // S/DgemmStridedBatched
    {"PIIIPPIPIPPI", invoke<P, I, I, I, P, P, I, P, I, P, P, I>},                            // S/Dgemv
    {"PIIIIIPPIIPIIPPIIII", invoke<P, I, I, I, I, I, P, P, I, I, P, I, I, P, P, I, I, I, I>},  // GemmEx
    // GemmStridedBatchedEx
    {"PIIIIIPPIILPIILPPIILIII", invoke<P, I, I, I, I, I, P, P, I, I, L, P, I, I, L, P, P, I, I, L, I, I, I>},
};

using SetStream = int (*)(void* handle, void* stream);
using SetWorkspace = int (*)(void* handle, void* workspace, size_t bytes);

// One handle's state: the stream it was last set to (its workspace with it), the workspace of each stream.
struct HandleState {
  void* stream = nullptr;
  bool set = false;
  std::unordered_map<void*, std::pair<uint64_t, uint64_t>> workspaces;  // stream -> (pointer, bytes)
};
std::unordered_map<uint64_t, HandleState> handles;  // by the handle's value
PyObject* workspace_of = nullptr;  // cublas.table_workspace(device, stream) -> (pointer, bytes)

// A cuBLAS pick's call for one signature: everything but three addresses and the stream, fixed.
struct BlasCall {
  void* routine = nullptr;
  Invoker invoker = nullptr;
  std::vector<uint64_t> words;  // the routine's arguments, handle first
  int first = 0, second = 0, out = 0;  // the argument indices of cuBLAS's two operands and the output
  bool a_first = true;  // the call's A is cuBLAS's first operand (else its B)
  SetStream set_stream = nullptr;
  SetWorkspace set_workspace = nullptr;
  Output output;
};

struct Entry {
  PyObject* call;  // the Python path's repeated call: (A, B, out, stream) -> result (a strong reference)
  int op;
  int guard;
  std::shared_ptr<Launch> launch;  // a generated kernel's packed launch, or null
  std::shared_ptr<BlasCall> blas;  // a cuBLAS pick's packed call, or null
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
  PyObject *types, *names, *workspace = Py_None;
  if (!PyArg_ParseTuple(args, "O!O!|O", &PyTuple_Type, &types, &PyTuple_Type, &names, &workspace)) return nullptr;
  if (workspace != Py_None) {
    Py_INCREF(workspace);
    Py_XSETREF(workspace_of, workspace);
  }
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

// `sizes` (a tuple of ints), `dtype` (a torch.dtype) and `device` into `output`; false, with a Python error set,
// where a size is not a non-negative int.
bool read_output(PyObject* sizes, PyObject* dtype, int device, Output& output) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sizes); ++i) {
    const long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(sizes, i));
    if (size < 0) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a negative output size");
      return false;
    }
    output.sizes.push_back(size);
  }
  output.dtype = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
  output.device = device;
  return true;
}

// torch's current stream on `output`'s device (null: the legacy default stream), where that device is current
// (a kernel and a cuBLAS handle belong to their device); false where it is not. May throw (torch without CUDA).
bool current_stream(const Output& output, void*& stream) {
  const c10::impl::DeviceGuardImplInterface* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  const c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(output.device));
  if (cuda->getDevice() != device) return false;
  stream = cuda->getStream(device).native_handle();
  return true;
}

// The call's output: `out_obj`'s tensor, or a new one (torch's caching allocator, current stream) in `result`.
const at::Tensor& output_tensor(const Output& output, PyObject* out_obj, at::Tensor& result) {
  if (out_obj != Py_None) return THPVariable_Unpack(out_obj);
  const c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(output.device));
  result = at::empty(output.sizes, at::TensorOptions().dtype(output.dtype).device(device));
  return result;
}

// What the call returns: `out_obj` where given, else the new tensor.
PyObject* returned(PyObject* out_obj, at::Tensor&& result) {
  if (out_obj != Py_None) {
    Py_INCREF(out_obj);
    return out_obj;
  }
  return THPVariable_Wrap(std::move(result));
}

// A packed launch from its Python description (`torch_lookup.py`'s `_launch_tuple`): (function, grid, block,
// shared bytes, image, offsets, swapped, zero bytes, out's sizes, out's dtype, device). Null, with a Python
// error set, where the description is malformed; null without one where the driver was not found.
std::shared_ptr<Launch> packed_launch(PyObject* description) {
  unsigned long long function;
  unsigned gx, gy, gz, bx, by, bz, shared_bytes;
  Py_buffer image;
  PyObject *offsets, *out_sizes, *dtype;
  int swapped, device;
  unsigned long long zero_bytes;
  if (!PyArg_ParseTuple(description, "K(III)(III)Iy*O!pKO!O!i", &function, &gx, &gy, &gz, &bx, &by, &bz,
                        &shared_bytes, &image, &PyTuple_Type, &offsets, &swapped, &zero_bytes, &PyTuple_Type,
                        &out_sizes, &THPDtypeType, &dtype, &device)) {
    return nullptr;
  }
  auto launch = std::make_shared<Launch>();
  const Py_ssize_t words = (image.len + 7) / 8;
  const Py_ssize_t count = PyTuple_GET_SIZE(offsets);
  bool ok = count >= 3 && image.len % 8 == 0;
  if (ok) {
    launch->image.reset(new uint64_t[words]());
    std::memcpy(launch->image.get(), image.buf, image.len);
  }
  PyBuffer_Release(&image);
  for (Py_ssize_t i = 0; ok && i < count; ++i) {
    const long long offset = PyLong_AsLongLong(PyTuple_GET_ITEM(offsets, i));
    ok = offset >= 0 && offset % 8 == 0 && offset / 8 < words;  // 8-byte slots inside the image
    if (ok) launch->params.push_back(launch->image.get() + offset / 8);
  }
  ok = ok && read_output(out_sizes, dtype, device, launch->output);
  if (!ok) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a packed launch's image or offsets are malformed");
    return nullptr;
  }
  if (!driver_found()) return nullptr;
  launch->function = reinterpret_cast<void*>(static_cast<uintptr_t>(function));
  launch->grid[0] = gx, launch->grid[1] = gy, launch->grid[2] = gz;
  launch->block[0] = bx, launch->block[1] = by, launch->block[2] = bz;
  launch->shared_bytes = shared_bytes;
  auto slot = [&launch](int i) { return static_cast<uint64_t*>(launch->params[i]); };
  launch->slot_a = slot(swapped ? 1 : 0);
  launch->slot_b = slot(swapped ? 0 : 1);
  launch->slot_out = slot(2);
  launch->zero_bytes = static_cast<size_t>(zero_bytes);
  return launch;
}

// The entry's packed launch on (a, b, out): the output (`out`, or a new tensor), or nullptr where it could
// not launch (the caller then runs the entry's Python call, which launches or raises as the Python path does).
PyObject* run_launch(Launch& launch, PyObject* a_obj, PyObject* b_obj, PyObject* out_obj) {
  try {
    void* stream = nullptr;
    if (!current_stream(launch.output, stream)) return nullptr;
    at::Tensor result;
    const at::Tensor& out = output_tensor(launch.output, out_obj, result);
    *launch.slot_a = reinterpret_cast<uintptr_t>(THPVariable_Unpack(a_obj).const_data_ptr());
    *launch.slot_b = reinterpret_cast<uintptr_t>(THPVariable_Unpack(b_obj).const_data_ptr());
    *launch.slot_out = reinterpret_cast<uintptr_t>(out.mutable_data_ptr());
    if (launch.zero_bytes != 0 && memset_async(*launch.slot_out, 0, launch.zero_bytes, stream) != 0) return nullptr;
    if (launch_kernel(launch.function, launch.grid[0], launch.grid[1], launch.grid[2], launch.block[0],
                      launch.block[1], launch.block[2], launch.shared_bytes, stream, launch.params.data(),
                      nullptr) != 0) {
      return nullptr;
    }
    return returned(out_obj, std::move(result));
  } catch (...) {
    return nullptr;
  }
}

// A packed cuBLAS call from its Python description (`torch_lookup.py`'s `_blas_tuple`): (routine, kinds,
// words, first, second, out, a_first, set_stream, set_workspace, out's sizes, out's dtype, device). Null, with
// a Python error set, where it is malformed or of a signature not known here.
std::shared_ptr<BlasCall> packed_blas(PyObject* description) {
  unsigned long long routine, set_stream, set_workspace;
  const char* kinds;
  PyObject *words, *out_sizes, *dtype;
  int first, second, out, a_first, device;
  if (!PyArg_ParseTuple(description, "KsO!iiipKKO!O!i", &routine, &kinds, &PyTuple_Type, &words, &first, &second,
                        &out, &a_first, &set_stream, &set_workspace, &PyTuple_Type, &out_sizes, &THPDtypeType, &dtype,
                        &device)) {
    return nullptr;
  }
  auto blas = std::make_shared<BlasCall>();
  for (const auto& known : kBlasSignatures) {
    if (std::strcmp(known.first, kinds) == 0) blas->invoker = known.second;
  }
  const Py_ssize_t count = PyTuple_GET_SIZE(words);
  if (blas->invoker == nullptr || count != static_cast<Py_ssize_t>(std::strlen(kinds)) || first <= 0 ||
      second <= 0 || out <= 0 || first >= count || second >= count || out >= count) {
    PyErr_Format(PyExc_ValueError, "a packed cuBLAS call of kinds %s and %zd words is not one this table calls",
                 kinds, count);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < count; ++i) {
    const unsigned long long word = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(words, i));
    if (PyErr_Occurred()) return nullptr;
    blas->words.push_back(word);
  }
  if (!read_output(out_sizes, dtype, device, blas->output)) return nullptr;
  blas->routine = reinterpret_cast<void*>(static_cast<uintptr_t>(routine));
  blas->first = first, blas->second = second, blas->out = out, blas->a_first = a_first;
  blas->set_stream = reinterpret_cast<SetStream>(static_cast<uintptr_t>(set_stream));
  blas->set_workspace = reinterpret_cast<SetWorkspace>(static_cast<uintptr_t>(set_workspace));
  return blas;
}

// The handle `blas` calls on, pointed at `stream` and that stream's workspace; false where the workspace cannot
// be had (a stream first met during a CUDA-graph capture: the Python call then runs, as it does there).
bool use_stream(BlasCall& blas, void* stream) {
  HandleState& state = handles[blas.words[0]];
  if (state.set && state.stream == stream) return true;
  auto found = state.workspaces.find(stream);
  if (found == state.workspaces.end()) {
    if (workspace_of == nullptr) return false;
    PyObject* got = PyObject_CallFunction(workspace_of, "iK", blas.output.device,
                                          static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(stream)));
    unsigned long long pointer = 0, bytes = 0;
    const bool ok = got != nullptr && PyArg_ParseTuple(got, "KK", &pointer, &bytes);
    Py_XDECREF(got);
    if (!ok) {
      PyErr_Clear();
      return false;
    }
    if (bytes == 0) return false;  // capturing: nothing may be allocated
    found = state.workspaces.emplace(stream, std::make_pair(pointer, bytes)).first;
  }
  void* handle = reinterpret_cast<void*>(static_cast<uintptr_t>(blas.words[0]));
  state.set = false;
  if (blas.set_stream(handle, stream) != 0 ||
      blas.set_workspace(handle, reinterpret_cast<void*>(static_cast<uintptr_t>(found->second.first)),
                         static_cast<size_t>(found->second.second)) != 0) {
    return false;
  }
  state.stream = stream;
  state.set = true;
  return true;
}

// The entry's cuBLAS call on (a, b, out): the output, or nullptr where it could not call (the entry's Python
// call then runs, which calls or raises as the Python path does).
PyObject* run_blas(BlasCall& blas, PyObject* a_obj, PyObject* b_obj, PyObject* out_obj) {
  try {
    void* stream = nullptr;
    if (!current_stream(blas.output, stream) || !use_stream(blas, stream)) return nullptr;
    at::Tensor result;
    const at::Tensor& out = output_tensor(blas.output, out_obj, result);
    const uint64_t a_ptr = reinterpret_cast<uintptr_t>(THPVariable_Unpack(a_obj).const_data_ptr());
    const uint64_t b_ptr = reinterpret_cast<uintptr_t>(THPVariable_Unpack(b_obj).const_data_ptr());
    blas.words[blas.first] = blas.a_first ? a_ptr : b_ptr;
    blas.words[blas.second] = blas.a_first ? b_ptr : a_ptr;
    blas.words[blas.out] = reinterpret_cast<uintptr_t>(out.mutable_data_ptr());
    if (blas.invoker(blas.routine, blas.words.data()) != 0) return nullptr;
    return returned(out_obj, std::move(result));
  } catch (...) {
    return nullptr;
  }
}

// register(kernel, pair, out_signature, setting, call, op, guard, launch=None): `pair` is
// `TorchFramework.read_pair`'s flat tuple (A's shape, strides, dtype, device, then B's, then whether autograd
// must see the call), as the Python path keys the call; `out_signature` is out's (shape, strides, dtype,
// device), or None; `launch` a generated kernel's packed launch (`packed_launch`), or None. Returns whether
// the entry was taken (an operand of more than kMaxDims dimensions is not).
PyObject* register_call(PyObject*, PyObject* args) {
  int kernel, op, guard;
  PyObject *pair, *out, *setting, *call, *description = Py_None;
  if (!PyArg_ParseTuple(args, "iO!OOOii|O", &kernel, &PyTuple_Type, &pair, &out, &setting, &call, &op, &guard,
                        &description)) {
    return nullptr;
  }
  std::shared_ptr<Launch> launch;
  std::shared_ptr<BlasCall> blas;
  if (description != Py_None) {  // ("kernel", launch) or ("cublas", call)
    const char* what;
    PyObject* packed;
    if (!PyArg_ParseTuple(description, "sO!", &what, &PyTuple_Type, &packed)) return nullptr;
    if (std::strcmp(what, "cublas") == 0) {
      blas = packed_blas(packed);
      if (blas == nullptr) return nullptr;
    } else {
      launch = packed_launch(packed);
      if (launch == nullptr && PyErr_Occurred()) return nullptr;
    }
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
    found->second = Entry{call, op, guard, std::move(launch), std::move(blas)};
    Py_DECREF(old);
  } else {
    table.emplace(key, Entry{call, op, guard, std::move(launch), std::move(blas)});
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
  const Entry entry = found->second;  // the launch's shared_ptr keeps it alive if the entry is replaced
  if (entry.launch != nullptr && args[5] == Py_None) {
    PyObject* result = run_launch(*entry.launch, args[1], args[2], out);
    if (result != nullptr) return result;
  }
  if (entry.blas != nullptr && args[5] == Py_None) {
    PyObject* result = run_blas(*entry.blas, args[1], args[2], out);
    if (result != nullptr) return result;
  }
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

PyObject* launches(PyObject*, PyObject*) {
  size_t kernels = 0, cublas = 0;
  for (const auto& item : table) {
    kernels += item.second.launch != nullptr;
    cublas += item.second.blas != nullptr;
  }
  return Py_BuildValue("nn", static_cast<Py_ssize_t>(kernels), static_cast<Py_ssize_t>(cublas));
}

PyMethodDef methods[] = {
    {"init", init, METH_VARARGS,
     "init((Tensor, Parameter), settings, workspace=None): the types and settings the keys read, and what gives "
     "the cuBLAS handle a stream's workspace"},
    {"register", register_call, METH_VARARGS,
     "register(kernel, pair, out_signature, setting, call, op, guard, launch=None)"},
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(call)), METH_FASTCALL,
     "call(kernel, A, B, out, setting, stream): the result, or None"},
    {"clear", clear, METH_NOARGS, "drop every entry"},
    {"size", size, METH_NOARGS, "the number of entries"},
    {"launches", launches, METH_NOARGS,
     "(entries that launch a generated kernel, entries that call cuBLAS), without Python"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "autotile_torch_lookup", "autotile's compiled lookup of repeated calls", -1,
                      methods};

}  // namespace

PyMODINIT_FUNC PyInit_autotile_torch_lookup(void) { return PyModule_Create(&module); }
