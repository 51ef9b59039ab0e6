// train.device -> a Backend. "auto" picks cuda when this build has the CUDA
// backend and a GPU is visible; "cuda" without one is an error that says so.
#pragma once
#include <memory>

#include "qattn/backend.hpp"

namespace qattn::cli {
std::unique_ptr<Backend> make_backend(const Config& cfg);
int cuda_device_count();  // 0 without the CUDA backend or without a GPU
}  // namespace qattn::cli
