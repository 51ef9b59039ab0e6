// The operand quantisers of docs/attention-maths.md §4.1 and §4.12, shared by
// sage and its composition with a quantised softmax: psi (int8 levels with one
// fp32 scale per group), e4m3 with a power-of-two scale per group, bf16
// rounding, and the dot product each matmul accumulates.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "e4m3.hpp"
#include "qattn/attention.hpp"

namespace qattn::cpu {

// Nearest bf16 (ties to even), the GPU's float -> bf16 conversion. A double is
// first rounded to float.
inline float round_to_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::bit_cast<float>(u & 0xffff0000u);
}
template <typename F>
F bf16(F x) {
  return F(round_to_bf16(float(x)));
}

// psi's scale: s = max|X| / 127, and 1 when max|X| = 0.
template <typename F>
F int8_scale(F amax) {
  return amax == 0 ? F(1) : amax / F(127);
}

// fp8's scale exponent of a group whose largest magnitude is amax (§4.12): the
// smallest e with amax <= 2^(e + 8), so that x / 2^e lies in [-256, 256]; 0
// when amax = 0.
template <typename F>
int fp8_exponent(F amax) {
  if (amax == 0) return 0;
  int e = 0;
  const F f = std::frexp(amax, &e);  // amax = f 2^e, f in [0.5, 1)
  return (f == F(0.5) ? e - 1 : e) - 8;
}

// How one scale is shared over a (rows, cols) tile.
enum class ScaleGroup { whole, per_row, per_col };

inline int group_count(ScaleGroup g, int rows, int cols) {
  return g == ScaleGroup::per_row ? rows : g == ScaleGroup::per_col ? cols : 1;
}
inline int group_index(ScaleGroup g, int r, int c) {
  return g == ScaleGroup::per_row ? r : g == ScaleGroup::per_col ? c : 0;
}

// One operand of one matmul as the kernel sees it: int8 levels with scales,
// e4m3 values with power-of-two scales, or bf16-rounded values (then every
// scale is 1).
template <typename F>
struct Operand {
  Precision precision;
  ScaleGroup group;
  int rows, cols;
  std::vector<F> value;  // (rows, cols): int8 levels or e4m3 values (exact in F), or bf16 values
  std::vector<F> scale;  // one per group: 1, rows or cols of them
  F peak = 0;            // fp8: the largest |x / s| before the cast (saturation above 448)

  const F* row(int r) const { return value.data() + (size_t)r * cols; }
  F scale_of(int r, int c) const { return scale[group_index(group, r, c)]; }
};

// x (rows, cols) with leading dimension ld -> its fp8 operand with the given
// scale exponent of each group: X^ = e4m3(X 2^-e), s = 2^e. The scaling is
// exact, so the one rounding is e4m3's.
template <typename F>
Operand<F> quantise_fp8(ScaleGroup group, const F* x, int rows, int cols, size_t ld,
                        const std::vector<int>& exponent) {
  Operand<F> op{Precision::fp8, group, rows, cols, std::vector<F>((size_t)rows * cols), {}};
  for (int e : exponent) op.scale.push_back(std::ldexp(F(1), e));
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      const F scaled = std::ldexp(x[(size_t)r * ld + c], -exponent[group_index(group, r, c)]);
      op.peak = std::max(op.peak, std::abs(scaled));
      op.value[(size_t)r * cols + c] = round_to_e4m3(scaled);
    }
  return op;
}

// x (rows, cols) with leading dimension ld -> its operand, each group scaled
// by its own largest magnitude: for int8, X^ = round-half-away-from-zero(X / s)
// with s = psi's scale; for fp8, the exponent of fp8_exponent.
template <typename F>
Operand<F> quantise(Precision precision, ScaleGroup group, const F* x, int rows, int cols,
                    size_t ld) {
  Operand<F> op{precision, group, rows, cols, std::vector<F>((size_t)rows * cols), {}};
  const auto at = [&](int r, int c) { return x[(size_t)r * ld + c]; };
  if (precision == Precision::bf16) {
    op.scale.assign(group_count(group, rows, cols), F(1));
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < cols; c++) op.value[(size_t)r * cols + c] = bf16(at(r, c));
    return op;
  }
  std::vector<F> amax(group_count(group, rows, cols), F(0));
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      F& a = amax[group_index(group, r, c)];
      a = std::max(a, std::abs(at(r, c)));
    }
  if (precision == Precision::fp8) {
    std::vector<int> exponent;
    for (F a : amax) exponent.push_back(fp8_exponent(a));
    return quantise_fp8(group, x, rows, cols, ld, exponent);
  }
  for (F a : amax) op.scale.push_back(int8_scale(a));
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++)
      op.value[(size_t)r * cols + c] = std::round(at(r, c) / op.scale_of(r, c));  // half away from 0
  return op;
}

// The scale exponent of a power-of-two scale (fp8 operands).
template <typename F>
int exponent_of(F scale) {
  return std::ilogb(scale);
}

// sum_n a[n * inc_a] b[n * inc_b] as the kernel accumulates it: exactly in int32
// for int8 levels, in F (fp32 in training) in order of n for bf16 and e4m3
// values (a product of two e4m3 values is exact in F).
template <typename F>
F operand_dot(Precision precision, const F* a, size_t inc_a, const F* b, size_t inc_b, int n) {
  if (precision == Precision::int8) {
    int32_t acc = 0;
    for (int x = 0; x < n; x++) acc += int32_t(a[x * inc_a]) * int32_t(b[x * inc_b]);
    return F(acc);
  }
  F acc = 0;
  for (int x = 0; x < n; x++) acc += a[x * inc_a] * b[x * inc_b];
  return acc;
}

}  // namespace qattn::cpu
