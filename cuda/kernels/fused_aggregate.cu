// Fused local + remote aggregation kernel (warp-specialised, hybrid workload mapping) and its
// launcher. See fused_aggregate.cuh for the mapping.
#include "fused_aggregate.cuh"

namespace leo {
namespace {

template <typename T, typename I, int VEC>
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
  fused_accumulate<T, I, VEC>(args, cfg, tile, chunk, thread, acc);
  __syncthreads();
  fused_store<T, I>(args, cfg, tile, chunk, thread, acc);
}

constexpr int64_t kMaxGridX = 2147483647;
constexpr int64_t kMaxGridY = 65535;

template <typename T, typename I>
FusedSide<T, I> make_side(const CsrRef& adj, const void* x) {
  FusedSide<T, I> side;
  side.indptr = static_cast<const I*>(adj.indptr);
  side.indices = static_cast<const I*>(adj.indices);
  side.values = static_cast<const T*>(adj.values);
  side.x = static_cast<const T*>(x);
  return side;
}

}  // namespace

cudaError_t launch_fused_aggregate(DType dtype, IndexType index_type, CsrRef local,
                                   const void* x_local, CsrRef remote, const void* x_remote,
                                   void* out_RF, int64_t num_features, cudaStream_t stream) {
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
    const bool vectors = can_use_vectors<T>(num_features, x_local, x_remote, out_RF);
    return dispatch_vec<T>(vectors, [&](auto vec_tag) {
      constexpr int VEC = decltype(vec_tag)::value;
      const FusedConfig cfg =
          make_fused_config(local.num_rows, local.num_edges, remote.num_edges, num_features, VEC,
                            static_cast<int64_t>(sizeof(AccT<T>)));
      if (cfg.row_tiles > kMaxGridX || cfg.feature_chunks > kMaxGridY) {
        return cudaErrorInvalidConfiguration;
      }
      const dim3 grid(static_cast<unsigned int>(cfg.row_tiles),
                      static_cast<unsigned int>(cfg.feature_chunks));
      const size_t smem = static_cast<size_t>(cfg.smem_bytes);
      fused_aggregate_kernel<T, I, VEC><<<grid, cfg.threads, smem, stream>>>(args, cfg);
      return cudaGetLastError();
    });
  });
}

}  // namespace leo
