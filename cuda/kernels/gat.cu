// Graph attention kernels and their launchers. See gat.cuh.
#include "gat.cuh"

namespace leo {
namespace {

// One grid-stride kernel per item function: the items are independent.
template <typename Args, void (*Item)(const Args&, int64_t)>
__global__ void __launch_bounds__(kGatThreads) gat_kernel(const Args args, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    Item(args, t);
  }
}

template <typename Args, void (*Item)(const Args&, int64_t)>
cudaError_t launch_items(const Args& args, int64_t total, cudaStream_t stream) {
  if (total == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(gat_blocks(total)));
  gat_kernel<Args, Item><<<grid, kGatThreads, 0, stream>>>(args, total);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_gat_scores(DType dtype, IndexType index_type, const void* indptr,
                              const void* indices, const void* a_src_CH, const void* a_dst_RH,
                              void* scores_EH, int64_t num_rows, int64_t num_heads,
                              double negative_slope, cudaStream_t stream) {
  return dispatch_types(dtype, index_type, [&](auto type_tag, auto index_tag) {
    using T = typename decltype(type_tag)::type;
    using I = typename decltype(index_tag)::type;
    GatScoresArgs<T, I> args;
    args.indptr = static_cast<const I*>(indptr);
    args.indices = static_cast<const I*>(indices);
    args.a_src = static_cast<const T*>(a_src_CH);
    args.a_dst = static_cast<const T*>(a_dst_RH);
    args.scores = static_cast<T*>(scores_EH);
    args.num_heads = num_heads;
    args.negative_slope = negative_slope;
    return launch_items<GatScoresArgs<T, I>, gat_scores_item<T, I>>(args, num_rows * num_heads,
                                                                    stream);
  });
}

cudaError_t launch_edge_softmax(DType dtype, IndexType index_type, const void* indptr,
                                const void* scores_EH, void* alpha_EH, int64_t num_rows,
                                int64_t num_heads, cudaStream_t stream) {
  return dispatch_types(dtype, index_type, [&](auto type_tag, auto index_tag) {
    using T = typename decltype(type_tag)::type;
    using I = typename decltype(index_tag)::type;
    EdgeSoftmaxArgs<T, I> args;
    args.indptr = static_cast<const I*>(indptr);
    args.scores = static_cast<const T*>(scores_EH);
    args.alpha = static_cast<T*>(alpha_EH);
    args.num_heads = num_heads;
    return launch_items<EdgeSoftmaxArgs<T, I>, edge_softmax_item<T, I>>(
        args, num_rows * num_heads, stream);
  });
}

cudaError_t launch_gat_spmm(DType dtype, IndexType index_type, const void* indptr,
                            const void* indices, const void* alpha_EH, const void* x_CHF,
                            void* out_RHF, int64_t num_rows, int64_t num_heads,
                            int64_t num_features, cudaStream_t stream) {
  return dispatch_types(dtype, index_type, [&](auto type_tag, auto index_tag) {
    using T = typename decltype(type_tag)::type;
    using I = typename decltype(index_tag)::type;
    GatSpmmArgs<T, I> args;
    args.indptr = static_cast<const I*>(indptr);
    args.indices = static_cast<const I*>(indices);
    args.alpha = static_cast<const T*>(alpha_EH);
    args.x = static_cast<const T*>(x_CHF);
    args.out = static_cast<T*>(out_RHF);
    args.num_heads = num_heads;
    args.num_features = num_features;
    return launch_items<GatSpmmArgs<T, I>, gat_spmm_item<T, I>>(
        args, num_rows * num_heads * num_features, stream);
  });
}

}  // namespace leo
