// CSR SpMM, one lane group per row: out_RF[i] = sum_e values[e] * x_CF[indices[e]].
//
// A lane group of G lanes (G a power of two, at most a warp) owns one row; each lane owns VEC
// consecutive features of every G * VEC (a feature slice). VEC is a 16- or 8-byte vector when
// F is a multiple of it (lane_widths); x is read with vectors when its base is aligned, else
// one element at a time (WX = 1), so a misaligned input slows only its own loads. When F needs
// fewer than 32 lanes, one warp serves several rows at once; for graphs whose rows are short on
// average, G is halved again so that a warp keeps more rows (and more independent index loads)
// in flight, each lane then covering two slices of the row.
//
// Index reuse. A lane that covers several slices of a row (F wider than G * VEC) sums up to
// kSlicesPerPass<VEC> of them in one walk over the row's edges: each edge's index and value are
// loaded once per walk and used for every slice (accumulate_edge_slices), instead of once per
// slice. They stay in registers: the lanes of a group load the same index (one broadcast
// transaction), so staging them in shared memory would add a barrier per row tile and save no
// memory traffic; the saving is in not reloading them for every slice.
//
// Hub rows. A row with more than hub_degree edges (a hub of a power-law graph) would be walked
// serially by one lane group. When the CSR has such rows (its max degree, computed once per
// CSR, says so), a first pass cuts the edge array into fixed chunks of hub_degree edges, one
// block per (chunk, feature slice); a block sums the hub-row segments inside its chunk (at most
// two: the row its chunk starts in and a row starting inside it, since a hub row is longer than
// a chunk) into a workspace of partial sums, slot 0 and slot 1. The main pass then gives a hub
// row the sum of its chunks' partials instead of walking its edges: a second reduction, no
// atomics on the output. The first pass's blocks split a segment across all their lane groups
// and combine them with float shared-memory atomics, whose order varies: a hub row's sum may
// differ in its last bits from run to run (rows up to hub_degree edges are summed in a fixed
// order and do not). The fused kernel's shared-memory flushes vary the same way.
// The workspace (K x 2 x F accumulators, ~E*F/256 bytes) is taken from torch's caching
// allocator per call, on the call's stream, only when the CSR's longest row says there are
// hubs (or when it is unknown, -1: LEO always passes it).
//
// Shape suffixes: R rows, C columns, E edges, F features, K edge chunks.
#pragma once

#include "leo_common.cuh"

namespace leo {

constexpr int kSpmmThreads = 256;
// Below this mean degree a row is "short": its index loads dominate, not its features.
constexpr int64_t kShortRowDegree = 8;
// Rows with more edges than this are split across blocks (see "Hub rows" above).
constexpr int64_t kHubDegree = 2048;
// Feature slices a lane sums in one walk over a row's edges (see "Index reuse" above): at most
// 16 accumulators a lane (2 slices of 8-element vectors: fp16/bf16), so registers do not spill.
template <int VEC>
constexpr int kSlicesPerPass = VEC >= 8 ? 2 : 4;

struct SpmmConfig {
  int group_lanes;     // G: lanes per row
  int rows_per_block;  // threads / G
  int threads;
  int64_t blocks;
  int64_t hub_degree;     // rows above it take their sums from the hub pass (0: no hub pass)
  int64_t hub_chunks;     // K = ceil(E / hub_degree) when there is a hub pass
  int chunk_features;     // FC of the hub pass: G * VEC
  int64_t feature_slices;  // ceil(F / FC): grid.y of the hub pass
};

// max_degree < 0 means unknown: the hub pass then runs (it costs little when no row needs it).
inline SpmmConfig make_spmm_config(int64_t num_rows, int64_t num_edges, int64_t num_features,
                                   int vec, int64_t max_degree, int64_t hub_degree = kHubDegree) {
  const int lanes_needed = static_cast<int>(min64(kWarpSize, ceil_div(num_features, vec)));
  int lanes = pow2_ceil(lanes_needed < 1 ? 1 : lanes_needed);
  SpmmConfig cfg;
  cfg.chunk_features = lanes * vec;
  cfg.feature_slices = ceil_div(num_features, cfg.chunk_features);
  const int64_t mean_degree = num_edges / max64(num_rows, 1);
  if (mean_degree < kShortRowDegree && lanes > 4) lanes /= 2;
  cfg.group_lanes = lanes;
  cfg.threads = kSpmmThreads;
  cfg.rows_per_block = kSpmmThreads / lanes;
  cfg.blocks = ceil_div(num_rows, cfg.rows_per_block);
  const bool hubs = num_edges > hub_degree && (max_degree < 0 || max_degree > hub_degree);
  cfg.hub_degree = hubs ? hub_degree : 0;
  cfg.hub_chunks = hubs ? ceil_div(num_edges, hub_degree) : 0;
  return cfg;
}

// Accumulator elements of the hub pass's workspace: K chunks x 2 slots x F.
inline int64_t spmm_workspace_elements(const SpmmConfig& cfg, int64_t num_features) {
  return cfg.hub_chunks * 2 * num_features;
}

template <typename T, typename I>
struct SpmmArgs {
  const I* indptr;   // R+1
  const I* indices;  // E
  const T* values;   // E
  const T* x;        // C x F
  T* out;            // R x F
  AccT<T>* partial;  // K x 2 x F hub partial sums (null without a hub pass)
  int64_t num_rows;
  int64_t num_features;
};

// Slot of hub row [row_begin, ...) in chunk k: 1 when the row starts inside the chunk, else 0.
LEO_HD int64_t hub_slot(int64_t row_begin, int64_t chunk, int64_t hub_degree) {
  return row_begin >= chunk * hub_degree ? 1 : 0;
}

// acc[v] += the hub partials of the row [begin, end) at features f..f+VEC.
template <typename A, int VEC>
LEO_HD void add_hub_partials(const A* partial, int64_t num_features, int64_t hub_degree,
                             int64_t f, int64_t begin, int64_t end, A (&acc)[VEC]) {
  for (int64_t k = begin / hub_degree; k <= (end - 1) / hub_degree; ++k) {
    const A* p = partial + (k * 2 + hub_slot(begin, k, hub_degree)) * num_features + f;
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] += p[v];
  }
}

// Slices of G * VEC features the lane of group width G at `lane` covers in a row of F features.
LEO_HD int64_t lane_slices(int64_t num_features, int group_lanes, int vec, int lane) {
  const int64_t first = static_cast<int64_t>(lane) * vec;
  if (first >= num_features) return 0;
  return ceil_div(num_features - first, static_cast<int64_t>(group_lanes) * vec);
}

// The work of thread `thread` of block `block`: its row, its VEC-feature slices of that row,
// up to S at a time (S = kSlicesPerPass<VEC> when a lane can have several slices, else 1). x is
// read WX elements at a time (VEC or 1); out is written in vectors of VEC.
template <typename T, typename I, int VEC, int WX, int S>
LEO_HD void spmm_thread(const SpmmArgs<T, I>& a, const SpmmConfig& cfg, int64_t block,
                        int thread) {
  const int64_t row = block * cfg.rows_per_block + thread / cfg.group_lanes;
  if (row >= a.num_rows) return;
  const int lane = thread % cfg.group_lanes;
  const int64_t begin = static_cast<int64_t>(load_ro(a.indptr + row));
  const int64_t end = static_cast<int64_t>(load_ro(a.indptr + row + 1));
  const bool hub = cfg.hub_degree > 0 && end - begin > cfg.hub_degree;
  const int64_t stride = static_cast<int64_t>(cfg.group_lanes) * VEC;
  const int64_t slices = lane_slices(a.num_features, cfg.group_lanes, VEC, lane);
  for (int64_t first = 0; first < slices; first += S) {
    const int n = static_cast<int>(min64(S, slices - first));
    const int64_t f = static_cast<int64_t>(lane) * VEC + first * stride;
    AccT<T> acc[S][VEC] = {};
    if (hub) {
#pragma unroll
      for (int s = 0; s < S; ++s) {  // unrolled with a guard: acc stays in registers
        if (s < n) {
          add_hub_partials<AccT<T>, VEC>(a.partial, a.num_features, cfg.hub_degree,
                                         f + s * stride, begin, end, acc[s]);
        }
      }
    } else {
      accumulate_edge_slices<T, I, VEC, WX, S>(a.indices, a.values, a.x, a.num_features, f,
                                               stride, n, begin, end, acc);
    }
#pragma unroll
    for (int s = 0; s < S; ++s) {
      if (s < n) store_vec<T, VEC>(a.out + row * a.num_features + f + s * stride, acc[s]);
    }
  }
}

// Whether a lane of `cfg` can cover more than one feature slice (then spmm_thread runs with
// S = kSlicesPerPass<VEC>; with one slice per lane, S = 1 keeps its registers free).
inline bool spmm_multi_slice(const SpmmConfig& cfg, int64_t num_features, int vec) {
  return lane_slices(num_features, cfg.group_lanes, vec, 0) > 1;
}

// ---- hub pass: block (chunk k, feature slice s), threads in lane groups of G lanes ----

// One hub-row segment [begin, end) of a chunk and the slot its partial goes to (end <= begin:
// none).
struct HubSegment {
  int64_t begin;
  int64_t end;
  int64_t slot;
};

// Segment `which` (0: the row the chunk starts in; 1: the row holding its last edge, if it
// starts inside the chunk) when that row is a hub row; else an empty segment.
template <typename I>
LEO_HD HubSegment hub_segment(const I* indptr, int64_t num_rows, int64_t num_edges,
                              int64_t hub_degree, int64_t chunk, int which) {
  const int64_t c0 = chunk * hub_degree;
  const int64_t c1 = min64(c0 + hub_degree, num_edges);
  const int64_t first = find_row(indptr, 0, num_rows, c0);
  int64_t row = first;
  if (which == 1) {
    row = find_row(indptr, first, num_rows, c1 - 1);
    if (row == first) return HubSegment{0, 0, 0};
  }
  const int64_t r0 = static_cast<int64_t>(indptr[row]);
  const int64_t r1 = static_cast<int64_t>(indptr[row + 1]);
  if (r1 - r0 <= hub_degree) return HubSegment{0, 0, 0};
  return HubSegment{max64(r0, c0), min64(r1, c1), hub_slot(r0, chunk, hub_degree)};
}

// Phase 1: zero the block's shared partials (2 slots x FC).
template <typename A>
LEO_HD void hub_zero(const SpmmConfig& cfg, int thread, A* acc) {
  for (int i = thread; i < 2 * cfg.chunk_features; i += cfg.threads) acc[i] = A(0);
}

// Phase 2: this thread's lane group sums its equal share of each hub segment of the chunk into
// the shared partials (shared atomics: every group of the block adds into the same FC values).
template <typename T, typename I, int VEC>
LEO_HD void hub_accumulate(const SpmmArgs<T, I>& a, const SpmmConfig& cfg, int64_t num_edges,
                           int64_t chunk, int64_t slice, int thread, AccT<T>* acc) {
  const int lanes = cfg.chunk_features / VEC;  // the hub pass's own G (no short-row halving)
  const int group = thread / lanes;
  const int num_groups = cfg.threads / lanes;
  const int64_t fc = static_cast<int64_t>(thread % lanes) * VEC;
  const int64_t f = slice * cfg.chunk_features + fc;
  if (f >= a.num_features) return;
  for (int which = 0; which < 2; ++which) {
    const HubSegment seg =
        hub_segment(a.indptr, a.num_rows, num_edges, cfg.hub_degree, chunk, which);
    const int64_t per_group = ceil_div(seg.end - seg.begin, num_groups);
    const int64_t e0 = seg.begin + group * per_group;
    const int64_t e1 = min64(e0 + per_group, seg.end);
    if (e0 >= e1) continue;
    AccT<T> part[VEC] = {};
    accumulate_edges<T, I, VEC>(a.indices, a.values, a.x, a.num_features, f, e0, e1, part);
    AccT<T>* dst = acc + seg.slot * cfg.chunk_features + fc;
#pragma unroll
    for (int v = 0; v < VEC; ++v) atomic_add(dst + v, part[v]);
  }
}

// Phase 3: write the block's two slots to the workspace (slots without a segment stay 0).
template <typename T, typename I>
LEO_HD void hub_store(const SpmmArgs<T, I>& a, const SpmmConfig& cfg, int64_t chunk,
                      int64_t slice, int thread, const AccT<T>* acc) {
  for (int i = thread; i < 2 * cfg.chunk_features; i += cfg.threads) {
    const int slot = i / cfg.chunk_features;
    const int64_t f = slice * cfg.chunk_features + i % cfg.chunk_features;
    if (f < a.num_features) a.partial[(chunk * 2 + slot) * a.num_features + f] = acc[i];
  }
}

}  // namespace leo
