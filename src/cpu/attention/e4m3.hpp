// The e4m3 number format (docs/attention-maths.md §1.2, §4.12): 1 sign bit, 4
// exponent bits with bias 7, 3 mantissa bits, no infinities. Codes 0x7f and
// 0xff are NaN; the largest finite magnitude is 448 (0x7e); exponent field 0
// holds the subnormals m * 2^-9. The conversion from float rounds to nearest,
// ties to even, and saturates: every |x| > 448, infinities included, gives
// +-448; NaN gives 0x7f whatever its sign. This is CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) and the hardware's
// cvt.rn.satfinite.e4m3x2.f32.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace qattn::cpu {

inline constexpr float kE4m3Max = 448.0f;

inline uint8_t e4m3_encode(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= kE4m3Max) return sign | 0x7e;
  if (a == 0) return sign;  // frexp gives no binade for zero
  // The spacing of e4m3 values around a is 2^q: q = max(floor(log2 a), -6) - 3,
  // so a / 2^q (exact: a power-of-two scaling) lies in [8, 16) for a normal a
  // and in [0, 8) below 2^-6. Its nearest integer n, ties to even, is the
  // significand: the value is n 2^q, and n = 16 carries into the next binade.
  int e = 0;
  std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1): floor(log2 a) = e - 1
  const int q = std::max(e - 1, -6) - 3;
  const int n = int(std::nearbyint(std::ldexp(a, -q)));  // default rounding: ties to even
  // Exponent field q + 10 (bias 7 plus 3 mantissa bits), mantissa n - 8; below
  // 2^-6 (q = -9) this is the subnormal code n, and n = 16 adds one to the field.
  return uint8_t(sign | (((q + 10) << 3) + n - 8));
}

inline float e4m3_decode(uint8_t code) {
  const int field = (code >> 3) & 0xf, mantissa = code & 0x7;
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  if (field == 0xf && mantissa == 0x7) return std::nanf("");
  if (field == 0) return sign * std::ldexp(float(mantissa), -9);
  return sign * std::ldexp(float(8 + mantissa), field - 10);
}

// x rounded to the nearest e4m3 value (saturating), as F. A double is first
// rounded to float, as the GPU converts fp32 values.
template <typename F>
F round_to_e4m3(F x) {
  return F(e4m3_decode(e4m3_encode(float(x))));
}

}  // namespace qattn::cpu
