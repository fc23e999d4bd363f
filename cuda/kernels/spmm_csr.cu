// CSR SpMM kernel (lane group per row) and its launcher. See spmm_csr.cuh for the mapping.
#include "spmm_csr.cuh"

namespace leo {
namespace {

template <typename T, typename I, int VEC>
__global__ void __launch_bounds__(kSpmmThreads)
    spmm_csr_kernel(const SpmmArgs<T, I> args, const SpmmConfig cfg) {
  spmm_thread<T, I, VEC>(args, cfg, static_cast<int64_t>(blockIdx.x),
                         static_cast<int>(threadIdx.x));
}

constexpr int64_t kMaxGridX = 2147483647;

}  // namespace

cudaError_t launch_spmm_csr(DType dtype, IndexType index_type, CsrRef adj, const void* x_CF,
                            void* out_RF, int64_t num_features, cudaStream_t stream) {
  if (adj.num_rows == 0 || num_features == 0) return cudaSuccess;
  return dispatch_types(dtype, index_type, [&](auto type_tag, auto index_tag) {
    using T = typename decltype(type_tag)::type;
    using I = typename decltype(index_tag)::type;
    SpmmArgs<T, I> args;
    args.indptr = static_cast<const I*>(adj.indptr);
    args.indices = static_cast<const I*>(adj.indices);
    args.values = static_cast<const T*>(adj.values);
    args.x = static_cast<const T*>(x_CF);
    args.out = static_cast<T*>(out_RF);
    args.num_rows = adj.num_rows;
    args.num_features = num_features;
    const bool vectors = can_use_vectors<T>(num_features, x_CF, out_RF);
    return dispatch_vec<T>(vectors, [&](auto vec_tag) {
      constexpr int VEC = decltype(vec_tag)::value;
      const SpmmConfig cfg = make_spmm_config(adj.num_rows, adj.num_edges, num_features, VEC);
      if (cfg.blocks > kMaxGridX) return cudaErrorInvalidConfiguration;
      const dim3 grid(static_cast<unsigned int>(cfg.blocks));
      spmm_csr_kernel<T, I, VEC><<<grid, cfg.threads, 0, stream>>>(args, cfg);
      return cudaGetLastError();
    });
  });
}

}  // namespace leo
