// Host-side entry points of LEO's CUDA kernels: plain C++ (no device code, no torch), so the
// torch binding in cuda/binding/ can include it with the host compiler.
//
// Conventions shared by every launcher:
//   - tensors are dense, row-major and contiguous; a feature matrix has num_features columns;
//   - values share the storage type of the feature matrix (DType); accumulation is fp32
//     (fp64 for float64 data);
//   - indptr and indices of one CSR share one IndexType;
//   - a launcher only enqueues work on `stream` and returns the launch status.
//
// Shape suffixes in comments: R rows, C columns, E edges, F features, N gathered rows.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace leo {

enum class DType : int32_t { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3 };
enum class IndexType : int32_t { kInt32 = 0, kInt64 = 1 };

// Where the rows read on demand by the fused aggregation live, as seen from the GPU that runs
// it: the link prices a remote edge when warps are split between local and remote edges.
enum class RemoteLink : int32_t { kSameDevice = 0, kPeer = 1, kHost = 2 };

// One CSR matrix on the device: indptr_{R+1}, indices_E, values_E. max_degree is the longest
// row (computed once per CSR by its owner; -1 when unknown): it decides whether hub rows need
// the split pass and its workspace.
struct CsrRef {
  const void* indptr;
  const void* indices;
  const void* values;
  int64_t num_rows;
  int64_t num_edges;
  int64_t max_degree;
};

// Bytes of device workspace launch_spmm_csr needs for `adj` (0 when no row is a hub row).
size_t spmm_csr_workspace_bytes(DType dtype, CsrRef adj, int64_t num_features);

// out_RF[i] = sum_{e in row i} values[e] * x_CF[indices[e]]. Writes every row (empty rows: 0).
// `workspace` holds spmm_csr_workspace_bytes (may be null when that is 0).
cudaError_t launch_spmm_csr(DType dtype, IndexType index_type, CsrRef adj, const void* x_CF,
                            void* out_RF, int64_t num_features, void* workspace,
                            cudaStream_t stream);

// One remote edge's weight, in local edges, when splitting warps by work.
int64_t remote_edge_cost(RemoteLink link);

// Bytes of device workspace launch_fused_aggregate needs (hub rows of either side).
size_t fused_aggregate_workspace_bytes(DType dtype, CsrRef local, CsrRef remote,
                                       int64_t num_features);

// out_RF = local(adj) @ x_local + remote(adj) @ x_remote in one pass: both CSRs have the same
// rows; x_remote may live in any allocation this device can read (a peer GPU's buffer with
// peer access enabled, mapped pinned host memory), as `link` says.
cudaError_t launch_fused_aggregate(DType dtype, IndexType index_type, CsrRef local,
                                   const void* x_local, CsrRef remote, const void* x_remote,
                                   RemoteLink link, void* out_RF, int64_t num_features,
                                   void* workspace, cudaStream_t stream);

// out_NF[i] = x_CF[idx[i]] for indices in [0, num_src_rows); rows with an index outside it are
// zero-filled and nothing outside x is read (callers validate indices; this is the backstop).
cudaError_t launch_gather_rows(DType dtype, IndexType index_type, const void* x_CF,
                               int64_t num_src_rows, const void* idx_N, void* out_NF,
                               int64_t num_idx, int64_t num_features, cudaStream_t stream);

// acc[idx[i]] += src_NF[i] with atomics, for indices in [0, num_rows) (others are skipped:
// the backstop of the callers' validation). `acc` (num_rows x F) holds the accumulator type
// (float for float32/float16/bfloat16 data, double for float64) and must be zeroed by the
// caller.
cudaError_t launch_scatter_add_rows(DType dtype, IndexType index_type, const void* src_NF,
                                    const void* idx_N, void* acc, int64_t num_rows,
                                    int64_t num_idx, int64_t num_features, cudaStream_t stream);

}  // namespace leo
