// Row gather (packs send buffers) and row scatter-add (unpacks halo gradients).
//
// Both walk a flat index space with a grid-stride loop: gather copies 16-byte vectors when the
// width and alignment allow; scatter-add issues one atomic per element into an accumulator of
// the accumulation type (fp32 for fp16/bf16 data), so duplicate indices sum exactly as
// index_add_ does, up to summation order.
//
// Shape suffixes: N gathered/scattered rows, F features.
#pragma once

#include "leo_common.cuh"

namespace leo {

constexpr int kRowThreads = 256;
// Enough blocks to fill any current GPU; the grid-stride loop covers the rest.
constexpr int64_t kRowMaxBlocks = 65535;

inline int64_t row_op_blocks(int64_t total_items) {
  return min64(max64(ceil_div(total_items, kRowThreads), 1), kRowMaxBlocks);
}

template <typename T, typename I>
struct GatherArgs {
  const T* x;    // any rows x F
  const I* idx;  // N
  T* out;        // N x F
  int64_t num_idx;
  int64_t num_features;
};

// Item t of N * F / VEC: row t / (F / VEC), vector t % (F / VEC) of that row.
template <typename T, typename I, int VEC>
LEO_HD void gather_item(const GatherArgs<T, I>& a, int64_t t) {
  const int64_t vecs_per_row = a.num_features / VEC;
  const int64_t i = t / vecs_per_row;
  const int64_t f = (t % vecs_per_row) * VEC;
  const int64_t src_row = static_cast<int64_t>(a.idx[i]);
  copy_vec<T, VEC>(a.out + i * a.num_features + f, a.x + src_row * a.num_features + f);
}

template <typename T, typename I>
struct ScatterArgs {
  const T* src;  // N x F
  const I* idx;  // N
  AccT<T>* acc;  // rows x F, zeroed by the caller
  int64_t num_idx;
  int64_t num_features;
};

// Item t of N * F: element (t / F, t % F) of src added into its destination row.
template <typename T, typename I>
LEO_HD void scatter_add_item(const ScatterArgs<T, I>& a, int64_t t) {
  const int64_t i = t / a.num_features;
  const int64_t f = t % a.num_features;
  const int64_t dst_row = static_cast<int64_t>(a.idx[i]);
  atomic_add(a.acc + dst_row * a.num_features + f, NumTraits<T>::load(a.src[t]));
}

}  // namespace leo
