// Host emulation of LEO's CUDA kernels: runs the per-thread kernel bodies of cuda/include on the
// CPU, block by block and thread by thread (phase by phase where a kernel has barriers), with the
// launchers' own configuration functions, and compares every result with a float64 reference.
// It proves the index arithmetic (lane groups, tiles, edge ranges, row search, vector widths) on
// machines without a GPU; tests/kernels/test_compile.py builds it with nvcc and runs it.
//
// Build: nvcc -std=c++17 -O2 -I cuda/include cuda/tests/host_emulation.cu -o emulate
// Exit status 0 when every case matches; failures are printed one per line.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "fused_aggregate.cuh"
#include "row_ops.cuh"
#include "spmm_csr.cuh"

namespace {

using leo::AccT;
using leo::NumTraits;

struct Graph {
  int64_t num_rows = 0;
  int64_t num_cols = 0;
  std::vector<int64_t> indptr;
  std::vector<int64_t> indices;
  std::vector<double> values;
};

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

int g_failures = 0;
int g_cases = 0;

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

// Float64 reference of A @ x (+ sum |terms| per output element for the tolerance).
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
                      int vec, int64_t num_edges) {
  return std::string(op) + "[" + type + "," + index + ",F=" + std::to_string(features) +
         ",VEC=" + std::to_string(vec) + ",E=" + std::to_string(num_edges) + "]";
}

template <typename T, typename I, int VEC>
void check_spmm(const Graph& g, int64_t num_features, const char* tn, const char* in) {
  const auto indptr = cast_indices<I>(g.indptr);
  const auto indices = cast_indices<I>(g.indices);
  const auto values = cast_values<T>(g.values);
  const auto x = random_matrix<T>(g.num_cols, num_features, 7);
  std::vector<T> out(static_cast<size_t>(g.num_rows * num_features), to_storage<T>(99.0));
  leo::SpmmArgs<T, I> a{indptr.data(), indices.data(), values.data(),
                        x.data(),      out.data(),     g.num_rows, num_features};
  const auto cfg = leo::make_spmm_config(g.num_rows, static_cast<int64_t>(g.indices.size()),
                                         num_features, VEC);
  for (int64_t b = 0; b < cfg.blocks; ++b) {
    for (int t = 0; t < cfg.threads; ++t) leo::spmm_thread<T, I, VEC>(a, cfg, b, t);
  }
  std::vector<double> want(out.size(), 0.0), scale(out.size(), 0.0);
  reference_spmm(g, values, x, num_features, want, scale);
  expect_close(case_name("spmm", tn, in, num_features, VEC, g.indices.size()), out, want, scale);
}

template <typename T, typename I, int VEC>
void check_fused(const Graph& local, const Graph& remote, int64_t num_features, const char* tn,
                 const char* in) {
  using Acc = AccT<T>;
  const auto l_indptr = cast_indices<I>(local.indptr);
  const auto l_indices = cast_indices<I>(local.indices);
  const auto l_values = cast_values<T>(local.values);
  const auto r_indptr = cast_indices<I>(remote.indptr);
  const auto r_indices = cast_indices<I>(remote.indices);
  const auto r_values = cast_values<T>(remote.values);
  const auto x_local = random_matrix<T>(local.num_cols, num_features, 11);
  const auto x_remote = random_matrix<T>(remote.num_cols, num_features, 13);
  std::vector<T> out(static_cast<size_t>(local.num_rows * num_features), to_storage<T>(99.0));
  leo::FusedArgs<T, I> a;
  a.local = {l_indptr.data(), l_indices.data(), l_values.data(), x_local.data()};
  a.remote = {r_indptr.data(), r_indices.data(), r_values.data(), x_remote.data()};
  a.out = out.data();
  a.num_rows = local.num_rows;
  a.num_features = num_features;
  const auto cfg = leo::make_fused_config(
      local.num_rows, static_cast<int64_t>(local.indices.size()),
      static_cast<int64_t>(remote.indices.size()), num_features, VEC, sizeof(Acc));
  std::vector<Acc> shared(static_cast<size_t>(cfg.smem_bytes) / sizeof(Acc));
  for (int64_t tile = 0; tile < cfg.row_tiles; ++tile) {
    for (int64_t chunk = 0; chunk < cfg.feature_chunks; ++chunk) {
      // Each loop over threads is one phase; the kernel separates them with __syncthreads().
      for (int t = 0; t < cfg.threads; ++t) leo::fused_zero(cfg, t, shared.data());
      for (int t = 0; t < cfg.threads; ++t) {
        leo::fused_accumulate<T, I, VEC>(a, cfg, tile, chunk, t, shared.data());
      }
      for (int t = 0; t < cfg.threads; ++t) {
        leo::fused_store<T, I>(a, cfg, tile, chunk, t, shared.data());
      }
    }
  }
  std::vector<double> want(out.size(), 0.0), scale(out.size(), 0.0);
  reference_spmm(local, l_values, x_local, num_features, want, scale);
  reference_spmm(remote, r_values, x_remote, num_features, want, scale);
  const int64_t edges = static_cast<int64_t>(local.indices.size() + remote.indices.size());
  expect_close(case_name("fused", tn, in, num_features, VEC, edges), out, want, scale);
}

template <typename T, typename I, int VEC>
void check_rows(int64_t num_features, const char* tn, const char* in) {
  const int64_t src_rows = 50;
  std::vector<int64_t> idx64;
  for (int64_t i = 0; i < 120; ++i) idx64.push_back((i * 37 + i / 3) % src_rows);
  const auto idx = cast_indices<I>(idx64);
  const int64_t n = static_cast<int64_t>(idx.size());
  const auto x = random_matrix<T>(src_rows, num_features, 17);
  // Gather.
  std::vector<T> gathered(static_cast<size_t>(n * num_features));
  leo::GatherArgs<T, I> ga{x.data(), idx.data(), gathered.data(), n, num_features};
  for (int64_t t = 0; t < n * (num_features / VEC); ++t) leo::gather_item<T, I, VEC>(ga, t);
  std::vector<double> want(gathered.size()), scale(gathered.size());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t f = 0; f < num_features; ++f) {
      want[i * num_features + f] = from_storage(x[idx64[i] * num_features + f]);
      scale[i * num_features + f] = std::fabs(want[i * num_features + f]);
    }
  }
  expect_close(case_name("gather", tn, in, num_features, VEC, n), gathered, want, scale);
  // Scatter-add of the gathered rows back: row r receives x[r] times its multiplicity.
  std::vector<AccT<T>> acc(static_cast<size_t>(src_rows * num_features), AccT<T>(0));
  leo::ScatterArgs<T, I> sa{gathered.data(), idx.data(), acc.data(), n, num_features};
  for (int64_t t = 0; t < n * num_features; ++t) leo::scatter_add_item<T, I>(sa, t);
  std::vector<T> summed(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) summed[i] = NumTraits<T>::store(acc[i]);
  std::vector<double> want_s(acc.size(), 0.0), scale_s(acc.size(), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t f = 0; f < num_features; ++f) {
      const double v = from_storage(x[idx64[i] * num_features + f]);
      want_s[idx64[i] * num_features + f] += v;
      scale_s[idx64[i] * num_features + f] += std::fabs(v);
    }
  }
  expect_close(case_name("scatter_add", tn, in, num_features, 1, n), summed, want_s, scale_s);
}

template <typename T, typename I, int VEC>
void check_width(int64_t num_features, const char* tn, const char* in) {
  const Graph mixed = make_graph(300, 70, 2500, 1);
  const Graph empty = make_graph(40, 10, 0, 2);  // rows of 0..8 edges, no huge row
  Graph no_edges;
  no_edges.num_rows = 40;
  no_edges.num_cols = 10;
  no_edges.indptr.assign(41, 0);
  const Graph remote = make_graph(300, 25, 600, 3);
  check_spmm<T, I, VEC>(mixed, num_features, tn, in);
  check_spmm<T, I, VEC>(empty, num_features, tn, in);
  check_spmm<T, I, VEC>(no_edges, num_features, tn, in);
  check_fused<T, I, VEC>(mixed, remote, num_features, tn, in);
  Graph remote_only_local = no_edges;  // same 300 rows, no local edges
  remote_only_local.num_rows = 300;
  remote_only_local.indptr.assign(301, 0);
  check_fused<T, I, VEC>(remote_only_local, remote, num_features, tn, in);
  check_fused<T, I, VEC>(mixed, remote_only_local, num_features, tn, in);
  check_rows<T, I, VEC>(num_features, tn, in);
}

template <typename T, typename I>
void check_type(const char* tn, const char* in) {
  constexpr int kVec = leo::kMaxVec<T>;
  for (int64_t f : {1, 3, 8, 40, 64, 136, 300}) check_width<T, I, 1>(f, tn, in);
  for (int64_t f : {kVec, 5 * kVec, 16 * kVec, 40 * kVec}) check_width<T, I, kVec>(f, tn, in);
}

template <typename T>
void check_indices(const char* tn) {
  check_type<T, int32_t>(tn, "int32");
  check_type<T, int64_t>(tn, "int64");
}

}  // namespace

int main() {
  check_indices<float>("float32");
  check_indices<double>("float64");
  check_indices<__nv_bfloat16>("bfloat16");
  check_indices<__half>("float16");
  std::printf("%d cases, %d failed\n", g_cases, g_failures);
  return g_failures == 0 ? 0 : 1;
}
