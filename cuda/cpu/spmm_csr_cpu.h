// CPU CSR SpMM kernel: out[r] = sum over edges e of row r of values[e] * x[indices[e]].
//
// One pass per row and column tile, the edges of a row summed in CSR order (the reference's
// order up to the compiler's fused multiply-adds) into an accumulator tile. What makes it faster
// than a library SpMM on a graph larger than the cache: while one gathered row of x is
// accumulated, the row kPrefetchEdges edges ahead (possibly in the next output row) is already
// requested, so the random reads of x overlap instead of waiting one after the other. No torch
// headers: the binding (leo_cpu.cpp) calls spmm_rows on disjoint row ranges from several
// threads.
#pragma once

#include <cstdint>

namespace leo_cpu {

// Edges ahead whose row of x is prefetched (chosen by measurement: docs/results.md).
constexpr int64_t kPrefetchEdges = 8;
constexpr int64_t kCacheLine = 64;
// Columns of the widest tile: 64 float32 columns are one 256-byte row slice.
constexpr int kTile = 64;

// Requests the bytes [p, p + bytes) of a row of x, one cache line apart (a compile-time
// trip count for a fixed tile: the loop unrolls; a row slice that starts mid-line may leave
// its last line to the demand load).
inline void prefetch_row(const char* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += kCacheLine) __builtin_prefetch(p + b, 0, 3);
}

// One tile of columns [f0, f0 + w) for rows [r0, r1): W is the tile's width when known at
// compile time (the loop is then unrolled into vector registers), else 0 and w is used.
template <int W, typename T, typename Ptr, typename Idx>
void spmm_tile(const Ptr* indptr, const Idx* indices, const T* values, const T* x, int64_t width,
               int64_t f0, int64_t w, T* out, int64_t r0, int64_t r1) {
  const int64_t cols = W > 0 ? W : w;
  const int64_t bytes = cols * static_cast<int64_t>(sizeof(T));
  const int64_t last = static_cast<int64_t>(indptr[r1]);  // prefetch within these rows' edges
  for (int64_t r = r0; r < r1; ++r) {
    T acc[W > 0 ? W : kTile];
    for (int64_t k = 0; k < cols; ++k) acc[k] = T(0);
    const int64_t end = static_cast<int64_t>(indptr[r + 1]);
    for (int64_t e = static_cast<int64_t>(indptr[r]); e < end; ++e) {
      if (e + kPrefetchEdges < last) {
        const int64_t ahead = static_cast<int64_t>(indices[e + kPrefetchEdges]);
        prefetch_row(reinterpret_cast<const char*>(x + ahead * width + f0), bytes);
      }
      const T v = values[e];
      const T* row = x + static_cast<int64_t>(indices[e]) * width + f0;
#pragma GCC ivdep
      for (int64_t k = 0; k < cols; ++k) acc[k] += v * row[k];
    }
    T* dst = out + r * width + f0;
    for (int64_t k = 0; k < cols; ++k) dst[k] = acc[k];
  }
}

// Rows [r0, r1) of out (row-major, `width` columns): tiles of 64 columns, then the remaining
// columns in one more pass (a fixed-width tile for 8, 16 or 32 of them, a runtime width else),
// so every edge is visited at most ceil(width / 64) times.
template <typename T, typename Ptr, typename Idx>
void spmm_rows(const Ptr* indptr, const Idx* indices, const T* values, const T* x, int64_t width,
               T* out, int64_t r0, int64_t r1) {
  int64_t f0 = 0;
  for (; f0 + kTile <= width; f0 += kTile) {
    spmm_tile<kTile>(indptr, indices, values, x, width, f0, kTile, out, r0, r1);
  }
  const int64_t rest = width - f0;
  switch (rest) {
    case 0: break;
    case 8: spmm_tile<8>(indptr, indices, values, x, width, f0, rest, out, r0, r1); break;
    case 16: spmm_tile<16>(indptr, indices, values, x, width, f0, rest, out, r0, r1); break;
    case 32: spmm_tile<32>(indptr, indices, values, x, width, f0, rest, out, r0, r1); break;
    default: spmm_tile<0>(indptr, indices, values, x, width, f0, rest, out, r0, r1); break;
  }
}

}  // namespace leo_cpu
