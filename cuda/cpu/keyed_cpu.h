// Counter-based random numbers for the CPU kernels: leo_cli/util/keyed.py's splitmix64 in
// uint64 arithmetic (the same bits as its int64 tensors, whose multiplications wrap).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace leo_cpu {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kMul1 = 0xBF58476D1CE4E5B9ULL;
constexpr uint64_t kMul2 = 0x94D049BB133111EBULL;
constexpr uint64_t kColumnSalt = 0x5851F42D4C957F2DULL;

// The splitmix64 finaliser.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * kMul1;
  z = (z ^ (z >> 27)) * kMul2;
  return z ^ (z >> 31);
}

// One splitmix64 step: the golden-ratio increment, then the finaliser.
inline uint64_t splitmix64(uint64_t z) { return mix64(z + kGolden); }

// The hash of the g-th group of eight columns (random_bytes' col_G).
inline uint64_t column_hash(int64_t g) {
  return splitmix64(static_cast<uint64_t>(g) + kColumnSalt);
}

// Bit k set where byte k of `bytes` is at least the threshold byte `thr` (every byte of
// `thr8` holds it), for the eight bytes at once: (x | 0x80) - (t & 0x7f) never borrows from the
// next byte, and its high bit says x's low seven bits are at least t's.
inline unsigned keep_bits(uint64_t bytes, uint64_t thr8) {
  constexpr uint64_t kHigh = 0x8080808080808080ULL;
  const uint64_t low = (bytes | kHigh) - (thr8 & ~kHigh);
  const uint64_t ge = ((bytes & ~thr8) | (~(bytes ^ thr8) & low)) & kHigh;
  return static_cast<unsigned>(((ge >> 7) * 0x0102040810204080ULL) >> 56);  // bit 0 of byte k
}

// The multipliers of eight columns for each pattern of keep bits: entry 8p + k is `kept`
// where bit k of p is set, else 0.
template <typename M>
std::vector<M> multiplier_table(M kept) {
  std::vector<M> table(256 * 8);
  for (int p = 0; p < 256; ++p) {
    for (int k = 0; k < 8; ++k) table[8 * p + k] = ((p >> k) & 1) ? kept : M(0);
  }
  return table;
}

// One row's multipliers (`table`'s entries, 8 per group of columns) into m: the row's hash
// under `key`, then per group one 64-bit hash whose byte k decides column 8g + k.
template <typename M>
void row_multipliers(int64_t id, uint64_t key, const uint64_t* column, int64_t groups, int thr,
                     const M* table, M* m) {
  const uint64_t thr8 = static_cast<uint64_t>(thr) * 0x0101010101010101ULL;
  const uint64_t row = splitmix64(static_cast<uint64_t>(id) ^ key);
  for (int64_t g = 0; g < groups; ++g) {
    const M* pattern = table + 8 * keep_bits(mix64(row ^ column[g]), thr8);
    for (int k = 0; k < 8; ++k) m[8 * g + k] = pattern[k];
  }
}

// The hashes of the groups of eight columns of a row `cols` wide.
inline std::vector<uint64_t> column_hashes(int64_t cols) {
  std::vector<uint64_t> column((cols + 7) / 8);
  for (size_t g = 0; g < column.size(); ++g) column[g] = column_hash(static_cast<int64_t>(g));
  return column;
}

}  // namespace leo_cpu
