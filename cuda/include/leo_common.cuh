// Device helpers shared by LEO's kernels: numeric traits (storage type -> accumulator),
// 16-byte vector loads and stores, an atomic add that also runs on the host, and the
// dtype/index-type dispatch used by every launcher.
//
// Per-thread kernel bodies are written as __host__ __device__ functions so that
// cuda/tests/host_emulation.cu can run them on the CPU, thread by thread, against a plain
// reference; the __global__ wrappers in cuda/kernels/ only add the launch and the barriers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "leo_api.cuh"

#define LEO_HD __host__ __device__ __forceinline__

namespace leo {

constexpr int kWarpSize = 32;
constexpr int kVectorBytes = 16;

// Storage type -> accumulator type and conversions. fp16/bf16 accumulate in fp32 so a long row
// does not lose precision to rounding on every add.
template <typename T>
struct NumTraits;

template <>
struct NumTraits<float> {
  using Acc = float;
  static LEO_HD Acc load(float v) { return v; }
  static LEO_HD float store(Acc v) { return v; }
};

template <>
struct NumTraits<double> {
  using Acc = double;
  static LEO_HD Acc load(double v) { return v; }
  static LEO_HD double store(Acc v) { return v; }
};

template <>
struct NumTraits<__half> {
  using Acc = float;
  static LEO_HD Acc load(__half v) { return __half2float(v); }
  static LEO_HD __half store(Acc v) { return __float2half_rn(v); }
};

template <>
struct NumTraits<__nv_bfloat16> {
  using Acc = float;
  static LEO_HD Acc load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static LEO_HD __nv_bfloat16 store(Acc v) { return __float2bfloat16_rn(v); }
};

template <typename T>
using AccT = typename NumTraits<T>::Acc;

// Elements of T in one 16-byte vector (float4, 2 x double, 8 x bf16/fp16), and in one 8-byte
// vector (float2, 4 x bf16/fp16; 1 for double: no 8-byte vector of it).
template <typename T>
constexpr int kMaxVec = kVectorBytes / static_cast<int>(sizeof(T));
template <typename T>
constexpr int kHalfVec = kVectorBytes / 2 / static_cast<int>(sizeof(T));

// The unsigned word that moves VEC elements of T in one load or store (16 or 8 bytes).
template <int BYTES>
struct VecWord;
template <>
struct VecWord<16> {
  using type = uint4;
};
template <>
struct VecWord<8> {
  using type = uint2;
};

LEO_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
LEO_HD int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
LEO_HD int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Smallest power of two >= v (v >= 1).
inline int pow2_ceil(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

inline bool is_aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// Read-only load: through the non-coherent (texture) path on the device. Kernels only read
// inputs they never write, so the stale-cache hazard of that path does not arise.
template <typename V>
LEO_HD V load_ro(const V* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}

// VEC consecutive elements starting at p, converted to the accumulator type, read W at a time:
// W == VEC > 1 is one 16- or 8-byte load (VEC * sizeof(T) bytes; the caller guarantees an
// address aligned to that size), W == 1 scalar loads (any alignment). A lane covers VEC
// features either way, so sides of one kernel can read with different widths.
template <typename T, int VEC, int W = VEC>
LEO_HD void load_vec(const T* p, AccT<T> (&out)[VEC]) {
  static_assert(W == VEC || W == 1, "a lane reads its features in one vector or one by one");
  if constexpr (W == 1) {
#pragma unroll
    for (int v = 0; v < VEC; ++v) out[v] = NumTraits<T>::load(load_ro(p + v));
  } else {
    using Word = typename VecWord<VEC * sizeof(T)>::type;
    const Word raw = load_ro(reinterpret_cast<const Word*>(p));
    T vals[VEC];
    memcpy(vals, &raw, sizeof(raw));
#pragma unroll
    for (int v = 0; v < VEC; ++v) out[v] = NumTraits<T>::load(vals[v]);
  }
}

// Stores VEC accumulators at p as T, W at a time (as load_vec reads them).
template <typename T, int VEC, int W = VEC>
LEO_HD void store_vec(T* p, const AccT<T> (&in)[VEC]) {
  static_assert(W == VEC || W == 1, "a lane writes its features in one vector or one by one");
  if constexpr (W == 1) {
#pragma unroll
    for (int v = 0; v < VEC; ++v) p[v] = NumTraits<T>::store(in[v]);
  } else {
    using Word = typename VecWord<VEC * sizeof(T)>::type;
    T vals[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) vals[v] = NumTraits<T>::store(in[v]);
    Word raw;
    memcpy(&raw, vals, sizeof(raw));
    *reinterpret_cast<Word*>(p) = raw;
  }
}

// Byte copy of VEC elements (no conversion): gathers move data, they do not compute.
template <typename T, int VEC>
LEO_HD void copy_vec(T* dst, const T* src) {
  if constexpr (VEC == 1) {
    dst[0] = src[0];
  } else {
    using Word = typename VecWord<VEC * sizeof(T)>::type;
    *reinterpret_cast<Word*>(dst) = *reinterpret_cast<const Word*>(src);
  }
}

// Host emulation counter of the index loads made by accumulate_edge_slices:
// cuda/tests/host_emulation.cu checks with it that a lane reads each edge's index once per pass
// over its feature slices, not once per slice. Not compiled into device code.
inline int64_t& host_index_loads() {
  static int64_t loads = 0;
  return loads;
}

template <typename I>
LEO_HD int64_t load_index(const I* p) {
#ifndef __CUDA_ARCH__
  ++host_index_loads();
#endif
  return static_cast<int64_t>(load_ro(p));
}

// Host emulation hook: when set, host-side atomic_add calls it instead of adding in place, so
// cuda/tests/host_emulation.cu can tell atomic updates from plain stores (its race check gives
// every emulated thread a private copy of memory and merges the copies at each barrier).
template <typename A>
using HostAtomicHook = void (*)(A* addr, A value);

template <typename A>
inline HostAtomicHook<A>& host_atomic_hook() {
  static HostAtomicHook<A> hook = nullptr;
  return hook;
}

// atomicAdd on the device; on the host a plain add, or the emulation's hook when one is set.
template <typename A>
LEO_HD void atomic_add(A* addr, A value) {
#ifdef __CUDA_ARCH__
  atomicAdd(addr, value);
#else
  HostAtomicHook<A> hook = host_atomic_hook<A>();
  if (hook != nullptr) {
    hook(addr, value);
  } else {
    *addr += value;
  }
#endif
}

// For each of the first `slices` of S feature slices (slice s starts at feature f + s * stride):
// acc[s][v] += sum over edges [begin, end) of values[e] * x_CF[indices[e], f + s * stride + v],
// x read W elements at a time (see load_vec). An edge's index and value are loaded once and
// used for every slice, so a lane that covers several slices of a wide row reads the row's
// indices once per pass, not once per slice. Two edges per iteration so both gathers are in
// flight before either is used: most rows are short, and this is where their latency hides.
template <typename T, typename I, int VEC, int W, int S>
LEO_HD void accumulate_edge_slices(const I* __restrict__ indices, const T* __restrict__ values,
                                   const T* __restrict__ x_CF, int64_t num_features, int64_t f,
                                   int64_t stride, int slices, int64_t begin, int64_t end,
                                   AccT<T> (&acc)[S][VEC]) {
  using Acc = AccT<T>;
  int64_t e = begin;
  for (; e + 1 < end; e += 2) {
    const T* row0 = x_CF + load_index(indices + e) * num_features + f;
    const T* row1 = x_CF + load_index(indices + e + 1) * num_features + f;
    const Acc w0 = NumTraits<T>::load(load_ro(values + e));
    const Acc w1 = NumTraits<T>::load(load_ro(values + e + 1));
#pragma unroll
    for (int s = 0; s < S; ++s) {
      if (s < slices) {
        Acc x0[VEC];
        Acc x1[VEC];
        load_vec<T, VEC, W>(row0 + s * stride, x0);
        load_vec<T, VEC, W>(row1 + s * stride, x1);
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[s][v] += w0 * x0[v] + w1 * x1[v];
      }
    }
  }
  if (e < end) {
    const T* row0 = x_CF + load_index(indices + e) * num_features + f;
    const Acc w0 = NumTraits<T>::load(load_ro(values + e));
#pragma unroll
    for (int s = 0; s < S; ++s) {
      if (s < slices) {
        Acc x0[VEC];
        load_vec<T, VEC, W>(row0 + s * stride, x0);
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[s][v] += w0 * x0[v];
      }
    }
  }
}

// One feature slice: acc[v] += sum over edges [begin, end) of values[e] * x_CF[indices[e], f + v].
template <typename T, typename I, int VEC, int W = VEC>
LEO_HD void accumulate_edges(const I* __restrict__ indices, const T* __restrict__ values,
                             const T* __restrict__ x_CF, int64_t num_features, int64_t f,
                             int64_t begin, int64_t end, AccT<T> (&acc)[VEC]) {
  AccT<T> one[1][VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) one[0][v] = acc[v];
  accumulate_edge_slices<T, I, VEC, W, 1>(indices, values, x_CF, num_features, f, 0, 1, begin,
                                          end, one);
#pragma unroll
  for (int v = 0; v < VEC; ++v) acc[v] = one[0][v];
}

// The row r in [lo, hi) with indptr[r] <= e < indptr[r + 1], given indptr[lo] <= e < indptr[hi].
template <typename I>
LEO_HD int64_t find_row(const I* indptr, int64_t lo, int64_t hi, int64_t e) {
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(indptr[mid]) <= e) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// ---- dispatch: runtime (dtype, index type, vector width) -> template instantiation ----

template <typename T>
struct Tag {
  using type = T;
};

template <int V>
struct VecTag {
  static constexpr int value = V;
};

template <typename T, typename Fn>
cudaError_t dispatch_index(IndexType index_type, Fn& fn) {
  if (index_type == IndexType::kInt32) return fn(Tag<T>{}, Tag<int32_t>{});
  return fn(Tag<T>{}, Tag<int64_t>{});
}

// Calls fn(Tag<T>{}, Tag<I>{}) for the storage and index types named at run time.
template <typename Fn>
cudaError_t dispatch_types(DType dtype, IndexType index_type, Fn fn) {
  switch (dtype) {
    case DType::kFloat32:
      return dispatch_index<float>(index_type, fn);
    case DType::kFloat64:
      return dispatch_index<double>(index_type, fn);
    case DType::kFloat16:
      return dispatch_index<__half>(index_type, fn);
    case DType::kBFloat16:
      return dispatch_index<__nv_bfloat16>(index_type, fn);
  }
  return cudaErrorInvalidValue;
}

// Lane width VEC (features a lane covers) and the load/store width of each of two sides (VEC or
// 1). VEC is a 16- or 8-byte vector of T that divides F: rows of width F then start at
// multiples of it from their buffer's base, so a side whose base is aligned to VEC * sizeof(T)
// bytes reads (or writes) whole vectors and an unaligned side reads its VEC elements one by
// one, without slowing the other side down. The widest VEC at which both sides are aligned
// wins; failing that, the widest at which one side is (`first` or `second`, or only `second`
// with `second_required`, which keeps `second` always vectorised: VEC falls back until it is
// aligned, down to scalars).
struct LaneWidths {
  int vec;
  int first;
  int second;
};

template <typename T>
inline LaneWidths lane_widths(int64_t num_features, const void* first, const void* second,
                              bool second_required = false) {
  const int candidates[2] = {kMaxVec<T>, kHalfVec<T>};
  for (int pass = 0; pass < 2; ++pass) {
    for (int vec : candidates) {
      if (vec < 2 || num_features % vec != 0) continue;
      const int64_t bytes = vec * static_cast<int64_t>(sizeof(T));
      const bool a = is_aligned(first, bytes);
      const bool b = is_aligned(second, bytes);
      if (pass == 0 ? (a && b) : ((a || b) && (b || !second_required))) {
        return LaneWidths{vec, a ? vec : 1, b ? vec : 1};
      }
    }
  }
  return LaneWidths{1, 1, 1};
}

// Calls fn(VecTag<VEC>{}, VecTag<first width>{}, VecTag<second width>{}) for `w`.
template <typename T, typename Fn>
cudaError_t dispatch_lane_widths(const LaneWidths& w, Fn fn) {
  constexpr int kFull = kMaxVec<T>;
  constexpr int kHalf = kHalfVec<T> > 1 ? kHalfVec<T> : kFull;  // double: no 8-byte vector
  if (w.vec == kFull) {
    if (w.first == 1) return fn(VecTag<kFull>{}, VecTag<1>{}, VecTag<kFull>{});
    if (w.second == 1) return fn(VecTag<kFull>{}, VecTag<kFull>{}, VecTag<1>{});
    return fn(VecTag<kFull>{}, VecTag<kFull>{}, VecTag<kFull>{});
  }
  if (w.vec == kHalf) {
    if (w.first == 1) return fn(VecTag<kHalf>{}, VecTag<1>{}, VecTag<kHalf>{});
    if (w.second == 1) return fn(VecTag<kHalf>{}, VecTag<kHalf>{}, VecTag<1>{});
    return fn(VecTag<kHalf>{}, VecTag<kHalf>{}, VecTag<kHalf>{});
  }
  return fn(VecTag<1>{}, VecTag<1>{}, VecTag<1>{});
}

// The widest vector (16 or 8 bytes, else 1) that divides F and at which both buffers are
// aligned: gathers copy whole words from one side to the other.
template <typename T>
inline int common_width(int64_t num_features, const void* a, const void* b) {
  for (int vec : {kMaxVec<T>, kHalfVec<T>}) {
    const int64_t bytes = vec * static_cast<int64_t>(sizeof(T));
    if (vec > 1 && num_features % vec == 0 && is_aligned(a, bytes) && is_aligned(b, bytes)) {
      return vec;
    }
  }
  return 1;
}

// Calls fn(VecTag<vec>{}) for a width returned by common_width.
template <typename T, typename Fn>
cudaError_t dispatch_width(int vec, Fn fn) {
  constexpr int kHalf = kHalfVec<T> > 1 ? kHalfVec<T> : kMaxVec<T>;
  if (vec == kMaxVec<T>) return fn(VecTag<kMaxVec<T>>{});
  if (vec == kHalf) return fn(VecTag<kHalf>{});
  return fn(VecTag<1>{});
}

}  // namespace leo
