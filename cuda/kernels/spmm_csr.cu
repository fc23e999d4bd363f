// CSR SpMM kernels (hub pass, then lane group per row) and their launcher. See spmm_csr.cuh.
#include "hub_pass.cuh"
#include "spmm_csr.cuh"

namespace leo {
namespace {

template <typename T, typename I, int VEC, int WX, int S>
__global__ void __launch_bounds__(kSpmmThreads)
    spmm_csr_kernel(const SpmmArgs<T, I> args, const SpmmConfig cfg) {
  spmm_thread<T, I, VEC, WX, S>(args, cfg, static_cast<int64_t>(blockIdx.x),
                                static_cast<int>(threadIdx.x));
}


size_t acc_bytes(DType dtype) { return dtype == DType::kFloat64 ? 8 : 4; }

}  // namespace

size_t spmm_csr_workspace_bytes(DType dtype, CsrRef adj, int64_t num_features) {
  // The hub layout does not depend on the lane width, so VEC = 1 gives the size.
  const SpmmConfig cfg =
      make_spmm_config(adj.num_rows, adj.num_edges, num_features, 1, adj.max_degree);
  return static_cast<size_t>(spmm_workspace_elements(cfg, num_features)) * acc_bytes(dtype);
}

cudaError_t launch_spmm_csr(DType dtype, IndexType index_type, CsrRef adj, const void* x_CF,
                            void* out_RF, int64_t num_features, void* workspace,
                            cudaStream_t stream) {
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
    args.partial = static_cast<AccT<T>*>(workspace);
    args.num_rows = adj.num_rows;
    args.num_features = num_features;
    // x may be misaligned (a sliced input); out is written in whole vectors of VEC.
    const LaneWidths widths = lane_widths<T>(num_features, x_CF, out_RF, true);
    if (widths.second != widths.vec) return cudaErrorInvalidValue;
    return dispatch_lane_widths<T>(widths, [&](auto vec_tag, auto x_tag, auto) {
      constexpr int VEC = decltype(vec_tag)::value;
      constexpr int WX = decltype(x_tag)::value;
      const SpmmConfig cfg = make_spmm_config(adj.num_rows, adj.num_edges, num_features, VEC,
                                              adj.max_degree);
      if (cfg.blocks > kMaxGridX) return cudaErrorInvalidConfiguration;
      if (cfg.hub_degree > 0) {
        if (workspace == nullptr) return cudaErrorInvalidValue;
        // The hub pass reads only x: its own lane width is x's (same hub layout, see above).
        const SpmmConfig hubs = make_spmm_config(adj.num_rows, adj.num_edges, num_features, WX,
                                                 adj.max_degree);
        const cudaError_t status = launch_hub_pass<T, I, WX>(args, hubs, adj.num_edges, stream);
        if (status != cudaSuccess) return status;
      }
      const dim3 grid(static_cast<unsigned int>(cfg.blocks));
      if (spmm_multi_slice(cfg, num_features, VEC)) {
        constexpr int kS = kSlicesPerPass<VEC>;
        spmm_csr_kernel<T, I, VEC, WX, kS><<<grid, cfg.threads, 0, stream>>>(args, cfg);
      } else {
        spmm_csr_kernel<T, I, VEC, WX, 1><<<grid, cfg.threads, 0, stream>>>(args, cfg);
      }
      return cudaGetLastError();
    });
  });
}

}  // namespace leo
