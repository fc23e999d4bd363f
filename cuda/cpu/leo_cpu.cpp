// The torch binding of LEO's CPU kernels: the ops leo_cpu::spmm_csr, leo_cpu::keyed_dropout and
// leo_cpu::bias_relu_dropout, loaded with torch.ops.load_library by leo_cli.kernels.cpu, which
// registers them as the CPU kernels of the leo:: ops of the same names (the Python side
// converts low-precision inputs of the SpMM, as the reference does).
// The headers of what the file uses, not <ATen/ATen.h> (every operator's declaration): the
// compiler's front end on torch's headers is most of the build's time (first use: leo train).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "keyed_cpu.h"
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

// x's row-major rows [r0, r1) times their keyed multipliers (`table`'s: `kept` or 0 by each
// entry's random byte) into out: a group of eight columns shares one 64-bit hash, whose keep
// bits pick eight multipliers from the table, so the product is a plain loop of eight.
template <typename T>
void keyed_dropout_rows(const T* x, const int64_t* ids, const uint64_t* column, int64_t cols,
                        uint64_t key, int thr, const at::opmath_type<T>* table, T* out, int64_t r0,
                        int64_t r1) {
  using opmath_t = at::opmath_type<T>;
  const uint64_t thr8 = static_cast<uint64_t>(thr) * 0x0101010101010101ULL;
  for (int64_t r = r0; r < r1; ++r) {
    const uint64_t row = leo_cpu::splitmix64(static_cast<uint64_t>(ids[r]) ^ key);
    const T* xr = x + r * cols;
    T* yr = out + r * cols;
    for (int64_t j = 0; j < cols; j += 8) {
      const opmath_t* m = table + 8 * leo_cpu::keep_bits(leo_cpu::mix64(row ^ column[j / 8]), thr8);
      const int64_t n = std::min<int64_t>(8, cols - j);
      for (int64_t k = 0; k < n; ++k) {
        yr[j + k] = static_cast<T>(static_cast<opmath_t>(xr[j + k]) * m[k]);
      }
    }
  }
}

// x with entry (i, j) times `scale` where the random byte of (ids[i], j) under `key` is at
// least `threshold`, else times 0: the kernel of leo::keyed_dropout (the same bits as its
// reference), in one pass over x.
at::Tensor keyed_dropout(const at::Tensor& x, const at::Tensor& ids, int64_t key,
                         int64_t threshold, double scale) {
  TORCH_CHECK(x.device().is_cpu() && ids.device().is_cpu(),
              "leo_cpu::keyed_dropout: every tensor must be on the CPU");
  TORCH_CHECK(x.dim() == 2 && ids.dim() == 1 && ids.size(0) == x.size(0),
              "leo_cpu::keyed_dropout: x (N x F) and ids (N) must match");
  TORCH_CHECK(threshold >= 0 && threshold <= 255,
              "leo_cpu::keyed_dropout: threshold must be a byte (0 to 255)");
  const auto xc = x.contiguous();
  const auto id = ids.to(at::kLong).contiguous();
  const int64_t rows = xc.size(0);
  const int64_t cols = xc.size(1);
  auto out = at::empty({rows, cols}, xc.options());  // row-major, as the reference's
  if (rows == 0 || cols == 0) return out;
  const auto column = leo_cpu::column_hashes(cols);  // made once
  const int thr = static_cast<int>(threshold);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / cols);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(),
                                  "leo_cpu_keyed_dropout", [&] {
    const scalar_t* src = xc.data_ptr<scalar_t>();
    const int64_t* row_ids = id.data_ptr<int64_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    // the multiplier as the reference holds it: `scale` in x's dtype
    const auto kept = static_cast<at::opmath_type<scalar_t>>(static_cast<scalar_t>(scale));
    const auto table = leo_cpu::multiplier_table(kept);
    at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      keyed_dropout_rows(src, row_ids, column.data(), cols, static_cast<uint64_t>(key), thr,
                         table.data(), dst, r0, r1);
    });
  });
  return out;
}

// relu(h + bias) of h's row-major rows [r0, r1), times `scale` where the entry's random byte is
// at least `thr` and times 0 where it is not (thr 0: no mask), into out; each step rounded as
// the reference's tensor ops round it (the sum to T, then the masked product to T).
template <typename T>
void bias_relu_dropout_rows(const T* h, const T* bias, const int64_t* ids, const uint64_t* column,
                            int64_t cols, uint64_t key, int thr, const at::opmath_type<T>* ones,
                            at::opmath_type<T> scale, T* out, int64_t r0, int64_t r1) {
  using opmath_t = at::opmath_type<T>;
  const int64_t groups = (cols + 7) / 8;
  std::vector<opmath_t> keep(8 * groups, opmath_t(1));
  opmath_t* m = keep.data();
  for (int64_t r = r0; r < r1; ++r) {
    if (thr > 0) leo_cpu::row_multipliers(ids[r], key, column, groups, thr, ones, m);
    const T* hr = h + r * cols;
    T* yr = out + r * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const opmath_t sum = bias ? static_cast<opmath_t>(hr[j]) + static_cast<opmath_t>(bias[j])
                                : static_cast<opmath_t>(hr[j]);
      opmath_t v = static_cast<opmath_t>(static_cast<T>(sum));
      v = v < opmath_t(0) ? opmath_t(0) : v;  // clamp(min=0): -0 and NaN pass as they are
      yr[j] = thr > 0 ? static_cast<T>(v * m[j] * scale) : static_cast<T>(v);
    }
  }
}

// relu(h + bias) with entry (i, j) times `scale` where the random byte of (ids[i], j) under
// `key` is at least `threshold`, else times 0: the kernel of leo::bias_relu_dropout (the same
// bits as its reference), in one pass over h.
at::Tensor bias_relu_dropout(const at::Tensor& h, const c10::optional<at::Tensor>& bias,
                             const at::Tensor& ids, int64_t key, int64_t threshold,
                             double scale) {
  TORCH_CHECK(h.device().is_cpu() && ids.device().is_cpu() &&
                  (!bias.has_value() || bias->device().is_cpu()),
              "leo_cpu::bias_relu_dropout: every tensor must be on the CPU");
  TORCH_CHECK(h.dim() == 2 && ids.dim() == 1 && ids.size(0) == h.size(0),
              "leo_cpu::bias_relu_dropout: h (N x F) and ids (N) must match");
  TORCH_CHECK(threshold >= 0 && threshold <= 255,
              "leo_cpu::bias_relu_dropout: threshold must be a byte (0 to 255)");
  TORCH_CHECK(!bias.has_value() ||
                  (bias->dim() == 1 && bias->size(0) == h.size(1) &&
                   bias->scalar_type() == h.scalar_type()),
              "leo_cpu::bias_relu_dropout: bias must have F entries of h's dtype");
  const auto hc = h.contiguous();
  const auto id = ids.to(at::kLong).contiguous();
  const auto b = bias.has_value() ? bias->contiguous() : at::Tensor();
  const int64_t rows = hc.size(0);
  const int64_t cols = hc.size(1);
  auto out = at::empty({rows, cols}, hc.options());  // row-major, as the reference's
  if (rows == 0 || cols == 0) return out;
  const auto column = leo_cpu::column_hashes(cols);
  const int thr = static_cast<int>(threshold);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / cols);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, hc.scalar_type(),
                                  "leo_cpu_bias_relu_dropout", [&] {
    const scalar_t* src = hc.data_ptr<scalar_t>();
    const scalar_t* add = b.defined() ? b.data_ptr<scalar_t>() : nullptr;
    const int64_t* row_ids = id.data_ptr<int64_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    // a Python float scalar as torch's mul_ takes it: in the op's compute type
    const auto s = static_cast<at::opmath_type<scalar_t>>(scale);
    const auto ones = leo_cpu::multiplier_table(at::opmath_type<scalar_t>(1));  // the mask: 1 or 0
    at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      bias_relu_dropout_rows(src, add, row_ids, column.data(), cols, static_cast<uint64_t>(key),
                             thr, ones.data(), s, dst, r0, r1);
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(leo_cpu, m) {
  m.def("spmm_csr(Tensor indptr, Tensor indices, Tensor values, Tensor x, int num_rows) -> Tensor");
  m.def("keyed_dropout(Tensor x, Tensor ids, int key, int threshold, float scale) -> Tensor");
  m.def(
      "bias_relu_dropout(Tensor h, Tensor? bias, Tensor ids, int key, int threshold, float scale)"
      " -> Tensor");
}

TORCH_LIBRARY_IMPL(leo_cpu, CPU, m) {
  m.impl("spmm_csr", &spmm_csr);
  m.impl("keyed_dropout", &keyed_dropout);
  m.impl("bias_relu_dropout", &bias_relu_dropout);
}
