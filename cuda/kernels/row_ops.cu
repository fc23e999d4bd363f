// Row gather and row scatter-add kernels and their launchers. See row_ops.cuh.
#include "row_ops.cuh"

namespace leo {
namespace {

template <typename T, typename I, int VEC>
__global__ void __launch_bounds__(kRowThreads)
    gather_rows_kernel(const GatherArgs<T, I> args, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    gather_item<T, I, VEC>(args, t);
  }
}

template <typename T, typename I>
__global__ void __launch_bounds__(kRowThreads)
    scatter_add_rows_kernel(const ScatterArgs<T, I> args, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    scatter_add_item<T, I>(args, t);
  }
}

}  // namespace

cudaError_t launch_gather_rows(DType dtype, IndexType index_type, const void* x, const void* idx_N,
                               void* out_NF, int64_t num_idx, int64_t num_features,
                               cudaStream_t stream) {
  if (num_idx == 0 || num_features == 0) return cudaSuccess;
  return dispatch_types(dtype, index_type, [&](auto type_tag, auto index_tag) {
    using T = typename decltype(type_tag)::type;
    using I = typename decltype(index_tag)::type;
    GatherArgs<T, I> args;
    args.x = static_cast<const T*>(x);
    args.idx = static_cast<const I*>(idx_N);
    args.out = static_cast<T*>(out_NF);
    args.num_idx = num_idx;
    args.num_features = num_features;
    const bool vectors = can_use_vectors<T>(num_features, x, out_NF);
    return dispatch_vec<T>(vectors, [&](auto vec_tag) {
      constexpr int VEC = decltype(vec_tag)::value;
      const int64_t total = num_idx * (num_features / VEC);
      const dim3 grid(static_cast<unsigned int>(row_op_blocks(total)));
      gather_rows_kernel<T, I, VEC><<<grid, kRowThreads, 0, stream>>>(args, total);
      return cudaGetLastError();
    });
  });
}

cudaError_t launch_scatter_add_rows(DType dtype, IndexType index_type, const void* src_NF,
                                    const void* idx_N, void* acc, int64_t num_idx,
                                    int64_t num_features, cudaStream_t stream) {
  if (num_idx == 0 || num_features == 0) return cudaSuccess;
  return dispatch_types(dtype, index_type, [&](auto type_tag, auto index_tag) {
    using T = typename decltype(type_tag)::type;
    using I = typename decltype(index_tag)::type;
    ScatterArgs<T, I> args;
    args.src = static_cast<const T*>(src_NF);
    args.idx = static_cast<const I*>(idx_N);
    args.acc = static_cast<AccT<T>*>(acc);
    args.num_idx = num_idx;
    args.num_features = num_features;
    const int64_t total = num_idx * num_features;
    const dim3 grid(static_cast<unsigned int>(row_op_blocks(total)));
    scatter_add_rows_kernel<T, I><<<grid, kRowThreads, 0, stream>>>(args, total);
    return cudaGetLastError();
  });
}

}  // namespace leo
