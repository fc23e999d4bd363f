// The hub pass of spmm_csr.cuh as a kernel and a launcher, shared by the SpMM and the fused
// aggregation (which runs it once per side). Included by cuda/kernels/*.cu only.
#pragma once

#include "spmm_csr.cuh"

namespace leo {

constexpr int64_t kMaxGridX = 2147483647;
constexpr int64_t kMaxGridY = 65535;

template <typename T, typename I, int VEC>
__global__ void __launch_bounds__(kSpmmThreads)
    spmm_hub_kernel(const SpmmArgs<T, I> args, const SpmmConfig cfg, int64_t num_edges) {
  extern __shared__ __align__(16) unsigned char shared_raw[];
  AccT<T>* acc = reinterpret_cast<AccT<T>*>(shared_raw);
  const int64_t chunk = static_cast<int64_t>(blockIdx.x);
  const int64_t slice = static_cast<int64_t>(blockIdx.y);
  const int thread = static_cast<int>(threadIdx.x);
  hub_zero(cfg, thread, acc);
  __syncthreads();
  hub_accumulate<T, I, VEC>(args, cfg, num_edges, chunk, slice, thread, acc);
  __syncthreads();
  hub_store<T, I>(args, cfg, chunk, slice, thread, acc);
}

template <typename T, typename I, int VEC>
cudaError_t launch_hub_pass(const SpmmArgs<T, I>& args, const SpmmConfig& cfg,
                            int64_t num_edges, cudaStream_t stream) {
  if (cfg.hub_chunks > kMaxGridX || cfg.feature_slices > kMaxGridY) {
    return cudaErrorInvalidConfiguration;
  }
  const dim3 grid(static_cast<unsigned int>(cfg.hub_chunks),
                  static_cast<unsigned int>(cfg.feature_slices));
  const size_t smem = 2 * static_cast<size_t>(cfg.chunk_features) * sizeof(AccT<T>);
  spmm_hub_kernel<T, I, VEC><<<grid, cfg.threads, smem, stream>>>(args, cfg, num_edges);
  return cudaGetLastError();
}

}  // namespace leo
