// Fused local + remote aggregation kernel (warp-specialised, hybrid workload mapping) and its
// launcher. See fused_aggregate.cuh for the mapping.
#include "fused_aggregate.cuh"
#include "hub_pass.cuh"

namespace leo {
namespace {

template <typename T, typename I, int VEC, int VL, int VR>
__global__ void __launch_bounds__(kFusedThreads)
    fused_aggregate_kernel(const FusedArgs<T, I> args, const FusedConfig cfg) {
  // Raw bytes, typed below: one extern shared array serves every instantiation.
  extern __shared__ __align__(16) unsigned char shared_raw[];
  AccT<T>* acc = reinterpret_cast<AccT<T>*>(shared_raw);
  const int64_t tile = static_cast<int64_t>(blockIdx.x);
  const int64_t chunk = static_cast<int64_t>(blockIdx.y);
  const int thread = static_cast<int>(threadIdx.x);
  fused_zero(cfg, thread, acc);
  __syncthreads();
  fused_accumulate<T, I, VEC, VL, VR>(args, cfg, tile, chunk, thread, acc);
  __syncthreads();
  fused_store<T, I>(args, cfg, tile, chunk, thread, acc);
}

size_t acc_size(DType dtype) { return dtype == DType::kFloat64 ? 8 : 4; }

// Hub pass of one side into its part of the workspace; fills side.partial / side.hub_degree.
template <typename T, typename I, int VEC>
cudaError_t side_hub_pass(const CsrRef& adj, int64_t num_features, AccT<T>* workspace,
                          FusedSide<T, I>* side, cudaStream_t stream) {
  const SpmmConfig cfg =
      make_spmm_config(adj.num_rows, adj.num_edges, num_features, VEC, adj.max_degree);
  side->hub_degree = cfg.hub_degree;
  side->partial = workspace;
  if (cfg.hub_degree == 0) return cudaSuccess;
  if (workspace == nullptr) return cudaErrorInvalidValue;
  SpmmArgs<T, I> args;
  args.indptr = side->indptr;
  args.indices = side->indices;
  args.values = side->values;
  args.x = side->x;
  args.out = nullptr;  // the hub pass writes partials only
  args.partial = workspace;
  args.num_rows = adj.num_rows;
  args.num_features = num_features;
  return launch_hub_pass<T, I, VEC>(args, cfg, adj.num_edges, stream);
}

template <typename T, typename I>
FusedSide<T, I> make_side(const CsrRef& adj, const void* x) {
  FusedSide<T, I> side;
  side.indptr = static_cast<const I*>(adj.indptr);
  side.indices = static_cast<const I*>(adj.indices);
  side.values = static_cast<const T*>(adj.values);
  side.x = static_cast<const T*>(x);
  side.partial = nullptr;
  side.hub_degree = 0;
  return side;
}

}  // namespace

int64_t remote_edge_cost(RemoteLink link) {
  // Rough latency of one row read over the link, in local (same-GPU HBM) reads: only the order
  // of magnitude matters to the warp split. A remote buffer on the same GPU costs what a local
  // one does.
  switch (link) {
    case RemoteLink::kSameDevice:
      return 1;
    case RemoteLink::kPeer:
      return 3;
    case RemoteLink::kHost:
      return 12;
  }
  return 1;
}

size_t fused_aggregate_workspace_bytes(DType dtype, CsrRef local, CsrRef remote,
                                       int64_t num_features) {
  size_t bytes = 0;
  for (const CsrRef& adj : {local, remote}) {
    const SpmmConfig cfg =
        make_spmm_config(adj.num_rows, adj.num_edges, num_features, 1, adj.max_degree);
    bytes += static_cast<size_t>(spmm_workspace_elements(cfg, num_features)) * acc_size(dtype);
  }
  return bytes;
}

cudaError_t launch_fused_aggregate(DType dtype, IndexType index_type, CsrRef local,
                                   const void* x_local, CsrRef remote, const void* x_remote,
                                   RemoteLink link, void* out_RF, int64_t num_features,
                                   void* workspace, cudaStream_t stream) {
  if (local.num_rows != remote.num_rows) return cudaErrorInvalidValue;
  if (local.num_rows == 0 || num_features == 0) return cudaSuccess;
  return dispatch_types(dtype, index_type, [&](auto type_tag, auto index_tag) {
    using T = typename decltype(type_tag)::type;
    using I = typename decltype(index_tag)::type;
    FusedArgs<T, I> args;
    args.local = make_side<T, I>(local, x_local);
    args.remote = make_side<T, I>(remote, x_remote);
    args.out = static_cast<T*>(out_RF);
    args.num_rows = local.num_rows;
    args.num_features = num_features;
    const FusedWidths widths = fused_widths<T>(num_features, x_local, x_remote);
    return dispatch_lane_widths<T>(widths, [&](auto vec_tag, auto local_tag, auto remote_tag) {
      constexpr int VEC = decltype(vec_tag)::value;
      constexpr int VL = decltype(local_tag)::value;
      constexpr int VR = decltype(remote_tag)::value;
      AccT<T>* ws = static_cast<AccT<T>*>(workspace);
      cudaError_t status = side_hub_pass<T, I, VL>(local, num_features, ws, &args.local, stream);
      if (status != cudaSuccess) return status;
      const SpmmConfig local_hubs =
          make_spmm_config(local.num_rows, local.num_edges, num_features, 1, local.max_degree);
      AccT<T>* remote_ws = ws == nullptr ? nullptr : ws + spmm_workspace_elements(local_hubs,
                                                                                  num_features);
      status = side_hub_pass<T, I, VR>(remote, num_features, remote_ws, &args.remote, stream);
      if (status != cudaSuccess) return status;
      const FusedConfig cfg =
          make_fused_config(local.num_rows, local.num_edges, remote.num_edges, num_features, VEC,
                            static_cast<int64_t>(sizeof(AccT<T>)), remote_edge_cost(link));
      if (cfg.row_tiles > kMaxGridX || cfg.feature_chunks > kMaxGridY) {
        return cudaErrorInvalidConfiguration;
      }
      const dim3 grid(static_cast<unsigned int>(cfg.row_tiles),
                      static_cast<unsigned int>(cfg.feature_chunks));
      const size_t smem = static_cast<size_t>(cfg.smem_bytes);
      fused_aggregate_kernel<T, I, VEC, VL, VR><<<grid, cfg.threads, smem, stream>>>(args, cfg);
      return cudaGetLastError();
    });
  });
}

}  // namespace leo
