// Row gather (packs send buffers) and row scatter-add (unpacks halo gradients).
//
// Both map lane groups to rows: a group of G lanes (a power of two up to a block) walks one row's
// features, VEC at a time (16- or 8-byte vectors for gather when the width and alignment
// allow), and the block's groups stride over the rows; no 64-bit division per element.
// Scatter-add issues one atomic per element into an accumulator of the accumulation type (fp32
// for fp16/bf16 data), so duplicate indices sum exactly as index_add_ does, up to summation
// order.
//
// Indices are validated by the callers (leo_cli.kernels checks them once per index tensor); the
// kernels still never touch memory outside their buffers for a bad index: gather writes a zero
// row, scatter-add skips the row.
//
// Shape suffixes: N gathered/scattered rows, F features.
#pragma once

#include "leo_common.cuh"

namespace leo {

constexpr int kRowThreads = 256;
// Enough blocks to fill any current GPU; the block-stride loop covers the rest.
constexpr int64_t kRowMaxBlocks = 65535;

struct RowConfig {
  int group_lanes;     // G
  int rows_per_block;  // kRowThreads / G
  int64_t blocks;
};

inline RowConfig make_row_config(int64_t num_idx, int64_t items_per_row) {
  RowConfig cfg;
  cfg.group_lanes = pow2_ceil(static_cast<int>(min64(max64(items_per_row, 1), kRowThreads)));
  cfg.rows_per_block = kRowThreads / cfg.group_lanes;
  cfg.blocks = min64(max64(ceil_div(num_idx, cfg.rows_per_block), 1), kRowMaxBlocks);
  return cfg;
}

template <typename T, typename I>
struct GatherArgs {
  const T* x;    // num_src_rows x F
  const I* idx;  // N
  T* out;        // N x F
  int64_t num_src_rows;
  int64_t num_idx;
  int64_t num_features;
};

// Thread `thread` of block `block`: its rows (block-strided), VEC features at a time.
template <typename T, typename I, int VEC>
LEO_HD void gather_thread(const GatherArgs<T, I>& a, const RowConfig& cfg, int64_t block,
                          int thread) {
  const int64_t vecs_per_row = a.num_features / VEC;
  const int lane = thread % cfg.group_lanes;
  const int64_t row_stride = cfg.blocks * cfg.rows_per_block;
  for (int64_t i = block * cfg.rows_per_block + thread / cfg.group_lanes; i < a.num_idx;
       i += row_stride) {
    const int64_t src_row = static_cast<int64_t>(load_ro(a.idx + i));
    const bool valid = src_row >= 0 && src_row < a.num_src_rows;
    T* dst = a.out + i * a.num_features;
    for (int64_t v = lane; v < vecs_per_row; v += cfg.group_lanes) {
      if (valid) {
        copy_vec<T, VEC>(dst + v * VEC, a.x + src_row * a.num_features + v * VEC);
      } else {
        const AccT<T> zeros[VEC] = {};
        store_vec<T, VEC>(dst + v * VEC, zeros);
      }
    }
  }
}

template <typename T, typename I>
struct ScatterArgs {
  const T* src;  // N x F
  const I* idx;  // N
  AccT<T>* acc;  // num_rows x F, zeroed by the caller
  int64_t num_rows;
  int64_t num_idx;
  int64_t num_features;
};

// Thread `thread` of block `block`: its source rows, one atomic per element.
template <typename T, typename I>
LEO_HD void scatter_add_thread(const ScatterArgs<T, I>& a, const RowConfig& cfg, int64_t block,
                               int thread) {
  const int lane = thread % cfg.group_lanes;
  const int64_t row_stride = cfg.blocks * cfg.rows_per_block;
  for (int64_t i = block * cfg.rows_per_block + thread / cfg.group_lanes; i < a.num_idx;
       i += row_stride) {
    const int64_t dst_row = static_cast<int64_t>(load_ro(a.idx + i));
    if (dst_row < 0 || dst_row >= a.num_rows) continue;
    const T* src = a.src + i * a.num_features;
    AccT<T>* dst = a.acc + dst_row * a.num_features;
    for (int64_t f = lane; f < a.num_features; f += cfg.group_lanes) {
      atomic_add(dst + f, NumTraits<T>::load(load_ro(src + f)));
    }
  }
}

}  // namespace leo
