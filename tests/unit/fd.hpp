// Finite differences in double for gradient tests: central differences of a
// scalar loss, compared to the analytic gradient by relative L2 error.
#pragma once
#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace qattn::test {

inline std::vector<double> random_vector(size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> g(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

// d loss / d x[i] by central differences, for every i.
inline std::vector<double> numeric_gradient(std::vector<double>& x, const std::function<double()>& loss,
                                            double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

inline double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace qattn::test
