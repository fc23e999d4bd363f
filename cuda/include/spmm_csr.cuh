// CSR SpMM, one lane group per row: out_RF[i] = sum_e values[e] * x_CF[indices[e]].
//
// A lane group of G lanes (G a power of two, at most a warp) owns one row; each lane owns VEC
// consecutive features and reads them with one 16-byte load when the width allows. When F
// needs fewer than 32 lanes, one warp serves several rows at once; for graphs whose rows are
// short on average, G is halved again so that a warp keeps more rows (and more independent
// index loads) in flight, each lane then covering two vectors of the row.
//
// Shape suffixes: R rows, C columns, E edges, F features.
#pragma once

#include "leo_common.cuh"

namespace leo {

constexpr int kSpmmThreads = 256;
// Below this mean degree a row is "short": its index loads dominate, not its features.
constexpr int64_t kShortRowDegree = 8;

struct SpmmConfig {
  int group_lanes;     // G: lanes per row
  int rows_per_block;  // threads / G
  int threads;
  int64_t blocks;
};

inline SpmmConfig make_spmm_config(int64_t num_rows, int64_t num_edges, int64_t num_features,
                                   int vec) {
  const int lanes_needed = static_cast<int>(min64(kWarpSize, ceil_div(num_features, vec)));
  int lanes = pow2_ceil(lanes_needed < 1 ? 1 : lanes_needed);
  const int64_t mean_degree = num_edges / max64(num_rows, 1);
  if (mean_degree < kShortRowDegree && lanes > 4) lanes /= 2;
  SpmmConfig cfg;
  cfg.group_lanes = lanes;
  cfg.threads = kSpmmThreads;
  cfg.rows_per_block = kSpmmThreads / lanes;
  cfg.blocks = ceil_div(num_rows, cfg.rows_per_block);
  return cfg;
}

template <typename T, typename I>
struct SpmmArgs {
  const I* indptr;   // R+1
  const I* indices;  // E
  const T* values;   // E
  const T* x;        // C x F
  T* out;            // R x F
  int64_t num_rows;
  int64_t num_features;
};

// The work of thread `thread` of block `block`: its row, its VEC-feature slices of that row.
template <typename T, typename I, int VEC>
LEO_HD void spmm_thread(const SpmmArgs<T, I>& a, const SpmmConfig& cfg, int64_t block,
                        int thread) {
  const int64_t row = block * cfg.rows_per_block + thread / cfg.group_lanes;
  if (row >= a.num_rows) return;
  const int lane = thread % cfg.group_lanes;
  const int64_t begin = static_cast<int64_t>(a.indptr[row]);
  const int64_t end = static_cast<int64_t>(a.indptr[row + 1]);
  const int64_t stride = static_cast<int64_t>(cfg.group_lanes) * VEC;
  for (int64_t f = static_cast<int64_t>(lane) * VEC; f < a.num_features; f += stride) {
    AccT<T> acc[VEC] = {};
    accumulate_edges<T, I, VEC>(a.indices, a.values, a.x, a.num_features, f, begin, end, acc);
    store_vec<T, VEC>(a.out + row * a.num_features + f, acc);
  }
}

}  // namespace leo
