// The CPU's e4m3 conversion (src/cpu/attention/e4m3.hpp, docs/attention-maths.md
// §1.2) against CUDA's: the device instruction the fp8 kernels use and the host
// converter of <cuda_fp8.h>, on a sweep of the float bit patterns and on every
// tie between neighbouring e4m3 values.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../../src/cpu/attention/e4m3.hpp"
#include "gpu_test_util.hpp"

TEST_CASE("e4m3: the CPU conversion equals CUDA's on device and host", "[e4m3][fp8]") {
  std::vector<float> x;
  // Every 251st bit pattern of the 2^32 (NaNs, infinities, subnormals included).
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 251) {
    const uint32_t bits = static_cast<uint32_t>(u);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    x.push_back(f);
  }
  // Each tie between neighbouring codes of either sign, and one float either side.
  for (int c = 0; c < 0x7e; ++c)
    for (int sign : {0x00, 0x80}) {
      const float lo = qattn::cpu::e4m3_decode(static_cast<uint8_t>(sign | c));
      const float hi = qattn::cpu::e4m3_decode(static_cast<uint8_t>(sign | (c + 1)));
      const float mid = (lo + hi) / 2;
      x.insert(x.end(), {mid, std::nextafter(mid, lo), std::nextafter(mid, hi)});
    }
  x.insert(x.end(), {448.0f, 464.0f, 480.0f, -464.0f, 0x1p-10f, -0x1p-10f, 0x1p-11f});
  std::vector<uint8_t> on_device, on_host;
  qattn::test::e4m3_codes(x, on_device, on_host);
  size_t device_differ = 0, host_differ = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const uint8_t ours = qattn::cpu::e4m3_encode(x[i]);
    if (ours != on_device[i] && device_differ++ < 5)
      std::printf("  %a: CPU 0x%02x, device 0x%02x\n", x[i], ours, on_device[i]);
    if (ours != on_host[i] && host_differ++ < 5)
      std::printf("  %a: CPU 0x%02x, host 0x%02x\n", x[i], ours, on_host[i]);
  }
  std::printf("e4m3: %zu floats, %zu differ from the device, %zu from the host converter\n",
              x.size(), device_differ, host_differ);
  CHECK(device_differ == 0);
  CHECK(host_differ == 0);
}
