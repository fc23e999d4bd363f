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

// Elements of T in one 16-byte vector (float4, 2 x double, 8 x bf16/fp16).
template <typename T>
constexpr int kMaxVec = kVectorBytes / static_cast<int>(sizeof(T));

LEO_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
LEO_HD int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
LEO_HD int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Smallest power of two >= v (v >= 1).
inline int pow2_ceil(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

inline bool is_aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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
// W == VEC > 1 is one 16-byte load (the caller guarantees a 16-byte aligned address), W == 1
// scalar loads (any alignment). A lane covers VEC features either way, so sides of one kernel
// can read with different widths.
template <typename T, int VEC, int W = VEC>
LEO_HD void load_vec(const T* p, AccT<T> (&out)[VEC]) {
  static_assert(W == VEC || W == 1, "a lane reads its features in one vector or one by one");
  if constexpr (W == 1) {
#pragma unroll
    for (int v = 0; v < VEC; ++v) out[v] = NumTraits<T>::load(load_ro(p + v));
  } else {
    static_assert(VEC * sizeof(T) == kVectorBytes, "vector loads are 16 bytes");
    const uint4 raw = load_ro(reinterpret_cast<const uint4*>(p));
    T vals[VEC];
    memcpy(vals, &raw, sizeof(raw));
#pragma unroll
    for (int v = 0; v < VEC; ++v) out[v] = NumTraits<T>::load(vals[v]);
  }
}

template <typename T, int VEC>
LEO_HD void store_vec(T* p, const AccT<T> (&in)[VEC]) {
  if constexpr (VEC == 1) {
    p[0] = NumTraits<T>::store(in[0]);
  } else {
    T vals[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) vals[v] = NumTraits<T>::store(in[v]);
    uint4 raw;
    memcpy(&raw, vals, sizeof(raw));
    *reinterpret_cast<uint4*>(p) = raw;
  }
}

// Byte copy of VEC elements (no conversion): gathers move data, they do not compute.
template <typename T, int VEC>
LEO_HD void copy_vec(T* dst, const T* src) {
  if constexpr (VEC == 1) {
    dst[0] = src[0];
  } else {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  }
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

// acc[v] += sum over edges [begin, end) of values[e] * x_CF[indices[e], f + v], x read W
// elements at a time (see load_vec). Two edges per iteration so both gathers are in flight
// before either is used: most rows are short, and this is where their latency hides.
template <typename T, typename I, int VEC, int W = VEC>
LEO_HD void accumulate_edges(const I* __restrict__ indices, const T* __restrict__ values,
                             const T* __restrict__ x_CF,
                             int64_t num_features, int64_t f, int64_t begin, int64_t end,
                             AccT<T> (&acc)[VEC]) {
  using Acc = AccT<T>;
  int64_t e = begin;
  for (; e + 1 < end; e += 2) {
    const int64_t c0 = static_cast<int64_t>(load_ro(indices + e));
    const int64_t c1 = static_cast<int64_t>(load_ro(indices + e + 1));
    const Acc w0 = NumTraits<T>::load(load_ro(values + e));
    const Acc w1 = NumTraits<T>::load(load_ro(values + e + 1));
    Acc x0[VEC];
    Acc x1[VEC];
    load_vec<T, VEC, W>(x_CF + c0 * num_features + f, x0);
    load_vec<T, VEC, W>(x_CF + c1 * num_features + f, x1);
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] += w0 * x0[v] + w1 * x1[v];
  }
  if (e < end) {
    const int64_t c0 = static_cast<int64_t>(load_ro(indices + e));
    const Acc w0 = NumTraits<T>::load(load_ro(values + e));
    Acc x0[VEC];
    load_vec<T, VEC, W>(x_CF + c0 * num_features + f, x0);
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] += w0 * x0[v];
  }
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

// Calls fn(VecTag<16 bytes / sizeof(T)>{}) when rows can be read as 16-byte vectors, else
// fn(VecTag<1>{}).
template <typename T, typename Fn>
cudaError_t dispatch_vec(bool use_vectors, Fn fn) {
  if (use_vectors) return fn(VecTag<kMaxVec<T>>{});
  return fn(VecTag<1>{});
}

// Rows of width F can be read as 16-byte vectors when F is a multiple of the vector width and
// every base pointer is 16-byte aligned (a sliced tensor may not be).
template <typename T>
bool can_use_vectors(int64_t num_features, const void* a, const void* b,
                     const void* c = nullptr) {
  if (num_features % kMaxVec<T> != 0) return false;
  return is_aligned16(a) && is_aligned16(b) && (c == nullptr || is_aligned16(c));
}

}  // namespace leo
