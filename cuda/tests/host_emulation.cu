// Host emulation of LEO's CUDA kernels: runs the per-thread kernel bodies of cuda/include on the
// CPU, block by block and thread by thread (phase by phase where a kernel has barriers), with the
// launchers' own configuration functions, and compares every result with a float64 reference.
// It proves the index arithmetic (lane groups, tiles, edge ranges, row search, vector widths, hub
// chunks) on machines without a GPU; tests/kernels/test_kernel_compile.py builds it with nvcc
// and runs it.
//
// Races. Running threads one after another makes a plain `+=` look like an atomic add, so a
// second mode runs every barrier-delimited phase as if all its threads ran at once: each thread
// works on a private copy of the phase's memory, its atomic_add calls are logged (through
// leo::host_atomic_hook) instead of applied, and at the barrier the copies are merged. Two
// threads storing to one element without an atomic is a race: it is reported, and the merge
// keeps one store, losing the other's update, as a GPU would. Removing a needed atomic from a
// kernel therefore fails here (tests/kernels/test_kernel_compile.py compiles such mutants).
//
// Build: nvcc -std=c++17 -O2 -I cuda/include cuda/tests/host_emulation.cu -o emulate
// (-DLEO_RACE_CHECK_ONLY: only the race-mode cases, which compiles and runs faster).
// Exit status 0 when every case matches; failures are printed one per line.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fused_aggregate.cuh"
#include "row_ops.cuh"
#include "spmm_csr.cuh"

namespace {

using leo::AccT;
using leo::NumTraits;

int g_failures = 0;
int g_cases = 0;

void fail(const std::string& message) {
  if (++g_failures <= 30) std::printf("FAIL %s\n", message.c_str());
}

// ---- phase runners: sequential, or race-checked (see the header comment) ----

// The atomic adds of the running emulated thread, as (element offset, value) into the phase's
// private copy.
template <typename A>
struct AtomicLog {
  static const A* base;
  static size_t size;
  static std::vector<std::pair<size_t, A>> entries;
  static void hook(A* addr, A value) {
    const size_t offset = static_cast<size_t>(addr - base);
    if (addr < base || offset >= size) {
      fail("atomic_add outside the phase's memory");
      return;
    }
    entries.emplace_back(offset, value);
  }
};
template <typename A>
const A* AtomicLog<A>::base = nullptr;
template <typename A>
size_t AtomicLog<A>::size = 0;
template <typename A>
std::vector<std::pair<size_t, A>> AtomicLog<A>::entries;

bool g_race_mode = false;

// The A of a phase that issues no atomics (gathers, plain stores).
struct NoAtomics {};

// Which emulated thread stored each element of a buffer (-1: none yet). Shared by the phases
// of all blocks of one kernel that write global memory: blocks run concurrently, so two blocks
// storing one element is a race as much as two threads of one block.
struct Writers {
  std::vector<int64_t> who;
  int64_t block_offset = 0;  // added to thread ids: block * threads
};

// A phase's per-thread body, body(thread, mem), called through one pointer: run_phase and its
// race bookkeeping are compiled once per (A, M), not once per kernel body and type.
template <typename M>
class PhaseBody {
 public:
  template <typename Fn>
  PhaseBody(const Fn& fn)  // NOLINT: converts from any lambda; `fn` outlives the call
      : fn_(&fn),
        call_([](const void* f, int64_t t, M* m) { (*static_cast<const Fn*>(f))(t, m); }) {}
  void operator()(int64_t thread, M* mem) const { call_(fn_, thread, mem); }

 private:
  const void* fn_;
  void (*call_)(const void*, int64_t, M*);
};

template <typename T>
struct NoDeduce {
  using type = T;
};

// One phase of `num_threads` threads; body(thread, mem) writes only through `mem` (M elements).
// Race mode: private copies, logged atomics of accumulator type A, merge at the barrier.
// `writers`: the kernel-wide record for global memory (null: this phase's own, for shared).
template <typename A, typename M>
void run_phase(std::vector<M>& mem, int64_t num_threads, const std::string& name,
               typename NoDeduce<PhaseBody<M>>::type body, Writers* writers = nullptr) {
  if (!g_race_mode) {
    for (int64_t t = 0; t < num_threads; ++t) body(t, mem.data());
    return;
  }
  constexpr bool kAtomics = !std::is_same<A, NoAtomics>::value;
  const std::vector<M> start = mem;
  std::vector<M> copy;
  Writers local;
  Writers& record = writers == nullptr ? local : *writers;
  if (record.who.size() != mem.size()) record.who.assign(mem.size(), -1);
  std::vector<int64_t>& writer = record.who;
  std::vector<std::pair<size_t, A>> atomics;
  int races = 0;
  for (int64_t t = 0; t < num_threads; ++t) {
    copy = start;
    if constexpr (kAtomics) {
      AtomicLog<A>::base = reinterpret_cast<const A*>(copy.data());
      AtomicLog<A>::size = copy.size() * sizeof(M) / sizeof(A);
      AtomicLog<A>::entries.clear();
      leo::host_atomic_hook<A>() = &AtomicLog<A>::hook;
    }
    body(t, copy.data());
    if constexpr (kAtomics) {
      leo::host_atomic_hook<A>() = nullptr;
      atomics.insert(atomics.end(), AtomicLog<A>::entries.begin(), AtomicLog<A>::entries.end());
    }
    const int64_t id = record.block_offset + t;
    for (size_t i = 0; i < copy.size(); ++i) {
      if (std::memcmp(&copy[i], &start[i], sizeof(M)) == 0) continue;
      if (writer[i] >= 0 && writer[i] != id) ++races;
      writer[i] = id;
      mem[i] = copy[i];  // last store wins; the other thread's update is lost
    }
  }
  if constexpr (kAtomics) {
    A* acc = reinterpret_cast<A*>(mem.data());
    for (const auto& [offset, value] : atomics) acc[offset] += value;
  }
  if (races > 0) fail(name + ": " + std::to_string(races) + " races (plain stores by two threads)");
}

struct Graph {
  int64_t num_rows = 0;
  int64_t num_cols = 0;
  std::vector<int64_t> indptr;
  std::vector<int64_t> indices;
  std::vector<double> values;
};

int64_t max_degree(const Graph& g) {
  int64_t best = 0;
  for (int64_t r = 0; r < g.num_rows; ++r) best = std::max(best, g.indptr[r + 1] - g.indptr[r]);
  return best;
}

// Rows with 0..8 edges (every fifth row empty), one row with `huge` edges, and repeated
// columns inside rows (duplicates must be summed, not deduplicated).
Graph make_graph(int64_t num_rows, int64_t num_cols, int64_t huge, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Graph g;
  g.num_rows = num_rows;
  g.num_cols = num_cols;
  g.indptr.push_back(0);
  std::uniform_real_distribution<double> weight(-1.0, 1.0);
  for (int64_t r = 0; r < num_rows; ++r) {
    int64_t degree = static_cast<int64_t>(rng() % 9);
    if (r % 5 == 0) degree = 0;
    if (r == num_rows / 3) degree = huge;
    const int64_t dup_col = static_cast<int64_t>(rng() % static_cast<uint64_t>(num_cols));
    for (int64_t k = 0; k < degree; ++k) {
      const bool dup = k % 4 == 1;
      g.indices.push_back(dup ? dup_col : static_cast<int64_t>(rng() % num_cols));
      g.values.push_back(weight(rng));
    }
    g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
  }
  return g;
}

template <typename T>
T to_storage(double v) {
  return NumTraits<T>::store(static_cast<AccT<T>>(v));
}

template <typename T>
double from_storage(T v) {
  return static_cast<double>(NumTraits<T>::load(v));
}

template <typename T>
std::vector<T> random_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<T> m(static_cast<size_t>(rows * cols));
  for (auto& v : m) v = to_storage<T>(dist(rng));
  return m;
}

template <typename I>
std::vector<I> cast_indices(const std::vector<int64_t>& v) {
  return std::vector<I>(v.begin(), v.end());
}

template <typename T>
std::vector<T> cast_values(const std::vector<double>& v) {
  std::vector<T> out;
  for (double d : v) out.push_back(to_storage<T>(d));
  return out;
}

// Tolerance relative to sum |terms|: index errors give O(1) mismatches, rounding far less.
template <typename T>
double tolerance() {
  if (sizeof(T) == 8) return 1e-12;
  if (sizeof(T) == 4) return 1e-5;
  return 1e-2;
}

// Absolute floor: float16 results near 1e-7 are subnormal, with steps of 6e-8.
template <typename T>
double abs_tolerance() {
  return sizeof(T) == 2 ? 1e-6 : 0.0;
}

template <typename T>
void expect_close(const std::string& name, const std::vector<T>& got,
                  const std::vector<double>& want, const std::vector<double>& scale) {
  ++g_cases;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(from_storage(got[i]) - want[i]);
    if (!(err <= tolerance<T>() * scale[i] + abs_tolerance<T>() + 1e-300)) {
      if (++g_failures <= 30) {
        std::printf("FAIL %s at %zu: got %.8g want %.8g\n", name.c_str(), i,
                    from_storage(got[i]), want[i]);
      }
      return;
    }
  }
}

template <typename T>
void reference_spmm(const Graph& g, const std::vector<T>& values, const std::vector<T>& x,
                    int64_t num_features, std::vector<double>& out, std::vector<double>& scale) {
  for (int64_t r = 0; r < g.num_rows; ++r) {
    for (int64_t e = g.indptr[r]; e < g.indptr[r + 1]; ++e) {
      const double w = from_storage(values[e]);
      for (int64_t f = 0; f < num_features; ++f) {
        const double term = w * from_storage(x[g.indices[e] * num_features + f]);
        out[r * num_features + f] += term;
        scale[r * num_features + f] += std::fabs(term);
      }
    }
  }
}

std::string case_name(const char* op, const char* type, const char* index, int64_t features,
                      int vec, int64_t num_edges, int64_t hub_degree = 0) {
  return std::string(op) + "[" + type + "," + index + ",F=" + std::to_string(features) +
         ",VEC=" + std::to_string(vec) + ",E=" + std::to_string(num_edges) +
         ",hub=" + std::to_string(hub_degree) + "]";
}

// The hub pass of spmm_csr.cuh over `a` into `partial` (K x 2 x F), block by block.
template <typename T, typename I, int VEC>
void run_hub_pass(leo::SpmmArgs<T, I> a, const leo::SpmmConfig& cfg, int64_t num_edges,
                  std::vector<AccT<T>>& partial, const std::string& name) {
  using Acc = AccT<T>;
  partial.assign(static_cast<size_t>(leo::spmm_workspace_elements(cfg, a.num_features)),
                 Acc(77));  // garbage: every slot must be written
  std::vector<Acc> shared(static_cast<size_t>(2 * cfg.chunk_features));
  Writers global;
  for (int64_t k = 0; k < cfg.hub_chunks; ++k) {
    for (int64_t s = 0; s < cfg.feature_slices; ++s) {
      global.block_offset = (k * cfg.feature_slices + s) * cfg.threads;
      run_phase<NoAtomics>(shared, cfg.threads, name + " hub zero",
                     [&](int64_t t, Acc* m) { leo::hub_zero(cfg, static_cast<int>(t), m); });
      run_phase<Acc>(shared, cfg.threads, name + " hub sum", [&](int64_t t, Acc* m) {
        leo::hub_accumulate<T, I, VEC>(a, cfg, num_edges, k, s, static_cast<int>(t), m);
      });
      run_phase<NoAtomics>(partial, cfg.threads, name + " hub store", [&](int64_t t, Acc* m) {
        leo::SpmmArgs<T, I> b = a;
        b.partial = m;
        leo::hub_store<T, I>(b, cfg, k, s, static_cast<int>(t), shared.data());
      }, &global);
    }
  }
}

// Main pass of spmm with the launcher's choices: S slices per walk when a lane can have several.
template <typename T, typename I, int VEC, int WX>
void run_spmm_main(const leo::SpmmArgs<T, I>& a, const leo::SpmmConfig& cfg, std::vector<T>& out,
                   const std::string& name) {
  constexpr int kS = leo::kSlicesPerPass<VEC>;
  const bool multi = leo::spmm_multi_slice(cfg, a.num_features, VEC);
  Writers global;
  for (int64_t b = 0; b < cfg.blocks; ++b) {
    global.block_offset = b * cfg.threads;
    run_phase<NoAtomics>(out, cfg.threads, name, [&](int64_t t, T* m) {
      leo::SpmmArgs<T, I> w = a;
      w.out = m;
      if (multi) {
        leo::spmm_thread<T, I, VEC, WX, kS>(w, cfg, b, static_cast<int>(t));
      } else {
        leo::spmm_thread<T, I, VEC, WX, 1>(w, cfg, b, static_cast<int>(t));
      }
    }, &global);
  }
}

// WX: the width x is read with (VEC, or 1 for a misaligned x), as lane_widths picks it.
template <typename T, typename I, int VEC, int WX = VEC>
void check_spmm(const Graph& g, int64_t num_features, int64_t hub_degree, const char* tn,
                const char* in) {
  using Acc = AccT<T>;
  const auto indptr = cast_indices<I>(g.indptr);
  const auto indices = cast_indices<I>(g.indices);
  const auto values = cast_values<T>(g.values);
  const auto x = random_matrix<T>(g.num_cols, num_features, 7);
  std::vector<T> out(static_cast<size_t>(g.num_rows * num_features), to_storage<T>(99.0));
  const int64_t num_edges = static_cast<int64_t>(g.indices.size());
  const auto cfg = leo::make_spmm_config(g.num_rows, num_edges, num_features, VEC, max_degree(g),
                                         hub_degree);
  const std::string name = case_name("spmm", tn, in, num_features, VEC, num_edges, hub_degree) +
                           "WX=" + std::to_string(WX);
  std::vector<Acc> partial;
  leo::SpmmArgs<T, I> a{indptr.data(), indices.data(), values.data(), x.data(), out.data(),
                        nullptr,       g.num_rows,     num_features};
  if (cfg.hub_degree > 0) {  // the launcher runs the hub pass at x's width
    const auto hubs = leo::make_spmm_config(g.num_rows, num_edges, num_features, WX,
                                            max_degree(g), hub_degree);
    run_hub_pass<T, I, WX>(a, hubs, num_edges, partial, name);
  }
  a.partial = partial.data();
  run_spmm_main<T, I, VEC, WX>(a, cfg, out, name);
  std::vector<double> want(out.size(), 0.0), scale(out.size(), 0.0);
  reference_spmm(g, values, x, num_features, want, scale);
  expect_close(name, out, want, scale);
}

// One side's CSR arrays in the kernel's types.
template <typename T, typename I>
struct SideData {
  std::vector<I> indptr, indices;
  std::vector<T> values, x;
  std::vector<AccT<T>> partial;
  SideData(const Graph& g, int64_t num_features, uint64_t seed)
      : indptr(cast_indices<I>(g.indptr)),
        indices(cast_indices<I>(g.indices)),
        values(cast_values<T>(g.values)),
        x(random_matrix<T>(g.num_cols, num_features, seed)) {}
};

// The side's FusedSide after running its hub pass (as the launcher does).
template <typename T, typename I, int VEC>
leo::FusedSide<T, I> fused_side(const Graph& g, SideData<T, I>& d, int64_t num_features,
                                int64_t hub_degree, const std::string& name) {
  const int64_t num_edges = static_cast<int64_t>(g.indices.size());
  const auto cfg = leo::make_spmm_config(g.num_rows, num_edges, num_features, VEC, max_degree(g),
                                         hub_degree);
  leo::SpmmArgs<T, I> a{d.indptr.data(), d.indices.data(), d.values.data(), d.x.data(), nullptr,
                        nullptr,         g.num_rows,       num_features};
  if (cfg.hub_degree > 0) run_hub_pass<T, I, VEC>(a, cfg, num_edges, d.partial, name);
  return {d.indptr.data(), d.indices.data(), d.values.data(), d.x.data(), d.partial.data(),
          cfg.hub_degree};
}

// VL / VR: the load widths of the local / remote side (VEC or 1), as fused_widths picks them.
template <typename T, typename I, int VEC, int VL = VEC, int VR = VEC>
void check_fused(const Graph& local, const Graph& remote, int64_t num_features, int64_t hub_degree,
                 int64_t remote_cost, const char* tn, const char* in) {
  using Acc = AccT<T>;
  const int64_t edges = static_cast<int64_t>(local.indices.size() + remote.indices.size());
  const std::string name =
      case_name("fused", tn, in, num_features, VEC, edges, hub_degree) + "cost=" +
      std::to_string(remote_cost) + ",VL=" + std::to_string(VL) + ",VR=" + std::to_string(VR);
  SideData<T, I> l(local, num_features, 11), r(remote, num_features, 13);
  std::vector<T> out(static_cast<size_t>(local.num_rows * num_features), to_storage<T>(99.0));
  leo::FusedArgs<T, I> a;
  a.local = fused_side<T, I, VL>(local, l, num_features, hub_degree, name);
  a.remote = fused_side<T, I, VR>(remote, r, num_features, hub_degree, name);
  a.out = out.data();
  a.num_rows = local.num_rows;
  a.num_features = num_features;
  const auto cfg = leo::make_fused_config(
      local.num_rows, static_cast<int64_t>(local.indices.size()),
      static_cast<int64_t>(remote.indices.size()), num_features, VEC, sizeof(Acc), remote_cost);
  std::vector<Acc> shared(static_cast<size_t>(cfg.smem_bytes) / sizeof(Acc));
  Writers global;
  for (int64_t tile = 0; tile < cfg.row_tiles; ++tile) {
    for (int64_t chunk = 0; chunk < cfg.feature_chunks; ++chunk) {
      global.block_offset = (tile * cfg.feature_chunks + chunk) * cfg.threads;
      // Each phase ends at a __syncthreads() in the kernel.
      run_phase<NoAtomics>(shared, cfg.threads, name + " zero",
                     [&](int64_t t, Acc* m) { leo::fused_zero(cfg, static_cast<int>(t), m); });
      run_phase<Acc>(shared, cfg.threads, name + " sum", [&](int64_t t, Acc* m) {
        leo::fused_accumulate<T, I, VEC, VL, VR>(a, cfg, tile, chunk, static_cast<int>(t), m);
      });
      run_phase<NoAtomics>(out, cfg.threads, name + " store", [&](int64_t t, T* m) {
        leo::FusedArgs<T, I> w = a;
        w.out = m;
        leo::fused_store<T, I>(w, cfg, tile, chunk, static_cast<int>(t), shared.data());
      }, &global);
    }
  }
  std::vector<double> want(out.size(), 0.0), scale(out.size(), 0.0);
  reference_spmm(local, l.values, l.x, num_features, want, scale);
  reference_spmm(remote, r.values, r.x, num_features, want, scale);
  expect_close(name, out, want, scale);
}

// Gather and scatter-add of rows, with repeated indices and, with `bad`, indices outside the
// source rows (-1 and num_rows): gather must write zero rows for them, scatter-add skip them.
template <typename T, typename I, int VEC>
void check_rows(int64_t num_features, bool bad, const char* tn, const char* in) {
  using Acc = AccT<T>;
  const int64_t src_rows = 50;
  std::vector<int64_t> idx64;
  for (int64_t i = 0; i < 120; ++i) idx64.push_back((i * 37 + i / 3) % src_rows);
  if (bad) {
    idx64[5] = -1;
    idx64[17] = src_rows;
  }
  const auto idx = cast_indices<I>(idx64);
  const int64_t n = static_cast<int64_t>(idx.size());
  const auto x = random_matrix<T>(src_rows, num_features, 17);
  const std::string tag = bad ? "+bad" : "";
  // Gather.
  std::vector<T> gathered(static_cast<size_t>(n * num_features), to_storage<T>(99.0));
  leo::GatherArgs<T, I> ga{x.data(), idx.data(), gathered.data(), src_rows, n, num_features};
  const auto gcfg = leo::make_row_config(n, num_features / VEC);
  Writers gathered_by;
  for (int64_t b = 0; b < gcfg.blocks; ++b) {
    gathered_by.block_offset = b * leo::kRowThreads;
    run_phase<NoAtomics>(gathered, leo::kRowThreads, "gather", [&](int64_t t, T* m) {
      leo::GatherArgs<T, I> w = ga;
      w.out = m;
      leo::gather_thread<T, I, VEC>(w, gcfg, b, static_cast<int>(t));
    }, &gathered_by);
  }
  std::vector<double> want(gathered.size(), 0.0), scale(gathered.size(), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const bool valid = idx64[i] >= 0 && idx64[i] < src_rows;
    for (int64_t f = 0; f < num_features && valid; ++f) {
      want[i * num_features + f] = from_storage(x[idx64[i] * num_features + f]);
      scale[i * num_features + f] = std::fabs(want[i * num_features + f]);
    }
  }
  expect_close(case_name(("gather" + tag).c_str(), tn, in, num_features, VEC, n), gathered, want,
               scale);
  // Scatter-add of the gathered rows back: row r receives x[r] times its multiplicity.
  std::vector<Acc> acc(static_cast<size_t>(src_rows * num_features), Acc(0));
  leo::ScatterArgs<T, I> sa{gathered.data(), idx.data(), acc.data(), src_rows, n, num_features};
  const auto scfg = leo::make_row_config(n, num_features);
  Writers scattered_by;
  for (int64_t b = 0; b < scfg.blocks; ++b) {
    scattered_by.block_offset = b * leo::kRowThreads;
    run_phase<Acc>(acc, leo::kRowThreads, "scatter_add", [&](int64_t t, Acc* m) {
      leo::ScatterArgs<T, I> w = sa;
      w.acc = m;
      leo::scatter_add_thread<T, I>(w, scfg, b, static_cast<int>(t));
    }, &scattered_by);
  }
  std::vector<T> summed(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) summed[i] = NumTraits<T>::store(acc[i]);
  std::vector<double> want_s(acc.size(), 0.0), scale_s(acc.size(), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (idx64[i] < 0 || idx64[i] >= src_rows) continue;
    for (int64_t f = 0; f < num_features; ++f) {
      const double v = from_storage(x[idx64[i] * num_features + f]);
      want_s[idx64[i] * num_features + f] += v;
      scale_s[idx64[i] * num_features + f] += std::fabs(v);
    }
  }
  expect_close(case_name(("scatter_add" + tag).c_str(), tn, in, num_features, 1, n), summed,
               want_s, scale_s);
}

[[maybe_unused]] Graph no_edges(int64_t num_rows, int64_t num_cols) {
  Graph g;
  g.num_rows = num_rows;
  g.num_cols = num_cols;
  g.indptr.assign(static_cast<size_t>(num_rows + 1), 0);
  return g;
}

// g with edges only in its first half of rows (`first_half`) or only in its second half: paired
// with the other half of another graph, tiles have one side empty.
[[maybe_unused]] Graph half_rows(const Graph& g, bool first_half) {
  Graph h;
  h.num_rows = g.num_rows;
  h.num_cols = g.num_cols;
  h.indptr.push_back(0);
  for (int64_t r = 0; r < g.num_rows; ++r) {
    if ((r < g.num_rows / 2) == first_half) {
      for (int64_t e = g.indptr[r]; e < g.indptr[r + 1]; ++e) {
        h.indices.push_back(g.indices[e]);
        h.values.push_back(g.values[e]);
      }
    }
    h.indptr.push_back(static_cast<int64_t>(h.indices.size()));
  }
  return h;
}

template <typename T, typename I, int VEC>
void check_width(int64_t num_features, const char* tn, const char* in) {
  const Graph mixed = make_graph(300, 70, 2500, 1);
  const Graph small = make_graph(40, 10, 0, 2);  // rows of 0..8 edges, no huge row
  const Graph remote = make_graph(300, 25, 600, 3);
  for (int64_t hub : {leo::kHubDegree, int64_t{4}}) {  // 4: most rows are hub rows
    check_spmm<T, I, VEC>(mixed, num_features, hub, tn, in);
    check_spmm<T, I, VEC>(small, num_features, hub, tn, in);
    check_fused<T, I, VEC>(mixed, remote, num_features, hub, 3, tn, in);
  }
  check_spmm<T, I, VEC>(no_edges(40, 10), num_features, leo::kHubDegree, tn, in);
  check_fused<T, I, VEC>(no_edges(300, 10), remote, num_features, leo::kHubDegree, 1, tn, in);
  check_fused<T, I, VEC>(mixed, no_edges(300, 10), num_features, leo::kHubDegree, 12, tn, in);
  // Tiles with only local edges next to tiles with only remote edges.
  check_fused<T, I, VEC>(half_rows(mixed, true), half_rows(remote, false), num_features, 64, 3,
                         tn, in);
  if constexpr (VEC > 1) {  // one side unaligned: it reads one element at a time
    check_fused<T, I, VEC, VEC, 1>(mixed, remote, num_features, 64, 3, tn, in);
    check_fused<T, I, VEC, 1, VEC>(mixed, remote, num_features, 64, 3, tn, in);
    check_spmm<T, I, VEC, 1>(mixed, num_features, 64, tn, in);
    check_spmm<T, I, VEC, 1>(small, num_features, 4, tn, in);
  }
  check_rows<T, I, VEC>(num_features, false, tn, in);
  check_rows<T, I, VEC>(num_features, true, tn, in);
}

template <typename T, typename I>
void check_type(const char* tn, const char* in) {
  constexpr int kVec = leo::kMaxVec<T>;
  constexpr int kHalf = leo::kHalfVec<T>;
  for (int64_t f : {1, 3, 8, 40, 64, 136, 300}) check_width<T, I, 1>(f, tn, in);
  for (int64_t f : {kVec, 5 * kVec, 16 * kVec, 40 * kVec}) check_width<T, I, kVec>(f, tn, in);
  if constexpr (kHalf > 1) {  // widths that are a multiple of 8 bytes but not of 16
    for (int64_t f : {kHalf, 5 * kHalf, 71 * kHalf}) check_width<T, I, kHalf>(f, tn, in);
  }
}

template <typename T>
void check_indices(const char* tn) {
  check_type<T, int32_t>(tn, "int32");
  check_type<T, int64_t>(tn, "int64");
}

void expect(bool ok, const std::string& what) {
  ++g_cases;
  if (!ok) fail(what);
}

// The per-tile warp split: a side without edges gets no warp, the link's price moves warps.
void check_tile_split() {
  using leo::remote_warps_for;
  expect(remote_warps_for(100, 0, 3) == 0, "tile without remote edges: every warp local");
  expect(remote_warps_for(0, 5, 3) == leo::kFusedWarps, "tile without local edges: all remote");
  expect(remote_warps_for(0, 0, 3) == 0, "empty tile");
  expect(remote_warps_for(100, 100, 1) == leo::kFusedWarps / 2, "equal work, equal warps");
  expect(remote_warps_for(100, 100, 3) > leo::kFusedWarps / 2, "dearer link, more warps");
  expect(remote_warps_for(1000, 1, 1) == 1, "a side with edges keeps one warp");
}

// Load widths per side: an unaligned side reads one element at a time, the other keeps its
// vectors; a width that is a multiple of 8 bytes but not 16 reads 8-byte vectors.
void check_lane_widths() {
  alignas(16) static float buffer[16];
  const void* aligned = buffer;
  const void* shifted = buffer + 1;  // 4-byte aligned only
  const void* half = buffer + 2;     // 8-byte aligned, not 16
  auto is = [](leo::LaneWidths w, int vec, int first, int second) {
    return w.vec == vec && w.first == first && w.second == second;
  };
  using leo::fused_widths;
  using leo::lane_widths;
  expect(is(fused_widths<float>(8, aligned, aligned), 4, 4, 4), "both sides aligned: vectors");
  expect(is(fused_widths<float>(8, aligned, shifted), 4, 4, 1), "unaligned remote side");
  expect(is(fused_widths<float>(8, shifted, aligned), 4, 1, 4), "unaligned local side");
  expect(is(fused_widths<float>(8, shifted, shifted), 1, 1, 1), "no side aligned");
  expect(is(fused_widths<float>(6, aligned, aligned), 2, 2, 2), "6 floats: 8-byte vectors");
  expect(is(fused_widths<float>(5, aligned, aligned), 1, 1, 1), "5 floats: scalars");
  expect(is(fused_widths<float>(8, half, aligned), 2, 2, 2), "8-byte aligned: 8-byte vectors");
  expect(is(fused_widths<__half>(12, aligned, aligned), 4, 4, 4), "12 halves: 8-byte vectors");
  expect(is(fused_widths<double>(3, aligned, aligned), 1, 1, 1), "odd doubles: scalars");
  // spmm: out (second) must be written in whole vectors; x (first) may read scalars.
  expect(is(lane_widths<float>(8, shifted, aligned, true), 4, 1, 4), "spmm: misaligned x");
  expect(is(lane_widths<float>(8, aligned, shifted, true), 1, 1, 1), "spmm: misaligned out");
  expect(is(lane_widths<float>(8, half, aligned, true), 2, 2, 2), "spmm: x 8-byte aligned");
  expect(leo::common_width<float>(8, aligned, half) == 2, "gather: common 8-byte width");
  expect(leo::common_width<float>(8, aligned, aligned) == 4, "gather: common 16-byte width");
  expect(leo::common_width<float>(8, aligned, shifted) == 1, "gather: no common width");
}

// A lane covering several feature slices of a row loads each edge's index once per pass of
// kSlicesPerPass<VEC> slices, not once per slice: the main pass's index loads are counted.
static_assert(leo::kSlicesPerPass<1> >= 2 && leo::kSlicesPerPass<8> >= 2,
              "a lane must reuse an edge's index across slices");

template <typename T, int VEC>
void check_index_reuse(const Graph& g, int64_t num_features, const char* tn) {
  const auto indptr = cast_indices<int32_t>(g.indptr);
  const auto indices = cast_indices<int32_t>(g.indices);
  const auto values = cast_values<T>(g.values);
  const auto x = random_matrix<T>(g.num_cols, num_features, 7);
  std::vector<T> out(static_cast<size_t>(g.num_rows * num_features));
  const int64_t num_edges = static_cast<int64_t>(g.indices.size());
  const auto cfg = leo::make_spmm_config(g.num_rows, num_edges, num_features, VEC, max_degree(g),
                                         num_edges + 1);  // no hub rows: every edge walked
  leo::SpmmArgs<T, int32_t> a{indptr.data(), indices.data(), values.data(), x.data(), out.data(),
                              nullptr,       g.num_rows,     num_features};
  int64_t walks = 0;  // walks over a row per lane group, summed over its lanes
  for (int lane = 0; lane < cfg.group_lanes; ++lane) {
    walks += leo::ceil_div(leo::lane_slices(num_features, cfg.group_lanes, VEC, lane),
                           leo::kSlicesPerPass<VEC>);
  }
  leo::host_index_loads() = 0;
  run_spmm_main<T, int32_t, VEC, VEC>(a, cfg, out, "index reuse");
  const int64_t loads = leo::host_index_loads();
  const std::string name = case_name("index reuse", tn, "int32", num_features, VEC, num_edges);
  expect(loads == walks * num_edges,
         name + ": " + std::to_string(loads) + " index loads, want " +
             std::to_string(walks * num_edges) + " (each edge once per lane and pass)");
}

void check_index_reuses() {
  const Graph wide = make_graph(64, 30, 600, 8);  // mean degree >= 8: full lane groups
  const Graph short_rows = make_graph(64, 30, 0, 9);  // mean degree < 8: G halved
  check_index_reuse<float, 1>(wide, 256, "float32");   // 8 slices per lane: 2 passes
  check_index_reuse<float, 1>(wide, 96, "float32");    // 3 slices: 1 pass
  check_index_reuse<float, 4>(wide, 384, "float32");   // 3 slices of 128
  check_index_reuse<float, 4>(short_rows, 128, "float32");
  check_index_reuse<double, 2>(wide, 600, "float64");  // uneven slices across lanes
  check_index_reuse<__nv_bfloat16, 8>(wide, 768, "bfloat16");  // 3 slices, 2 a walk
}

// Race mode over cases where threads of one block (and blocks) share outputs: rows split across
// lane groups (shared atomics), hub chunks, duplicate scatter indices.
void check_races() {
  g_race_mode = true;
  const Graph mixed = make_graph(120, 40, 700, 5);
  const Graph remote = make_graph(120, 25, 300, 6);
  check_spmm<float, int32_t, 1>(mixed, 5, 16, "float32", "int32");
  check_spmm<float, int64_t, 4>(mixed, 8, leo::kHubDegree, "float32", "int64");
  const Graph small = make_graph(24, 10, 40, 7);
  check_spmm<float, int32_t, 1>(small, 72, 16, "float32", "int32");  // several slices a lane
  check_spmm<float, int32_t, 4, 1>(small, 136, 16, "float32", "int32");
  check_fused<float, int32_t, 1>(mixed, remote, 5, leo::kHubDegree, 3, "float32", "int32");
  check_fused<double, int64_t, 2>(mixed, remote, 4, 16, 1, "float64", "int64");
  check_fused<float, int32_t, 4, 4, 1>(mixed, remote, 8, 16, 3, "float32", "int32");
  check_rows<float, int32_t, 1>(3, false, "float32", "int32");
  g_race_mode = false;
}

}  // namespace

int main() {
  check_tile_split();
  check_lane_widths();
  check_index_reuses();
  check_races();
#ifndef LEO_RACE_CHECK_ONLY
  check_indices<float>("float32");
  check_indices<double>("float64");
  check_indices<__nv_bfloat16>("bfloat16");
  check_indices<__half>("float16");
#endif
  std::printf("%d cases, %d failed\n", g_cases, g_failures);
  return g_failures == 0 ? 0 : 1;
}
