// Bit-level conversions between fp32 and the 16-bit floats model files hold
// (bf16 and IEEE half), shared by the llm.c and safetensors readers and writers.
#pragma once
#include <cstdint>
#include <cstring>

namespace qattn {

// Rounds to nearest, ties to even; a NaN stays a (quiet) NaN.
inline uint16_t bf16_from_float(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float float_from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// IEEE binary16 -> fp32, exact (subnormals, infinities and NaNs included).
inline float float_from_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  uint32_t u;
  if (exponent == 0x1F) {
    u = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    u = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    u = sign;
  } else {  // subnormal: mantissa * 2^-24, exact in fp32
    float x = static_cast<float>(mantissa) * 0x1p-24f;
    std::memcpy(&u, &x, 4);
    u |= sign;
  }
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace qattn
