// GPU tests need a CUDA device; without one they exit 77, which CTest reports
// as skipped, after saying why.
#define CATCH_CONFIG_RUNNER
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cstdio>

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("SKIP: no CUDA device visible; the GPU tests run on the device machine only\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
