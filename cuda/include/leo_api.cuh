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

#include <cstdint>

namespace leo {

enum class DType : int32_t { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3 };
enum class IndexType : int32_t { kInt32 = 0, kInt64 = 1 };

// One CSR matrix on the device: indptr_{R+1}, indices_E, values_E.
struct CsrRef {
  const void* indptr;
  const void* indices;
  const void* values;
  int64_t num_rows;
  int64_t num_edges;
};

// out_RF[i] = sum_{e in row i} values[e] * x_CF[indices[e]]. Writes every row (empty rows: 0).
cudaError_t launch_spmm_csr(DType dtype, IndexType index_type, CsrRef adj, const void* x_CF,
                            void* out_RF, int64_t num_features, cudaStream_t stream);

// out_RF = local(adj) @ x_local + remote(adj) @ x_remote in one pass: both CSRs have the same
// rows; x_remote may live in any device-readable allocation (a peer's buffer included).
cudaError_t launch_fused_aggregate(DType dtype, IndexType index_type, CsrRef local,
                                   const void* x_local, CsrRef remote, const void* x_remote,
                                   void* out_RF, int64_t num_features, cudaStream_t stream);

// out_NF[i] = x[idx[i]].
cudaError_t launch_gather_rows(DType dtype, IndexType index_type, const void* x, const void* idx_N,
                               void* out_NF, int64_t num_idx, int64_t num_features,
                               cudaStream_t stream);

// acc[idx[i]] += src_NF[i] with atomics. `acc` holds the accumulator type (float for
// float32/float16/bfloat16 data, double for float64) and must be zeroed by the caller.
cudaError_t launch_scatter_add_rows(DType dtype, IndexType index_type, const void* src_NF,
                                    const void* idx_N, void* acc, int64_t num_idx,
                                    int64_t num_features, cudaStream_t stream);

}  // namespace leo
