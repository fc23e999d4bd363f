// Row gather and row scatter-add kernels and their launchers. See row_ops.cuh.
#include "row_ops.cuh"

namespace leo {
namespace {

template <typename T, typename I, int VEC>
__global__ void __launch_bounds__(kRowThreads)
    gather_rows_kernel(const GatherArgs<T, I> args, const RowConfig cfg) {
  gather_thread<T, I, VEC>(args, cfg, static_cast<int64_t>(blockIdx.x),
                           static_cast<int>(threadIdx.x));
}

template <typename T, typename I>
__global__ void __launch_bounds__(kRowThreads)
    scatter_add_rows_kernel(const ScatterArgs<T, I> args, const RowConfig cfg) {
  scatter_add_thread<T, I>(args, cfg, static_cast<int64_t>(blockIdx.x),
                           static_cast<int>(threadIdx.x));
}

}  // namespace

cudaError_t launch_gather_rows(DType dtype, IndexType index_type, const void* x_CF,
                               int64_t num_src_rows, const void* idx_N, void* out_NF,
                               int64_t num_idx, int64_t num_features, cudaStream_t stream) {
  if (num_idx == 0 || num_features == 0) return cudaSuccess;
  return dispatch_types(dtype, index_type, [&](auto type_tag, auto index_tag) {
    using T = typename decltype(type_tag)::type;
    using I = typename decltype(index_tag)::type;
    GatherArgs<T, I> args;
    args.x = static_cast<const T*>(x_CF);
    args.idx = static_cast<const I*>(idx_N);
    args.out = static_cast<T*>(out_NF);
    args.num_src_rows = num_src_rows;
    args.num_idx = num_idx;
    args.num_features = num_features;
    return dispatch_width<T>(common_width<T>(num_features, x_CF, out_NF), [&](auto vec_tag) {
      constexpr int VEC = decltype(vec_tag)::value;
      const RowConfig cfg = make_row_config(num_idx, num_features / VEC);
      const dim3 grid(static_cast<unsigned int>(cfg.blocks));
      gather_rows_kernel<T, I, VEC><<<grid, kRowThreads, 0, stream>>>(args, cfg);
      return cudaGetLastError();
    });
  });
}

cudaError_t launch_scatter_add_rows(DType dtype, IndexType index_type, const void* src_NF,
                                    const void* idx_N, void* acc, int64_t num_rows,
                                    int64_t num_idx, int64_t num_features, cudaStream_t stream) {
  if (num_idx == 0 || num_features == 0) return cudaSuccess;
  return dispatch_types(dtype, index_type, [&](auto type_tag, auto index_tag) {
    using T = typename decltype(type_tag)::type;
    using I = typename decltype(index_tag)::type;
    ScatterArgs<T, I> args;
    args.src = static_cast<const T*>(src_NF);
    args.idx = static_cast<const I*>(idx_N);
    args.acc = static_cast<AccT<T>*>(acc);
    args.num_rows = num_rows;
    args.num_idx = num_idx;
    args.num_features = num_features;
    const RowConfig cfg = make_row_config(num_idx, num_features);
    const dim3 grid(static_cast<unsigned int>(cfg.blocks));
    scatter_add_rows_kernel<T, I><<<grid, kRowThreads, 0, stream>>>(args, cfg);
    return cudaGetLastError();
  });
}

}  // namespace leo
