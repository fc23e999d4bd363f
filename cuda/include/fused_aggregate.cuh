// Fused local + remote aggregation with hybrid workload mapping:
//   out_RF = A_local @ x_local + A_remote @ x_remote
// in one kernel, where x_local holds inner and cached (L1/L2) rows and x_remote holds rows read
// on demand from another allocation (a peer GPU's buffer through NVLink / symmetric memory, or
// simply a separate buffer on one GPU). Both CSRs have the same rows.
//
// Mapping. A block owns a tile of consecutive rows and one chunk of FC features. Its warps are
// specialised: the first NL warps sum the tile's local edges, the other NR warps its remote
// edges, at the same time, so the long latency of remote reads hides behind local arithmetic
// instead of stalling it. NL:NR is chosen per tile from the tile's own edge counts (read from
// the two indptr arrays at the tile's bounds), a remote edge priced by the link it crosses
// (remote_edge_cost: same GPU, peer GPU, host memory), so a tile without remote edges gives
// every warp to its local edges.
// Each warp is split into lane groups of G lanes (a lane covers VEC features). Each side reads
// with its own width (VL, VR): 16- or 8-byte vectors when the width allows and that side's
// buffer is aligned, else scalars, so a misaligned peer buffer does not slow the local side
// down. The tile's edges of one side are contiguous in its CSR; they are cut
// into equal contiguous ranges, one per lane group of that side. That gives per-degree
// granularity without a precomputed bin array: several low-degree rows fall into one group's
// range, and a high-degree row is split across all groups (hence warps) of its side. A group
// flushes its partial sum of a row into the block's shared-memory accumulator (fp32, fp64 for
// float64) with a shared atomic whenever its range leaves the row; after a barrier the block
// writes the accumulator out once. Rows with no edges get zeros. The atomics' order varies, so
// a row split across groups may differ in its last bits from run to run.
//
// Hub rows: a row with more than hub_degree edges on one side is not summed by its tile. The
// hub pass of spmm_csr.cuh runs first over that side's CSR (edge chunks spread over the whole
// GPU) and the store phase adds the row's partial sums; the tile's lane groups skip its edges.
//
// Shape suffixes: R rows, C columns, E edges, F features, FC features per block chunk.
#pragma once

#include "spmm_csr.cuh"

namespace leo {

constexpr int kFusedWarps = 8;
constexpr int kFusedThreads = kFusedWarps * kWarpSize;
// Edges each lane group should get per tile: enough to amortise the tile's barriers and flushes.
constexpr int64_t kEdgesPerGroup = 16;
constexpr int64_t kMaxTileRows = 128;
// Shared accumulator budget per block; below the 48 KB a block gets without opting in.
constexpr int64_t kFusedSmemBytes = 32 * 1024;

struct FusedConfig {
  int group_lanes;         // G
  int chunk_features;      // FC = G * VEC
  int tile_rows;           // rows per block
  int64_t remote_edge_cost;  // one remote edge in local edges (per link, see leo_api.cuh)
  int threads;             // kFusedThreads
  int64_t row_tiles;       // grid.x
  int64_t feature_chunks;  // grid.y
  int64_t smem_bytes;      // tile_rows * FC * sizeof(accumulator)
};

// NR, the remote warps of a tile, in proportion to the cost-weighted edges of each side; a side
// with edges gets at least one warp, a side without edges none.
LEO_HD int remote_warps_for(int64_t local_edges, int64_t remote_edges, int64_t remote_cost) {
  if (remote_edges == 0) return 0;
  if (local_edges == 0) return kFusedWarps;
  const int64_t weighted = remote_edges * remote_cost;
  const int64_t total = local_edges + weighted;
  const int64_t rounded = (2 * kFusedWarps * weighted + total) / (2 * total);
  return static_cast<int>(max64(1, min64(kFusedWarps - 1, rounded)));
}

// VEC (features per lane) and each side's load width, from lane_widths: a 16- or 8-byte vector
// of features when F is a multiple of it and a side is aligned to it; an unaligned side reads
// them one by one. Output alignment does not matter: the kernel stores from shared memory,
// element by element.
using FusedWidths = LaneWidths;  // first: local side, second: remote side

template <typename T>
inline FusedWidths fused_widths(int64_t num_features, const void* x_local, const void* x_remote) {
  return lane_widths<T>(num_features, x_local, x_remote);
}

inline FusedConfig make_fused_config(int64_t num_rows, int64_t local_edges, int64_t remote_edges,
                                     int64_t num_features, int vec, int64_t acc_bytes,
                                     int64_t remote_edge_cost) {
  FusedConfig cfg;
  const int64_t lanes_needed = min64(kWarpSize, ceil_div(num_features, vec));
  cfg.group_lanes = pow2_ceil(static_cast<int>(max64(lanes_needed, 1)));
  cfg.chunk_features = cfg.group_lanes * vec;
  cfg.feature_chunks = ceil_div(num_features, cfg.chunk_features);
  cfg.remote_edge_cost = remote_edge_cost;
  cfg.threads = kFusedThreads;
  // Tile height from the mean degree: about kEdgesPerGroup edges for every lane group.
  const int64_t groups = static_cast<int64_t>(kFusedWarps) * (kWarpSize / cfg.group_lanes);
  const int64_t total_edges = local_edges + remote_edges;
  const int64_t smem_rows = kFusedSmemBytes / (cfg.chunk_features * acc_bytes);
  const int64_t max_rows = min64(kMaxTileRows, smem_rows);
  int64_t rows = max_rows;
  if (total_edges > 0) rows = groups * kEdgesPerGroup * max64(num_rows, 1) / total_edges;
  cfg.tile_rows = static_cast<int>(max64(1, min64(rows, max_rows)));
  cfg.row_tiles = ceil_div(num_rows, cfg.tile_rows);
  cfg.smem_bytes = static_cast<int64_t>(cfg.tile_rows) * cfg.chunk_features * acc_bytes;
  return cfg;
}

template <typename T, typename I>
struct FusedSide {
  const I* indptr;   // R+1
  const I* indices;  // E of this side
  const T* values;   // E of this side
  const T* x;        // C of this side x F
  const AccT<T>* partial;  // hub partial sums of this side (spmm_csr.cuh), null without hubs
  int64_t hub_degree;      // rows above it are hub rows of this side (0: none)
};

template <typename T, typename I>
struct FusedArgs {
  FusedSide<T, I> local;   // inner + cached (L1/L2) columns
  FusedSide<T, I> remote;  // columns read on demand (L3)
  T* out;                   // R x F
  int64_t num_rows;
  int64_t num_features;
};

// Which side, which lane group of that side, and which lane of the group a thread is.
struct FusedRole {
  int side;
  int lane;
  int64_t worker;
  int64_t num_workers;
};

LEO_HD FusedRole fused_role(const FusedConfig& cfg, int local_warps, int thread) {
  const int warp = thread / kWarpSize;
  const int groups_per_warp = kWarpSize / cfg.group_lanes;
  const int group = (thread % kWarpSize) / cfg.group_lanes;
  FusedRole role;
  role.lane = thread % cfg.group_lanes;
  role.side = warp < local_warps ? 0 : 1;
  const int side_warp = role.side == 0 ? warp : warp - local_warps;
  const int side_warps = role.side == 0 ? local_warps : kFusedWarps - local_warps;
  role.worker = static_cast<int64_t>(side_warp) * groups_per_warp + group;
  role.num_workers = static_cast<int64_t>(side_warps) * groups_per_warp;
  return role;
}

// Phase 1: zero the block's accumulator (tile_rows x FC).
template <typename A>
LEO_HD void fused_zero(const FusedConfig& cfg, int thread, A* acc) {
  const int size = cfg.tile_rows * cfg.chunk_features;
  for (int i = thread; i < size; i += cfg.threads) acc[i] = A(0);
}

// Phase 2: this thread's lane group sums its contiguous range of the tile's edges of its side,
// flushing one partial row sum into the accumulator each time the range leaves a row. VL / VR:
// load widths of the local / remote side (VEC or 1).
template <typename T, typename I, int VEC, int VL = VEC, int VR = VEC>
LEO_HD void fused_accumulate(const FusedArgs<T, I>& a, const FusedConfig& cfg, int64_t tile,
                             int64_t chunk, int thread, AccT<T>* acc) {
  const int64_t r0 = tile * cfg.tile_rows;
  const int64_t r1 = min64(r0 + cfg.tile_rows, a.num_rows);
  const int64_t local_edges = static_cast<int64_t>(a.local.indptr[r1] - a.local.indptr[r0]);
  const int64_t remote_edges = static_cast<int64_t>(a.remote.indptr[r1] - a.remote.indptr[r0]);
  const int local_warps =
      kFusedWarps - remote_warps_for(local_edges, remote_edges, cfg.remote_edge_cost);
  const FusedRole role = fused_role(cfg, local_warps, thread);
  // A copy picked by value: indexing the kernel's parameter struct at run time would spill it
  // to local memory.
  const FusedSide<T, I> s = role.side == 0 ? a.local : a.remote;
  const int64_t fc = static_cast<int64_t>(role.lane) * VEC;
  const int64_t f = chunk * cfg.chunk_features + fc;
  if (f >= a.num_features || role.num_workers == 0) return;
  const int64_t e0 = static_cast<int64_t>(s.indptr[r0]);
  const int64_t e1 = static_cast<int64_t>(s.indptr[r1]);
  const int64_t per_worker = ceil_div(e1 - e0, role.num_workers);
  int64_t e = e0 + role.worker * per_worker;
  const int64_t stop = min64(e + per_worker, e1);
  if (e >= stop) return;
  int64_t row = find_row(s.indptr, r0, r1, e);
  while (e < stop) {
    const int64_t row_begin = static_cast<int64_t>(s.indptr[row]);
    const int64_t row_last = static_cast<int64_t>(s.indptr[row + 1]);
    const int64_t row_end = min64(row_last, stop);
    if (s.hub_degree == 0 || row_last - row_begin <= s.hub_degree) {  // hub rows: hub pass
      AccT<T> part[VEC] = {};
      if (role.side == 0) {  // warp-uniform: a warp serves one side
        accumulate_edges<T, I, VEC, VL>(s.indices, s.values, s.x, a.num_features, f, e, row_end,
                                        part);
      } else {
        accumulate_edges<T, I, VEC, VR>(s.indices, s.values, s.x, a.num_features, f, e, row_end,
                                        part);
      }
      AccT<T>* dst = acc + (row - r0) * cfg.chunk_features + fc;
#pragma unroll
      for (int v = 0; v < VEC; ++v) atomic_add(dst + v, part[v]);
    }
    e = row_end;
    ++row;
    // Skip empty rows: the next row that holds edge e (exists while e < stop).
    while (e < stop && static_cast<int64_t>(s.indptr[row + 1]) <= e) ++row;
  }
}

// The hub partials of one side for (row, f), when row is a hub row of that side.
template <typename T, typename I>
LEO_HD void add_side_hub(const FusedSide<T, I>& s, int64_t num_features, int64_t row, int64_t f,
                         AccT<T> (&sum)[1]) {
  if (s.hub_degree == 0) return;
  const int64_t begin = static_cast<int64_t>(s.indptr[row]);
  const int64_t end = static_cast<int64_t>(s.indptr[row + 1]);
  if (end - begin > s.hub_degree) {
    add_hub_partials<AccT<T>, 1>(s.partial, num_features, s.hub_degree, f, begin, end, sum);
  }
}

// Phase 3: write the accumulator (plus hub rows' partials) out, consecutive threads on
// consecutive features.
template <typename T, typename I>
LEO_HD void fused_store(const FusedArgs<T, I>& a, const FusedConfig& cfg, int64_t tile,
                        int64_t chunk, int thread, const AccT<T>* acc) {
  const int size = cfg.tile_rows * cfg.chunk_features;
  for (int i = thread; i < size; i += cfg.threads) {
    // 32-bit division: i and the chunk width are small (the tile fits in shared memory).
    const int64_t row = tile * cfg.tile_rows + i / cfg.chunk_features;
    const int64_t f = chunk * cfg.chunk_features + i % cfg.chunk_features;
    if (row < a.num_rows && f < a.num_features) {
      AccT<T> sum[1] = {acc[i]};
      add_side_hub(a.local, a.num_features, row, f, sum);
      add_side_hub(a.remote, a.num_features, row, f, sum);
      a.out[row * a.num_features + f] = NumTraits<T>::store(sum[0]);
    }
  }
}

}  // namespace leo
