// The e4m3 format of docs/attention-maths.md §1.2 (src/cpu/attention/e4m3.hpp):
// every code against a literal table, and the rounding of float to e4m3 at
// every tie, at the saturation edge, below the smallest subnormal, and for NaN.
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>

#include "../../src/cpu/attention/e4m3.hpp"

using namespace qattn::cpu;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The value of every code 0x00 ... 0xff, printed in hexadecimal by CUDA 13.0's
// host converter (__half2float(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3))).
const float kE4m3Values[256] = {
    0x0p+0f,  0x1p-9f,    0x1p-8f,    0x1.8p-8f,  0x1p-7f,    0x1.4p-7f,  0x1.8p-7f,  0x1.cp-7f,
    0x1p-6f,  0x1.2p-6f,  0x1.4p-6f,  0x1.6p-6f,  0x1.8p-6f,  0x1.ap-6f,  0x1.cp-6f,  0x1.ep-6f,
    0x1p-5f,  0x1.2p-5f,  0x1.4p-5f,  0x1.6p-5f,  0x1.8p-5f,  0x1.ap-5f,  0x1.cp-5f,  0x1.ep-5f,
    0x1p-4f,  0x1.2p-4f,  0x1.4p-4f,  0x1.6p-4f,  0x1.8p-4f,  0x1.ap-4f,  0x1.cp-4f,  0x1.ep-4f,
    0x1p-3f,  0x1.2p-3f,  0x1.4p-3f,  0x1.6p-3f,  0x1.8p-3f,  0x1.ap-3f,  0x1.cp-3f,  0x1.ep-3f,
    0x1p-2f,  0x1.2p-2f,  0x1.4p-2f,  0x1.6p-2f,  0x1.8p-2f,  0x1.ap-2f,  0x1.cp-2f,  0x1.ep-2f,
    0x1p-1f,  0x1.2p-1f,  0x1.4p-1f,  0x1.6p-1f,  0x1.8p-1f,  0x1.ap-1f,  0x1.cp-1f,  0x1.ep-1f,
    0x1p+0f,  0x1.2p+0f,  0x1.4p+0f,  0x1.6p+0f,  0x1.8p+0f,  0x1.ap+0f,  0x1.cp+0f,  0x1.ep+0f,
    0x1p+1f,  0x1.2p+1f,  0x1.4p+1f,  0x1.6p+1f,  0x1.8p+1f,  0x1.ap+1f,  0x1.cp+1f,  0x1.ep+1f,
    0x1p+2f,  0x1.2p+2f,  0x1.4p+2f,  0x1.6p+2f,  0x1.8p+2f,  0x1.ap+2f,  0x1.cp+2f,  0x1.ep+2f,
    0x1p+3f,  0x1.2p+3f,  0x1.4p+3f,  0x1.6p+3f,  0x1.8p+3f,  0x1.ap+3f,  0x1.cp+3f,  0x1.ep+3f,
    0x1p+4f,  0x1.2p+4f,  0x1.4p+4f,  0x1.6p+4f,  0x1.8p+4f,  0x1.ap+4f,  0x1.cp+4f,  0x1.ep+4f,
    0x1p+5f,  0x1.2p+5f,  0x1.4p+5f,  0x1.6p+5f,  0x1.8p+5f,  0x1.ap+5f,  0x1.cp+5f,  0x1.ep+5f,
    0x1p+6f,  0x1.2p+6f,  0x1.4p+6f,  0x1.6p+6f,  0x1.8p+6f,  0x1.ap+6f,  0x1.cp+6f,  0x1.ep+6f,
    0x1p+7f,  0x1.2p+7f,  0x1.4p+7f,  0x1.6p+7f,  0x1.8p+7f,  0x1.ap+7f,  0x1.cp+7f,  0x1.ep+7f,
    0x1p+8f,  0x1.2p+8f,  0x1.4p+8f,  0x1.6p+8f,  0x1.8p+8f,  0x1.ap+8f,  0x1.cp+8f,  kNaN,
    -0x0p+0f, -0x1p-9f,   -0x1p-8f,   -0x1.8p-8f, -0x1p-7f,   -0x1.4p-7f, -0x1.8p-7f, -0x1.cp-7f,
    -0x1p-6f, -0x1.2p-6f, -0x1.4p-6f, -0x1.6p-6f, -0x1.8p-6f, -0x1.ap-6f, -0x1.cp-6f, -0x1.ep-6f,
    -0x1p-5f, -0x1.2p-5f, -0x1.4p-5f, -0x1.6p-5f, -0x1.8p-5f, -0x1.ap-5f, -0x1.cp-5f, -0x1.ep-5f,
    -0x1p-4f, -0x1.2p-4f, -0x1.4p-4f, -0x1.6p-4f, -0x1.8p-4f, -0x1.ap-4f, -0x1.cp-4f, -0x1.ep-4f,
    -0x1p-3f, -0x1.2p-3f, -0x1.4p-3f, -0x1.6p-3f, -0x1.8p-3f, -0x1.ap-3f, -0x1.cp-3f, -0x1.ep-3f,
    -0x1p-2f, -0x1.2p-2f, -0x1.4p-2f, -0x1.6p-2f, -0x1.8p-2f, -0x1.ap-2f, -0x1.cp-2f, -0x1.ep-2f,
    -0x1p-1f, -0x1.2p-1f, -0x1.4p-1f, -0x1.6p-1f, -0x1.8p-1f, -0x1.ap-1f, -0x1.cp-1f, -0x1.ep-1f,
    -0x1p+0f, -0x1.2p+0f, -0x1.4p+0f, -0x1.6p+0f, -0x1.8p+0f, -0x1.ap+0f, -0x1.cp+0f, -0x1.ep+0f,
    -0x1p+1f, -0x1.2p+1f, -0x1.4p+1f, -0x1.6p+1f, -0x1.8p+1f, -0x1.ap+1f, -0x1.cp+1f, -0x1.ep+1f,
    -0x1p+2f, -0x1.2p+2f, -0x1.4p+2f, -0x1.6p+2f, -0x1.8p+2f, -0x1.ap+2f, -0x1.cp+2f, -0x1.ep+2f,
    -0x1p+3f, -0x1.2p+3f, -0x1.4p+3f, -0x1.6p+3f, -0x1.8p+3f, -0x1.ap+3f, -0x1.cp+3f, -0x1.ep+3f,
    -0x1p+4f, -0x1.2p+4f, -0x1.4p+4f, -0x1.6p+4f, -0x1.8p+4f, -0x1.ap+4f, -0x1.cp+4f, -0x1.ep+4f,
    -0x1p+5f, -0x1.2p+5f, -0x1.4p+5f, -0x1.6p+5f, -0x1.8p+5f, -0x1.ap+5f, -0x1.cp+5f, -0x1.ep+5f,
    -0x1p+6f, -0x1.2p+6f, -0x1.4p+6f, -0x1.6p+6f, -0x1.8p+6f, -0x1.ap+6f, -0x1.cp+6f, -0x1.ep+6f,
    -0x1p+7f, -0x1.2p+7f, -0x1.4p+7f, -0x1.6p+7f, -0x1.8p+7f, -0x1.ap+7f, -0x1.cp+7f, -0x1.ep+7f,
    -0x1p+8f, -0x1.2p+8f, -0x1.4p+8f, -0x1.6p+8f, -0x1.8p+8f, -0x1.ap+8f, -0x1.cp+8f, kNaN};

bool same(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

}  // namespace

TEST_CASE("e4m3: every code decodes to the table's value and encodes back", "[e4m3]") {
  for (int c = 0; c < 256; c++) {
    INFO("code 0x" << std::hex << c);
    CHECK(same(e4m3_decode(uint8_t(c)), kE4m3Values[c]));
    if (!std::isnan(kE4m3Values[c])) CHECK(e4m3_encode(kE4m3Values[c]) == c);
  }
  CHECK(e4m3_decode(0x7e) == 448.0f);
  CHECK(e4m3_decode(0x01) == 0x1p-9f);
}

TEST_CASE("e4m3: ties round to the even code, other values to the nearest", "[e4m3]") {
  // Every pair of neighbours of either sign, subnormals, the crossing from
  // subnormal to normal and every binade edge included: the midpoint (exact in
  // float) goes to the code whose last bit is 0, one float either side of it
  // to the nearer neighbour.
  int ties = 0;
  for (int sign : {0x00, 0x80})
    for (int c = 0; c < 0x7e; c++) {
      const float lo = kE4m3Values[sign | c], hi = kE4m3Values[sign | (c + 1)];
      const float mid = (lo + hi) / 2;
      const int even = (c & 1) ? c + 1 : c;
      INFO("between 0x" << std::hex << (sign | c) << " and 0x" << (sign | (c + 1)));
      CHECK(e4m3_encode(mid) == (sign | even));
      CHECK(e4m3_encode(std::nextafter(mid, lo)) == (sign | c));
      CHECK(e4m3_encode(std::nextafter(mid, hi)) == (sign | (c + 1)));
      ties++;
    }
  CHECK(ties == 252);
  // Named cases: 1 + 1/16 lies between 1 (0x38) and 1.125 (0x39); 1 + 3/16
  // between 1.125 and 1.25 (0x3a); 3 * 2^-10 between the subnormals 2^-9 and 2^-8.
  CHECK(e4m3_encode(1.0625f) == 0x38);
  CHECK(e4m3_encode(1.1875f) == 0x3a);
  CHECK(e4m3_encode(3 * 0x1p-10f) == 0x02);
  CHECK(e4m3_encode(-3 * 0x1p-10f) == 0x82);
  CHECK(e4m3_encode(432.0f) == 0x7e);  // between 416 (0x7d) and 448: even is 448
}

TEST_CASE("e4m3: saturation at 448, tiny values to signed zero, NaN", "[e4m3]") {
  for (float x : {448.0f, std::nextafter(448.0f, 1e9f), 449.0f, 464.0f, 465.0f, 480.0f, 1e6f,
                  FLT_MAX, std::numeric_limits<float>::infinity()}) {
    INFO(x);
    CHECK(e4m3_encode(x) == 0x7e);
    CHECK(e4m3_encode(-x) == 0xfe);
  }
  // Below half the smallest subnormal 2^-9, and at the half itself (a tie with
  // zero, whose code is even), the result is zero with the input's sign.
  for (float x : {0x1p-10f, std::nextafter(0x1p-10f, 0.0f), 0x1p-11f, 1e-30f, FLT_MIN,
                  std::numeric_limits<float>::denorm_min(), 0.0f}) {
    INFO(x);
    CHECK(e4m3_encode(x) == 0x00);
    CHECK(e4m3_encode(-x) == 0x80);
  }
  CHECK(e4m3_encode(std::nextafter(0x1p-10f, 1.0f)) == 0x01);
  CHECK(e4m3_encode(kNaN) == 0x7f);
  CHECK(e4m3_encode(-kNaN) == 0x7f);
  CHECK(std::isnan(e4m3_decode(0x7f)));
  CHECK(std::isnan(e4m3_decode(0xff)));
}

TEST_CASE("e4m3: a double is rounded to float first", "[e4m3]") {
  // 1 + 2^-4 + 2^-40 is above the tie 1.0625 in double, on it in float: to even, 1.
  CHECK(round_to_e4m3(1.0 + 0x1p-4 + 0x1p-40) == 1.0);
  CHECK(round_to_e4m3(1.0f + 0x1p-4f + 0x1p-20f) == 1.125f);
  CHECK(round_to_e4m3(-500.0) == -448.0);
}
