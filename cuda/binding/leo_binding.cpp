// Thin torch layer: registers the kernels of cuda/kernels for the CUDA dispatch key of the
// leo:: ops that leo_cli/kernels/ops.py declares (schemas, fake and autograd live there). It
// checks and prepares tensors (dtype, device, contiguity), allocates outputs and calls the
// launchers of leo_api.cuh on the current stream. Built into leo_cli._C by `leo compile`;
// importing leo_cli._C runs the registrations below.
//
// Shape suffixes: R rows, C columns, E edges, F features, N gathered/scattered rows.
#include <Python.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

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
};

Csr prepare_csr(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& values,
                int64_t num_rows, const at::Tensor& x, const char* op) {
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
  return Csr{indptr.contiguous(), indices.contiguous(), values.contiguous(), num_rows};
}

leo::CsrRef csr_ref(const Csr& c) {
  return leo::CsrRef{c.indptr.data_ptr(), c.indices.data_ptr(), c.values.data_ptr(), c.num_rows,
                     c.indices.numel()};
}

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
                         const at::Tensor& /*t_perm*/, int64_t num_rows) {
  const char* op = "leo::spmm_csr";
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor x_CF = features(x, op);
  const Csr adj = prepare_csr(indptr, indices, values, num_rows, x_CF, op);
  at::Tensor out_RF = at::empty({num_rows, x_CF.size(1)}, x_CF.options());
  if (out_RF.numel() == 0) return out_RF;
  check_launch(leo::launch_spmm_csr(leo_dtype(x_CF), leo_index_type(adj.indptr), csr_ref(adj),
                                    x_CF.data_ptr(), out_RF.data_ptr(), x_CF.size(1),
                                    c10::cuda::getCurrentCUDAStream()),
               op);
  return out_RF;
}

// x_remote may be a peer GPU's buffer mapped into this device (symmetric memory, P2P): the
// kernel reads it through its pointer, so only "is CUDA" is required of it.
at::Tensor fused_aggregate_cuda(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& values,
    const at::Tensor& x_local, const at::Tensor& /*t_indptr*/, const at::Tensor& /*t_indices*/,
    const at::Tensor& /*t_perm*/, const at::Tensor& r_indptr, const at::Tensor& r_indices,
    const at::Tensor& r_values, const at::Tensor& x_remote, const at::Tensor& /*rt_indptr*/,
    const at::Tensor& /*rt_indices*/, const at::Tensor& /*rt_perm*/, int64_t num_rows) {
  const char* op = "leo::fused_aggregate";
  const c10::cuda::CUDAGuard guard(x_local.device());
  const at::Tensor xl_CF = features(x_local, op);
  const at::Tensor xr_CF = features(x_remote, op);
  TORCH_CHECK(xl_CF.scalar_type() == xr_CF.scalar_type() && xl_CF.size(1) == xr_CF.size(1), op,
              ": x_local and x_remote must have one dtype and one width");
  Csr local = prepare_csr(indptr, indices, values, num_rows, xl_CF, op);
  Csr remote = prepare_csr(r_indptr, r_indices, r_values, num_rows, xl_CF, op);
  if (local.indptr.scalar_type() != remote.indptr.scalar_type()) {
    // One kernel instantiation reads both CSRs: widen both to int64 (rare; costs a copy).
    local.indptr = local.indptr.to(at::kLong);
    local.indices = local.indices.to(at::kLong);
    remote.indptr = remote.indptr.to(at::kLong);
    remote.indices = remote.indices.to(at::kLong);
  }
  at::Tensor out_RF = at::empty({num_rows, xl_CF.size(1)}, xl_CF.options());
  if (out_RF.numel() == 0) return out_RF;
  check_launch(leo::launch_fused_aggregate(leo_dtype(xl_CF), leo_index_type(local.indptr),
                                           csr_ref(local), xl_CF.data_ptr(), csr_ref(remote),
                                           xr_CF.data_ptr(), out_RF.data_ptr(), xl_CF.size(1),
                                           c10::cuda::getCurrentCUDAStream()),
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
                                       idx_N.data_ptr(), out_NF.data_ptr(), idx_N.numel(),
                                       x_CF.size(1), c10::cuda::getCurrentCUDAStream()),
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
                                              acc.data_ptr(), idx_N.numel(), src_NF.size(1),
                                              c10::cuda::getCurrentCUDAStream()),
                 op);
  }
  return low_precision ? acc.to(src_NF.scalar_type()) : acc;
}

}  // namespace

TORCH_LIBRARY_IMPL(leo, CUDA, m) {
  m.impl("spmm_csr", &spmm_csr_cuda);
  m.impl("fused_aggregate", &fused_aggregate_cuda);
  m.impl("gather_rows", &gather_rows_cuda);
  m.impl("scatter_add_rows", &scatter_add_rows_cuda);
}

// A Python module with no functions: importing leo_cli._C only loads the library, whose static
// initialisers (TORCH_LIBRARY_IMPL above) register the kernels.
extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C", "LEO CUDA kernels for the leo:: torch ops.", -1, nullptr,
      nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module_def);
}
