// Graph attention (GAT) kernels: edge scores, edge softmax and the per-head weighted SpMM,
// written for the leo::gat_scores, leo::edge_softmax and leo::gat_spmm ops (the reference and
// the oracle is leo_cli/kernels/gat_ops.py). Not registered by the binding yet: compiled by
// `leo compile --check` and checked by cuda/tests/gat_emulation.cu only.
//
// Layouts (row-major): a_src_CH, a_dst_RH, scores_EH, alpha_EH hold H heads per row; x_CHF
// and out_RHF hold H heads of F features per row. A thread owns one (row, head), or one
// (row, head, feature) for the SpMM, and walks that row's edges in order: rows are
// independent (the softmax of a row reads only its own edges), so no atomics are needed.
// Accumulation is in AccT (fp32 for fp16/bf16).
//
// Shape suffixes: R rows (destinations), C columns (sources), E edges, H heads, F features.
#pragma once

#include <math.h>

#include "leo_common.cuh"

namespace leo {

constexpr int kGatThreads = 256;
constexpr int64_t kGatMaxBlocks = 65535;  // the grid-stride loop covers the rest

inline int64_t gat_blocks(int64_t total_items) {
  return min64(max64(ceil_div(total_items, kGatThreads), 1), kGatMaxBlocks);
}

template <typename T, typename I>
struct GatScoresArgs {
  const I* indptr;   // R + 1
  const I* indices;  // E
  const T* a_src;    // C x H
  const T* a_dst;    // R x H
  T* scores;         // E x H
  int64_t num_heads;
  double negative_slope;
};

// Item t of R * H: row t / H, head t % H. score = LeakyReLU(a_src[col, h] + a_dst[row, h]).
template <typename T, typename I>
LEO_HD void gat_scores_item(const GatScoresArgs<T, I>& a, int64_t t) {
  using Acc = AccT<T>;
  const int64_t i = t / a.num_heads;
  const int64_t h = t % a.num_heads;
  const Acc dst = NumTraits<T>::load(a.a_dst[i * a.num_heads + h]);
  const Acc slope = static_cast<Acc>(a.negative_slope);
  for (int64_t e = static_cast<int64_t>(a.indptr[i]); e < static_cast<int64_t>(a.indptr[i + 1]);
       ++e) {
    const int64_t j = static_cast<int64_t>(a.indices[e]);
    const Acc s = NumTraits<T>::load(a.a_src[j * a.num_heads + h]) + dst;
    a.scores[e * a.num_heads + h] = NumTraits<T>::store(s > Acc(0) ? s : s * slope);
  }
}

template <typename T, typename I>
struct EdgeSoftmaxArgs {
  const I* indptr;  // R + 1
  const T* scores;  // E x H
  T* alpha;         // E x H
  int64_t num_heads;
};

// Item t of R * H: the softmax of head t % H over the edges of row t / H, in three passes
// (max, sum of exponentials, normalised weights); a row without edges writes nothing.
template <typename T, typename I>
LEO_HD void edge_softmax_item(const EdgeSoftmaxArgs<T, I>& a, int64_t t) {
  using Acc = AccT<T>;
  const int64_t i = t / a.num_heads;
  const int64_t h = t % a.num_heads;
  const int64_t begin = static_cast<int64_t>(a.indptr[i]);
  const int64_t end = static_cast<int64_t>(a.indptr[i + 1]);
  if (begin == end) return;
  Acc top = NumTraits<T>::load(a.scores[begin * a.num_heads + h]);
  for (int64_t e = begin + 1; e < end; ++e) {
    const Acc s = NumTraits<T>::load(a.scores[e * a.num_heads + h]);
    top = s > top ? s : top;
  }
  Acc sum = 0;
  for (int64_t e = begin; e < end; ++e) {
    sum += exp(NumTraits<T>::load(a.scores[e * a.num_heads + h]) - top);
  }
  for (int64_t e = begin; e < end; ++e) {
    const Acc w = exp(NumTraits<T>::load(a.scores[e * a.num_heads + h]) - top) / sum;
    a.alpha[e * a.num_heads + h] = NumTraits<T>::store(w);
  }
}

template <typename T, typename I>
struct GatSpmmArgs {
  const I* indptr;   // R + 1
  const I* indices;  // E
  const T* alpha;    // E x H
  const T* x;        // C x H x F
  T* out;            // R x H x F
  int64_t num_heads;
  int64_t num_features;
};

// Item t of R * H * F: out[i, h, f] = sum over edges e of row i of alpha[e, h] * x[col, h, f].
// Consecutive threads take consecutive features, so a warp reads contiguous x rows.
template <typename T, typename I>
LEO_HD void gat_spmm_item(const GatSpmmArgs<T, I>& a, int64_t t) {
  using Acc = AccT<T>;
  const int64_t row_width = a.num_heads * a.num_features;
  const int64_t i = t / row_width;
  const int64_t hf = t % row_width;  // h * F + f
  const int64_t h = hf / a.num_features;
  Acc acc = 0;
  for (int64_t e = static_cast<int64_t>(a.indptr[i]); e < static_cast<int64_t>(a.indptr[i + 1]);
       ++e) {
    const int64_t j = static_cast<int64_t>(a.indices[e]);
    acc += NumTraits<T>::load(a.alpha[e * a.num_heads + h]) *
           NumTraits<T>::load(a.x[j * row_width + hf]);
  }
  a.out[t] = NumTraits<T>::store(acc);
}

// Launchers (cuda/kernels/gat.cu). Every one writes all of its output (edge softmax: every
// edge of every row), on `stream`.
cudaError_t launch_gat_scores(DType dtype, IndexType index_type, const void* indptr,
                              const void* indices, const void* a_src_CH, const void* a_dst_RH,
                              void* scores_EH, int64_t num_rows, int64_t num_heads,
                              double negative_slope, cudaStream_t stream);

cudaError_t launch_edge_softmax(DType dtype, IndexType index_type, const void* indptr,
                                const void* scores_EH, void* alpha_EH, int64_t num_rows,
                                int64_t num_heads, cudaStream_t stream);

cudaError_t launch_gat_spmm(DType dtype, IndexType index_type, const void* indptr,
                            const void* indices, const void* alpha_EH, const void* x_CHF,
                            void* out_RHF, int64_t num_rows, int64_t num_heads,
                            int64_t num_features, cudaStream_t stream);

}  // namespace leo
