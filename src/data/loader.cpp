// DataLoader: (B, T+1) windows over all shards of a glob.
// Window w covers tokens [w*T, w*T + T]; inputs are its first T tokens, targets
// its last T. One global batch is world*B windows; rank r takes windows
// [r*B, (r+1)*B) of it, so data-parallel ranks never overlap.
#include <algorithm>
#include <numeric>
#include <random>

#include "qattn/data.hpp"

namespace qattn {

DataLoader::DataLoader(const std::string& glob, int B, int T, bool shuffle, uint64_t seed,
                       int rank, int world)
    : B_(B), T_(T), shuffle_(shuffle), seed_(seed), rank_(rank), world_(world) {
  for (const auto& path : expand_glob(glob)) {
    auto shard = read_shard(path);
    tokens_.insert(tokens_.end(), shard.begin(), shard.end());
  }
  if (!tokens_.empty()) max_token_ = *std::max_element(tokens_.begin(), tokens_.end());
  n_windows_ = tokens_.size() > 1 ? static_cast<int64_t>(tokens_.size() - 1) / T_ : 0;
  const int64_t per_batch = static_cast<int64_t>(B_) * world_;
  if (n_windows_ < per_batch)
    throw DataError("shards '" + glob + "' hold " + std::to_string(tokens_.size()) +
                    " tokens: too few for one batch of " + std::to_string(per_batch) +
                    " sequences of " + std::to_string(T_) + "+1 tokens");
  build_order();
}

void DataLoader::build_order() {
  order_.resize(static_cast<size_t>(n_windows_));
  std::iota(order_.begin(), order_.end(), 0);
  if (shuffle_) {
    std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch_));
    std::shuffle(order_.begin(), order_.end(), rng);
  }
}

void DataLoader::next(std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
  const int64_t per_batch = static_cast<int64_t>(B_) * world_;
  if ((cursor_ + 1) * per_batch > n_windows_) {  // epoch exhausted: reshuffle
    ++epoch_;
    cursor_ = 0;
    build_order();
  }
  inputs.resize(static_cast<size_t>(B_) * T_);
  targets.resize(static_cast<size_t>(B_) * T_);
  for (int b = 0; b < B_; ++b) {
    const int64_t w = order_[static_cast<size_t>(cursor_ * per_batch + rank_ * B_ + b)];
    const uint16_t* src = tokens_.data() + w * T_;  // (T + 1) tokens
    for (int t = 0; t < T_; ++t) {
      inputs[static_cast<size_t>(b) * T_ + t] = src[t];
      targets[static_cast<size_t>(b) * T_ + t] = src[t + 1];
    }
  }
  ++cursor_;
}

void DataLoader::reset() { seek(0, 0); }

void DataLoader::seek(int64_t epoch, int64_t cursor) {
  epoch_ = epoch;
  cursor_ = cursor;
  build_order();
}

}  // namespace qattn
