// Host emulation of the GAT kernels (cuda/include/gat.cuh): runs their per-thread bodies on
// the CPU, item by item, and compares every result with a float64 reference written here
// from the formulas (scores, softmax per row and head, weighted sum per head). Graphs have
// empty rows, one huge row and repeated columns; float and double, int32 and int64 indices.
// tests/kernels/test_gat_cuda.py builds it with nvcc and runs it.
//
// Build: nvcc -std=c++17 -O1 -I cuda/include cuda/tests/gat_emulation.cu -o gat_emulate
// Exit status 0 when every case matches; failures are printed one per line.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gat.cuh"

namespace {

constexpr double kSlope = 0.2;

struct Case {
  int64_t rows = 0, cols = 0, heads = 0, feats = 0;
  std::vector<int64_t> indptr, indices;
  std::vector<double> a_src, a_dst, x;
};

Case make_case(int64_t rows, int64_t cols, int64_t heads, int64_t feats, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> value(-2.0, 2.0);
  Case c{rows, cols, heads, feats, {0}, {}, {}, {}, {}};
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t degree = i % 5 == 0 ? 0 : (i == 1 ? 70 : static_cast<int64_t>(rng() % 9));
    for (int64_t k = 0; k < degree; ++k) c.indices.push_back(static_cast<int64_t>(rng() % cols));
    if (degree > 2) c.indices.back() = c.indices[c.indices.size() - 2];  // a repeated column
    c.indptr.push_back(static_cast<int64_t>(c.indices.size()));
  }
  for (int64_t k = 0; k < cols * heads; ++k) c.a_src.push_back(value(rng));
  for (int64_t k = 0; k < rows * heads; ++k) c.a_dst.push_back(value(rng));
  for (int64_t k = 0; k < cols * heads * feats; ++k) c.x.push_back(value(rng));
  return c;
}

// The reference: scores, softmax and the weighted sum, in float64, from the formulas.
void reference(const Case& c, std::vector<double>& scores, std::vector<double>& alpha,
               std::vector<double>& out) {
  const int64_t H = c.heads, F = c.feats;
  scores.assign(c.indices.size() * H, 0.0);
  alpha.assign(c.indices.size() * H, 0.0);
  out.assign(c.rows * H * F, 0.0);
  for (int64_t i = 0; i < c.rows; ++i) {
    for (int64_t h = 0; h < H; ++h) {
      double top = -INFINITY, sum = 0.0;
      for (int64_t e = c.indptr[i]; e < c.indptr[i + 1]; ++e) {
        const double s = c.a_src[c.indices[e] * H + h] + c.a_dst[i * H + h];
        scores[e * H + h] = s > 0 ? s : kSlope * s;
        top = std::fmax(top, scores[e * H + h]);
      }
      for (int64_t e = c.indptr[i]; e < c.indptr[i + 1]; ++e) sum += std::exp(scores[e * H + h] - top);
      for (int64_t e = c.indptr[i]; e < c.indptr[i + 1]; ++e) {
        alpha[e * H + h] = std::exp(scores[e * H + h] - top) / sum;
        for (int64_t f = 0; f < F; ++f) {
          out[(i * H + h) * F + f] += alpha[e * H + h] * c.x[(c.indices[e] * H + h) * F + f];
        }
      }
    }
  }
}

int failures = 0;

template <typename T>
void compare(const std::string& what, const std::vector<T>& got, const std::vector<double>& want,
             double tol) {
  for (size_t k = 0; k < want.size(); ++k) {
    const double g = static_cast<double>(got[k]);
    if (std::fabs(g - want[k]) > tol * (1.0 + std::fabs(want[k]))) {
      std::printf("FAIL %s at %zu: got %.9g want %.9g\n", what.c_str(), k, g, want[k]);
      ++failures;
      return;
    }
  }
}

template <typename T, typename I>
void run_case(const Case& c, const std::string& name, double tol) {
  std::vector<I> indptr(c.indptr.begin(), c.indptr.end());
  std::vector<I> indices(c.indices.begin(), c.indices.end());
  std::vector<T> a_src(c.a_src.begin(), c.a_src.end()), a_dst(c.a_dst.begin(), c.a_dst.end());
  std::vector<T> x(c.x.begin(), c.x.end());
  const size_t num_edges = c.indices.size();
  std::vector<T> scores(num_edges * c.heads), alpha(num_edges * c.heads);
  std::vector<T> out(c.rows * c.heads * c.feats);
  std::vector<double> want_scores, want_alpha, want_out;
  reference(c, want_scores, want_alpha, want_out);

  leo::GatScoresArgs<T, I> sa{indptr.data(), indices.data(), a_src.data(), a_dst.data(),
                              scores.data(), c.heads, kSlope};
  for (int64_t t = 0; t < c.rows * c.heads; ++t) leo::gat_scores_item(sa, t);
  compare(name + " scores", scores, want_scores, tol);
  // The softmax and the SpMM read the reference's inputs, so each stage is checked alone.
  std::vector<T> ref_scores(want_scores.begin(), want_scores.end());
  leo::EdgeSoftmaxArgs<T, I> ea{indptr.data(), ref_scores.data(), alpha.data(), c.heads};
  for (int64_t t = 0; t < c.rows * c.heads; ++t) leo::edge_softmax_item(ea, t);
  compare(name + " softmax", alpha, want_alpha, tol);
  std::vector<T> ref_alpha(want_alpha.begin(), want_alpha.end());
  leo::GatSpmmArgs<T, I> pa{indptr.data(), indices.data(), ref_alpha.data(), x.data(),
                            out.data(), c.heads, c.feats};
  for (int64_t t = 0; t < c.rows * c.heads * c.feats; ++t) leo::gat_spmm_item(pa, t);
  compare(name + " spmm", out, want_out, tol);
}

}  // namespace

int main() {
  int cases = 0;
  for (int64_t heads : {1, 3, 8}) {
    const Case c = make_case(23, 17, heads, 5, 7 + static_cast<uint64_t>(heads));
    const std::string name = "heads=" + std::to_string(heads);
    run_case<double, int64_t>(c, name + " f64/i64", 1e-12);
    run_case<double, int32_t>(c, name + " f64/i32", 1e-12);
    run_case<float, int32_t>(c, name + " f32/i32", 1e-5);
    cases += 3;
  }
  std::printf("gat emulation: %d cases, %d failed\n", cases, failures);
  return failures == 0 ? 0 : 1;
}
