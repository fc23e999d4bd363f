// The torch binding of LEO's CPU kernels: the op leo_cpu::spmm_csr, loaded with
// torch.ops.load_library by leo_cli.kernels.cpu, which registers it as the CPU kernel of
// leo::spmm_csr (the Python side converts low-precision inputs, as the reference does).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>

#include "spmm_csr_cpu.h"

namespace {

// Rows per task: small enough that threads balance over rows of uneven degree, large enough
// that handing out a task costs nothing next to it.
constexpr int64_t kRowsPerTask = 256;

// Row tasks handed out as threads free up (a plain at::parallel_for splits statically, which
// leaves a thread idle behind a run of high-degree rows): each of torch's threads claims the
// next task from a shared counter. at::parallel_for keeps torch's thread count and runs inline
// when called from inside another parallel region.
template <typename T, typename Ptr, typename Idx>
void spmm_parallel(const Ptr* indptr, const Idx* indices, const T* values, const T* x,
                   int64_t width, T* out, int64_t num_rows) {
  const int64_t tasks = (num_rows + kRowsPerTask - 1) / kRowsPerTask;
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), tasks);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t t = next++; t < tasks; t = next++) {
      const int64_t r0 = t * kRowsPerTask;
      const int64_t r1 = std::min(num_rows, r0 + kRowsPerTask);
      leo_cpu::spmm_rows(indptr, indices, values, x, width, out, r0, r1);
    }
  });
}

at::Tensor spmm_csr(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& values,
                    const at::Tensor& x, int64_t num_rows) {
  TORCH_CHECK(x.device().is_cpu() && indptr.device().is_cpu() && indices.device().is_cpu() &&
                  values.device().is_cpu(),
              "leo_cpu::spmm_csr: every tensor must be on the CPU");
  TORCH_CHECK(x.dim() == 2, "leo_cpu::spmm_csr: x must be 2-D");
  TORCH_CHECK(indptr.dim() == 1 && indptr.numel() == num_rows + 1,
              "leo_cpu::spmm_csr: indptr must have num_rows + 1 entries");
  TORCH_CHECK(indices.dim() == 1 && values.dim() == 1 && indices.numel() == values.numel(),
              "leo_cpu::spmm_csr: indices and values must be 1-D of one length");
  TORCH_CHECK(values.scalar_type() == x.scalar_type(),
              "leo_cpu::spmm_csr: values and x must share a dtype");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "leo_cpu::spmm_csr: float32 or float64 only (the caller converts others)");
  const auto ptr = indptr.contiguous();
  const auto idx = indices.contiguous();
  const auto val = values.contiguous();
  const auto xc = x.contiguous();
  const int64_t width = xc.size(1);
  const int64_t num_edges = idx.numel();
  TORCH_CHECK(ptr[0].item<int64_t>() >= 0 && ptr[num_rows].item<int64_t>() <= num_edges,
              "leo_cpu::spmm_csr: indptr must point into indices (0 <= indptr[0], "
              "indptr[-1] <= number of edges)");
  auto out = at::empty({num_rows, width}, xc.options());
  if (num_rows == 0 || width == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "leo_cpu_spmm_csr", [&] {
    AT_DISPATCH_INDEX_TYPES(idx.scalar_type(), "leo_cpu_spmm_csr_indices", [&] {
      using Idx = index_t;
      AT_DISPATCH_INDEX_TYPES(ptr.scalar_type(), "leo_cpu_spmm_csr_indptr", [&] {
        spmm_parallel(ptr.data_ptr<index_t>(), idx.data_ptr<Idx>(), val.data_ptr<scalar_t>(),
                      xc.data_ptr<scalar_t>(), width, out.data_ptr<scalar_t>(), num_rows);
      });
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(leo_cpu, m) {
  m.def("spmm_csr(Tensor indptr, Tensor indices, Tensor values, Tensor x, int num_rows) -> Tensor");
}

TORCH_LIBRARY_IMPL(leo_cpu, CPU, m) { m.impl("spmm_csr", &spmm_csr); }
