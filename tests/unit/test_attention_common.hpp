// Shared by the attention tests: random heads, the attention kinds' internal
// header, finite differences of L = <dout, o(q, k, v)>, and tensor agreement.
#pragma once
#include <cmath>
#include <cstdio>
#include <string>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "../../src/cpu/attention/kinds.hpp"
#include "qattn/cpu/attention.hpp"

namespace qattn::test {

inline std::vector<double> gaussian(size_t n, double sigma, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, sigma);
  std::vector<double> x(n);
  for (double& e : x) e = normal(rng);
  return x;
}

template <typename F>
std::vector<F> cast(const std::vector<double>& x) {
  return std::vector<F>(x.begin(), x.end());
}

// One (batch, head) of inputs: q, k with standard deviation sigma_qk; v and dout
// standard normal. (T, d) each.
struct Head {
  int T, d;
  std::vector<double> q, k, v, dout;
  Head(int T_, int d_, double sigma_qk, uint64_t seed)
      : T(T_),
        d(d_),
        q(gaussian((size_t)T_ * d_, sigma_qk, seed)),
        k(gaussian((size_t)T_ * d_, sigma_qk, seed + 1)),
        v(gaussian((size_t)T_ * d_, 1.0, seed + 2)),
        dout(gaussian((size_t)T_ * d_, 1.0, seed + 3)) {}
  size_t size() const { return (size_t)T * d; }
};

// A kind's outputs on one head.
template <typename F>
struct Grads {
  std::vector<F> o, dq, dk, dv;
  cpu::AttentionInternals<F> inner;
};

template <typename F>
Grads<F> run_kind(const AttentionConfig& cfg, const Head& h) {
  const auto q = cast<F>(h.q), k = cast<F>(h.k), v = cast<F>(h.v), dout = cast<F>(h.dout);
  Grads<F> g{std::vector<F>(h.size()), std::vector<F>(h.size()), std::vector<F>(h.size()),
             std::vector<F>(h.size()), {}};
  cpu::attention_forward(cfg, h.T, h.d, q.data(), k.data(), v.data(), g.o.data());
  cpu::attention_backward(cfg, h.T, h.d, q.data(), k.data(), v.data(), g.o.data(), dout.data(),
                          g.dq.data(), g.dk.data(), g.dv.data());
  return g;
}

// Cosine similarity of x against the reference r.
template <typename A, typename B>
double cosine(const std::vector<A>& x, const std::vector<B>& r) {
  double xr = 0, xx = 0, rr = 0;
  for (size_t n = 0; n < x.size(); n++) {
    xr += double(x[n]) * double(r[n]);
    xx += double(x[n]) * double(x[n]);
    rr += double(r[n]) * double(r[n]);
  }
  return xr / std::sqrt(xx * rr);
}

// The cosines of O, dQ, dK, dV of a kind run in float (as the kernels run it)
// against FPA in double on the same head (SageBwd's Table 1 quantities).
struct Cosines {
  double o, dq, dk, dv;
};
inline Cosines cosines_vs_fpa(const AttentionConfig& cfg, const Head& h, const Grads<double>& fpa) {
  const Grads<float> g = run_kind<float>(cfg, h);
  return {cosine(g.o, fpa.o), cosine(g.dq, fpa.dq), cosine(g.dk, fpa.dk), cosine(g.dv, fpa.dv)};
}
inline std::string show(const Cosines& c) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "O %.5f dQ %.5f dK %.5f dV %.5f", c.o, c.dq, c.dk, c.dv);
  return buf;
}

// ||x - r|| / ||r||.
template <typename A, typename B>
double rel_l2(const std::vector<A>& x, const std::vector<B>& r) {
  double ee = 0, rr = 0;
  for (size_t n = 0; n < x.size(); n++) {
    const double e = double(x[n]) - double(r[n]);
    ee += e * e;
    rr += double(r[n]) * double(r[n]);
  }
  return std::sqrt(ee / rr);
}

// max |x - r| / max |r|.
inline double max_rel(const std::vector<double>& x, const std::vector<double>& r) {
  double e = 0, m = 0;
  for (size_t n = 0; n < x.size(); n++) {
    e = std::max(e, std::abs(x[n] - r[n]));
    m = std::max(m, std::abs(r[n]));
  }
  return e / m;
}

// Central finite differences of L = <dout, forward(q, k, v)> with respect to
// every entry of q, k and v, in double; returned as (dq, dk, dv) concatenated.
using Forward = std::function<void(const double* q, const double* k, const double* v, double* o)>;
inline std::vector<double> finite_difference_grads(const Head& h, const Forward& forward,
                                                   double step = 1e-5) {
  Head x = h;
  std::vector<double> o(h.size()), grads;
  const auto loss = [&] {
    forward(x.q.data(), x.k.data(), x.v.data(), o.data());
    double l = 0;
    for (size_t n = 0; n < o.size(); n++) l += h.dout[n] * o[n];
    return l;
  };
  for (std::vector<double>* t : {&x.q, &x.k, &x.v}) {
    for (double& e : *t) {
      const double keep = e;
      e = keep + step;
      const double up = loss();
      e = keep - step;
      const double down = loss();
      e = keep;
      grads.push_back((up - down) / (2 * step));
    }
  }
  return grads;
}

inline std::vector<double> concat(const std::vector<double>& a, const std::vector<double>& b,
                                  const std::vector<double>& c) {
  std::vector<double> x(a);
  x.insert(x.end(), b.begin(), b.end());
  x.insert(x.end(), c.begin(), c.end());
  return x;
}

}  // namespace qattn::test
