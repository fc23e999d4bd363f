// Thin torch layer: registers the kernels of cuda/kernels for the CUDA dispatch key of the
// leo:: ops that leo_cli/kernels/ops.py declares (schemas, fake and autograd live there). It
// checks and prepares tensors (dtype, device, contiguity), allocates outputs and workspaces and
// calls the launchers of leo_api.cuh on the current stream. Built into leo_cli._C by `leo
// compile`.
//
// Importing leo_cli._C registers nothing: leo_cli.kernels.backend calls
// `_C.register_kernels()`, which registers all four kernels or none. A signature that drifted
// from ops.py's schemas then raises a Python RuntimeError (the backend falls back to the
// reference) instead of aborting the process in a static initialiser.
//
// Shape suffixes: R rows, C columns, E edges, F features, N gathered/scattered rows.
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/cuda/CachingHostAllocator.h>
#include <ATen/cuda/PeerToPeerAccess.h>  // not c10/cuda/PeerToPeerAccess.h: recent torch only
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>
#include <torch/version.h>

#include <memory>
#include <string>

#include "leo_api.cuh"

namespace {

leo::DType leo_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return leo::DType::kFloat32;
    case at::kDouble:
      return leo::DType::kFloat64;
    case at::kHalf:
      return leo::DType::kFloat16;
    case at::kBFloat16:
      return leo::DType::kBFloat16;
    default:
      break;
  }
  TORCH_CHECK(false, "leo CUDA kernels take float32, float64, float16 or bfloat16 features, got ",
              t.scalar_type());
  return leo::DType::kFloat32;  // unreachable: TORCH_CHECK(false) throws
}

leo::IndexType leo_index_type(const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong,
              "leo CUDA kernels take int32 or int64 indices, got ", t.scalar_type());
  return t.scalar_type() == at::kInt ? leo::IndexType::kInt32 : leo::IndexType::kInt64;
}

void check_launch(cudaError_t status, const char* op) {
  TORCH_CHECK(status == cudaSuccess, op, ": kernel launch failed: ", cudaGetErrorString(status));
}

// A CSR's arrays, checked against its features x and made contiguous.
struct Csr {
  at::Tensor indptr;
  at::Tensor indices;
  at::Tensor values;
  int64_t num_rows;
  int64_t max_degree;
};

Csr prepare_csr(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& values,
                int64_t num_rows, int64_t max_degree, const at::Tensor& x, const char* op) {
  TORCH_CHECK(indptr.dim() == 1 && indptr.numel() == num_rows + 1, op,
              ": indptr must have num_rows + 1 entries");
  TORCH_CHECK(indices.dim() == 1 && values.dim() == 1 && indices.numel() == values.numel(), op,
              ": indices and values must be 1-D with one entry per edge");
  TORCH_CHECK(indices.scalar_type() == indptr.scalar_type(), op,
              ": indptr and indices must share one integer dtype");
  TORCH_CHECK(values.scalar_type() == x.scalar_type(), op,
              ": values must have the dtype of the features, got ", values.scalar_type(), " and ",
              x.scalar_type());
  TORCH_CHECK(indptr.device() == x.device() && indices.device() == x.device() &&
                  values.device() == x.device(),
              op, ": CSR arrays must be on the device of the features");
  leo_index_type(indptr);
  return Csr{indptr.contiguous(), indices.contiguous(), values.contiguous(), num_rows,
             max_degree};
}

leo::CsrRef csr_ref(const Csr& c) {
  return leo::CsrRef{c.indptr.data_ptr(), c.indices.data_ptr(), c.values.data_ptr(),
                     c.num_rows,          c.indices.numel(),   c.max_degree};
}

// A byte buffer on x's device for a launcher's workspace (empty when it needs none).
at::Tensor workspace(size_t bytes, const at::Tensor& x) {
  return at::empty({static_cast<int64_t>(bytes)}, x.options().dtype(at::kByte));
}

void* data_or_null(const at::Tensor& t) { return t.numel() == 0 ? nullptr : t.data_ptr(); }

at::Tensor features(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.dim() == 2, op, ": features must be 2-D (rows x F)");
  TORCH_CHECK(x.is_cuda(), op, ": features must be on a CUDA device");
  leo_dtype(x);
  return x.contiguous();
}

// The transpose arrays are only read by the backward (registered in Python).
at::Tensor spmm_csr_cuda(const at::Tensor& indptr, const at::Tensor& indices,
                         const at::Tensor& values, const at::Tensor& x,
                         const at::Tensor& /*t_indptr*/, const at::Tensor& /*t_indices*/,
                         const at::Tensor& /*t_perm*/, int64_t num_rows, int64_t max_degree,
                         int64_t /*t_max_degree*/) {
  const char* op = "leo::spmm_csr";
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor x_CF = features(x, op);
  const Csr adj = prepare_csr(indptr, indices, values, num_rows, max_degree, x_CF, op);
  at::Tensor out_RF = at::empty({num_rows, x_CF.size(1)}, x_CF.options());
  if (out_RF.numel() == 0) return out_RF;
  const leo::DType dtype = leo_dtype(x_CF);
  const at::Tensor ws =
      workspace(leo::spmm_csr_workspace_bytes(dtype, csr_ref(adj), x_CF.size(1)), x_CF);
  check_launch(leo::launch_spmm_csr(dtype, leo_index_type(adj.indptr), csr_ref(adj),
                                    x_CF.data_ptr(), out_RF.data_ptr(), x_CF.size(1),
                                    data_or_null(ws), c10::cuda::getCurrentCUDAStream()),
               op);
  return out_RF;
}

// Keeps pinned host memory from reuse until `stream` has passed this point: the kernel reads
// it asynchronously, and the caller may drop its tensor as soon as the op returns.
void keep_host_rows(const at::Tensor& x_host, const c10::cuda::CUDAStream& stream) {
  const c10::DataPtr& data = x_host.storage().data_ptr();
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
  at::getHostAllocator(at::kCUDA)->record_event(data.get(), data.get_context(), stream.unwrap());
#else
  at::cuda::CachingHostAllocator_recordEvent(data.get(), data.get_context(), stream);
#endif
}

// Orders `stream` after the work queued so far on the current stream of x_peer's GPU (which
// produced or copied it), and keeps x_peer's memory from reuse until `stream` is done with it
// (the caller may drop its tensor as soon as the op returns).
// (A raw event: ATen/cuda/CUDAEvent.h pulls in cuSPARSE and cuBLAS headers.)
void use_peer_rows(const at::Tensor& x_peer, const c10::cuda::CUDAStream& stream) {
  cudaEvent_t ready = nullptr;
  {
    const c10::cuda::CUDAGuard peer(x_peer.device());
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventRecord(ready, c10::cuda::getCurrentCUDAStream(x_peer.device().index())));
  }
  C10_CUDA_CHECK(cudaStreamWaitEvent(stream, ready, 0));
  C10_CUDA_CHECK(cudaEventDestroy(ready));  // released once the wait has happened
  c10::cuda::CUDACachingAllocator::recordStream(x_peer.storage().data_ptr(), stream);
}

// x_remote as the fused kernel reads it: contiguous, readable from `device`, and the link it
// lives behind. A peer GPU's tensor needs peer access (enabled here, or a clear refusal); a
// non-contiguous one is copied on the peer's current stream first. Either way our stream waits
// for the peer's stream, and the rows it reads stay allocated until the kernel has run. Host
// memory must be pinned and contiguous (read through its mapped address) and likewise stays
// allocated. What the caller must still do, as for any tensor a kernel reads asynchronously:
// not write to x_remote until this stream has run the kernel.
struct RemoteRows {
  at::Tensor x;
  const void* ptr;
  leo::RemoteLink link;
};

RemoteRows host_rows(const at::Tensor& x_remote, const at::Device& device, const char* op) {
  TORCH_CHECK(x_remote.is_pinned() && x_remote.is_contiguous(), op,
              ": x_remote in host memory must be pinned and contiguous (x.pin_memory())");
  void* mapped = nullptr;
  const cudaError_t status = cudaHostGetDevicePointer(&mapped, x_remote.data_ptr(), 0);
  TORCH_CHECK(status == cudaSuccess, op, ": pinned x_remote is not mapped for ", device, ": ",
              cudaGetErrorString(status));
  keep_host_rows(x_remote, c10::cuda::getCurrentCUDAStream(device.index()));
  return RemoteRows{x_remote, mapped, leo::RemoteLink::kHost};
}

RemoteRows peer_rows(const at::Tensor& x_remote, const at::Device& device, const char* op) {
  TORCH_CHECK(at::cuda::get_p2p_access(device.index(), x_remote.device().index()), op,
              ": x_remote is on ", x_remote.device(), ", which ", device,
              " cannot read directly (no peer access between the two GPUs); copy it to ", device,
              " first");
  at::Tensor x = x_remote;
  if (!x.is_contiguous()) {
    const c10::cuda::CUDAGuard peer(x_remote.device());
    x = x_remote.contiguous();  // on the peer's current stream
  }
  use_peer_rows(x, c10::cuda::getCurrentCUDAStream(device.index()));
  return RemoteRows{x, x.data_ptr(), leo::RemoteLink::kPeer};
}

RemoteRows remote_rows(const at::Tensor& x_remote, const at::Device& device, const char* op) {
  TORCH_CHECK(x_remote.dim() == 2, op, ": x_remote must be 2-D (rows x F)");
  if (x_remote.is_cpu()) return host_rows(x_remote, device, op);
  TORCH_CHECK(x_remote.is_cuda(), op, ": x_remote must be on a CUDA device or pinned host memory");
  if (x_remote.device() == device) {
    const at::Tensor x = x_remote.contiguous();
    return RemoteRows{x, x.data_ptr(), leo::RemoteLink::kSameDevice};
  }
  return peer_rows(x_remote, device, op);
}

at::Tensor fused_aggregate_cuda(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& values,
    const at::Tensor& x_local, const at::Tensor& /*t_indptr*/, const at::Tensor& /*t_indices*/,
    const at::Tensor& /*t_perm*/, const at::Tensor& r_indptr, const at::Tensor& r_indices,
    const at::Tensor& r_values, const at::Tensor& x_remote, const at::Tensor& /*rt_indptr*/,
    const at::Tensor& /*rt_indices*/, const at::Tensor& /*rt_perm*/, int64_t num_rows,
    int64_t max_degree, int64_t /*t_max_degree*/, int64_t r_max_degree,
    int64_t /*rt_max_degree*/) {
  const char* op = "leo::fused_aggregate";
  const c10::cuda::CUDAGuard guard(x_local.device());
  const at::Tensor xl_CF = features(x_local, op);
  const RemoteRows remote_x = remote_rows(x_remote, xl_CF.device(), op);
  TORCH_CHECK(xl_CF.scalar_type() == remote_x.x.scalar_type() &&
                  xl_CF.size(1) == remote_x.x.size(1),
              op, ": x_local and x_remote must have one dtype and one width");
  Csr local = prepare_csr(indptr, indices, values, num_rows, max_degree, xl_CF, op);
  Csr remote = prepare_csr(r_indptr, r_indices, r_values, num_rows, r_max_degree, xl_CF, op);
  if (local.indptr.scalar_type() != remote.indptr.scalar_type()) {
    // One kernel instantiation reads both CSRs: widen both to int64 (rare; costs a copy).
    local.indptr = local.indptr.to(at::kLong);
    local.indices = local.indices.to(at::kLong);
    remote.indptr = remote.indptr.to(at::kLong);
    remote.indices = remote.indices.to(at::kLong);
  }
  at::Tensor out_RF = at::empty({num_rows, xl_CF.size(1)}, xl_CF.options());
  if (out_RF.numel() == 0) return out_RF;
  const leo::DType dtype = leo_dtype(xl_CF);
  const at::Tensor ws = workspace(
      leo::fused_aggregate_workspace_bytes(dtype, csr_ref(local), csr_ref(remote), xl_CF.size(1)),
      xl_CF);
  check_launch(leo::launch_fused_aggregate(dtype, leo_index_type(local.indptr), csr_ref(local),
                                           xl_CF.data_ptr(), csr_ref(remote), remote_x.ptr,
                                           remote_x.link, out_RF.data_ptr(), xl_CF.size(1),
                                           data_or_null(ws), c10::cuda::getCurrentCUDAStream()),
               op);
  return out_RF;
}

at::Tensor gather_rows_cuda(const at::Tensor& x, const at::Tensor& idx) {
  const char* op = "leo::gather_rows";
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor x_CF = features(x, op);
  TORCH_CHECK(idx.dim() == 1 && idx.device() == x.device(), op,
              ": idx must be 1-D and on the device of x");
  const at::Tensor idx_N = idx.contiguous();
  at::Tensor out_NF = at::empty({idx_N.numel(), x_CF.size(1)}, x_CF.options());
  if (out_NF.numel() == 0) return out_NF;
  check_launch(leo::launch_gather_rows(leo_dtype(x_CF), leo_index_type(idx_N), x_CF.data_ptr(),
                                       x_CF.size(0), idx_N.data_ptr(), out_NF.data_ptr(),
                                       idx_N.numel(), x_CF.size(1),
                                       c10::cuda::getCurrentCUDAStream()),
               op);
  return out_NF;
}

// Accumulates in float32 for float16/bfloat16 (as the reference does), then rounds once.
at::Tensor scatter_add_rows_cuda(const at::Tensor& src, const at::Tensor& idx, int64_t num_rows) {
  const char* op = "leo::scatter_add_rows";
  const c10::cuda::CUDAGuard guard(src.device());
  const at::Tensor src_NF = features(src, op);
  TORCH_CHECK(idx.dim() == 1 && idx.numel() == src_NF.size(0) && idx.device() == src.device(), op,
              ": idx must be 1-D, one entry per row of src, on the device of src");
  const at::Tensor idx_N = idx.contiguous();
  const bool low_precision =
      src_NF.scalar_type() == at::kHalf || src_NF.scalar_type() == at::kBFloat16;
  const auto acc_dtype = low_precision ? at::kFloat : src_NF.scalar_type();
  at::Tensor acc = at::zeros({num_rows, src_NF.size(1)}, src_NF.options().dtype(acc_dtype));
  if (src_NF.numel() > 0) {
    check_launch(leo::launch_scatter_add_rows(leo_dtype(src_NF), leo_index_type(idx_N),
                                              src_NF.data_ptr(), idx_N.data_ptr(),
                                              acc.data_ptr(), num_rows, idx_N.numel(),
                                              src_NF.size(1), c10::cuda::getCurrentCUDAStream()),
                 op);
  }
  return low_precision ? acc.to(src_NF.scalar_type()) : acc;
}

// The registrations of register_kernels, alive until unregister_kernels (a torch::Library
// undoes its registrations when destroyed).
std::unique_ptr<torch::Library>& registry() {
  static std::unique_ptr<torch::Library> library;
  return library;
}

const char* const kOps[] = {"spmm_csr", "fused_aggregate", "gather_rows", "scatter_add_rows"};

// All four kernels or none: an impl whose signature does not match its op's schema throws, and
// the library (with the impls registered before it) is destroyed on the way out.
void register_all() {
  if (registry()) return;
  for (const char* name : kOps) {
    TORCH_CHECK(c10::Dispatcher::singleton().findSchema({std::string("leo::") + name, ""}),
                "leo::", name, " is not declared: import leo_cli.kernels.ops first");
  }
  auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "leo",
                                                  c10::DispatchKey::CUDA, __FILE__, __LINE__);
  library->impl("spmm_csr", TORCH_FN(spmm_csr_cuda));
  library->impl("fused_aggregate", TORCH_FN(fused_aggregate_cuda));
  library->impl("gather_rows", TORCH_FN(gather_rows_cuda));
  library->impl("scatter_add_rows", TORCH_FN(scatter_add_rows_cuda));
  registry() = std::move(library);
}

PyObject* register_kernels(PyObject* /*self*/, PyObject* /*args*/) {
  try {
    register_all();
  } catch (const std::exception& exc) {
    PyErr_SetString(PyExc_RuntimeError, exc.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* unregister_kernels(PyObject* /*self*/, PyObject* /*args*/) {
  registry().reset();
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"register_kernels", register_kernels, METH_NOARGS,
     "Register the CUDA kernels for the leo:: ops (all or none; RuntimeError on a mismatch)."},
    {"unregister_kernels", unregister_kernels, METH_NOARGS,
     "Undo register_kernels: the leo:: ops fall back to their reference on CUDA tensors."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C", "LEO CUDA kernels for the leo:: torch ops.", -1, kMethods,
      nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module_def);
}
