// The operand quantisers of docs/attention-maths.md §4.1, shared by sage and
// its composition with a quantised softmax: psi (int8 levels with one fp32
// scale per group) and bf16 rounding, and the dot product each matmul
// accumulates.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

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

// How one int8 scale is shared over a (rows, cols) tile.
enum class ScaleGroup { whole, per_row, per_col };

inline int group_count(ScaleGroup g, int rows, int cols) {
  return g == ScaleGroup::per_row ? rows : g == ScaleGroup::per_col ? cols : 1;
}
inline int group_index(ScaleGroup g, int r, int c) {
  return g == ScaleGroup::per_row ? r : g == ScaleGroup::per_col ? c : 0;
}

// One operand of one matmul as the kernel sees it: int8 levels with scales, or
// bf16-rounded values (then every scale is 1).
template <typename F>
struct Operand {
  Precision precision;
  ScaleGroup group;
  int rows, cols;
  std::vector<F> value;  // (rows, cols): levels in [-127, 127], exact in F, or bf16 values
  std::vector<F> scale;  // one per group: 1, rows or cols of them

  const F* row(int r) const { return value.data() + (size_t)r * cols; }
  F scale_of(int r, int c) const { return scale[group_index(group, r, c)]; }
};

// x (rows, cols) with leading dimension ld -> its operand: for int8,
// X^ = round-half-away-from-zero(X / s) with s = psi's scale of each group.
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
  for (F a : amax) op.scale.push_back(int8_scale(a));
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++)
      op.value[(size_t)r * cols + c] = std::round(at(r, c) / op.scale_of(r, c));  // half away from 0
  return op;
}

// sum_n a[n * inc_a] b[n * inc_b] as the kernel accumulates it: exactly in int32
// for int8 levels, in F (fp32 in training) for bf16 values.
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
