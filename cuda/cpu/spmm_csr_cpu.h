// CPU CSR SpMM kernel: out[r] = sum over edges e of row r of values[e] * x[indices[e]].
//
// One pass per row and column tile, the edges of a row summed in CSR order (the reference's
// order up to the compiler's fused multiply-adds). What makes it faster than a library SpMM on
// a graph larger than the cache: while one gathered row of x is accumulated, the row that
// kPrefetchEdges edges ahead (possibly in the next output row) is already requested, so the
// random reads of x overlap instead of waiting one after the other. No torch headers: the
// binding (leo_cpu.cpp) calls spmm_rows on disjoint row ranges from several threads.
#pragma once

#include <cstdint>

namespace leo_cpu {

// Edges ahead whose row of x is prefetched (measured on the default bench graph: 4 and 16
// within 5% of 8; none is 1.6x slower at 64 columns).
constexpr int64_t kPrefetchEdges = 8;
constexpr int kCacheLine = 64;

// One tile of W columns starting at column f0, for rows [r0, r1).
template <int W, typename T, typename Ptr, typename Idx>
void spmm_tile(const Ptr* indptr, const Idx* indices, const T* values, const T* x, int64_t width,
               int64_t f0, T* out, int64_t r0, int64_t r1, int64_t num_edges) {
  for (int64_t r = r0; r < r1; ++r) {
    T acc[W];
    for (int k = 0; k < W; ++k) acc[k] = T(0);
    const int64_t end = static_cast<int64_t>(indptr[r + 1]);
    for (int64_t e = static_cast<int64_t>(indptr[r]); e < end; ++e) {
      if (e + kPrefetchEdges < num_edges) {
        const char* ahead = reinterpret_cast<const char*>(
            x + static_cast<int64_t>(indices[e + kPrefetchEdges]) * width + f0);
        for (int b = 0; b < static_cast<int>(W * sizeof(T)); b += kCacheLine) {
          __builtin_prefetch(ahead + b, 0, 3);
        }
      }
      const T w = values[e];
      const T* row = x + static_cast<int64_t>(indices[e]) * width + f0;
#pragma GCC ivdep
      for (int k = 0; k < W; ++k) acc[k] += w * row[k];
    }
    T* dst = out + r * width + f0;
    for (int k = 0; k < W; ++k) dst[k] = acc[k];
  }
}

// Rows [r0, r1) of out (row-major, `width` columns): tiles of 64 columns, then the remaining
// columns in tiles of 32, 16, 8, 4, 2 and 1.
template <typename T, typename Ptr, typename Idx>
void spmm_rows(const Ptr* indptr, const Idx* indices, const T* values, const T* x, int64_t width,
               T* out, int64_t r0, int64_t r1, int64_t num_edges) {
  int64_t f0 = 0;
  for (; f0 + 64 <= width; f0 += 64) {
    spmm_tile<64>(indptr, indices, values, x, width, f0, out, r0, r1, num_edges);
  }
  const int64_t rest = width - f0;
  if (rest & 32) { spmm_tile<32>(indptr, indices, values, x, width, f0, out, r0, r1, num_edges); f0 += 32; }
  if (rest & 16) { spmm_tile<16>(indptr, indices, values, x, width, f0, out, r0, r1, num_edges); f0 += 16; }
  if (rest & 8) { spmm_tile<8>(indptr, indices, values, x, width, f0, out, r0, r1, num_edges); f0 += 8; }
  if (rest & 4) { spmm_tile<4>(indptr, indices, values, x, width, f0, out, r0, r1, num_edges); f0 += 4; }
  if (rest & 2) { spmm_tile<2>(indptr, indices, values, x, width, f0, out, r0, r1, num_edges); f0 += 2; }
  if (rest & 1) { spmm_tile<1>(indptr, indices, values, x, width, f0, out, r0, r1, num_edges); }
}

}  // namespace leo_cpu
