// Counter-based random numbers for the CPU kernels: leo_cli/util/keyed.py's splitmix64 in
// uint64 arithmetic (the same bits as its int64 tensors, whose multiplications wrap).
#pragma once

#include <cstdint>

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

}  // namespace leo_cpu
