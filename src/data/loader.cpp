// DataLoader: (B, T+1) windows over all shards of a glob.
// Window w covers tokens [w*T, w*T + T]; inputs are its first T tokens, targets
// its last T. One global batch is world*B windows; rank r takes windows
// [r*B, (r+1)*B) of it, so data-parallel ranks never overlap.
#include <algorithm>
#include <numeric>
#include <random>

#include "qattn/data.hpp"

namespace qattn {

namespace {

// Windows of T + 1 tokens that start every T tokens.
int64_t windows_in(int64_t tokens, int T) { return tokens > 1 ? (tokens - 1) / T : 0; }

}  // namespace

DataLoader::DataLoader(const std::string& glob, int B, int T, bool shuffle, uint64_t seed,
                       int rank, int world)
    : B_(B), T_(T), shuffle_(shuffle), seed_(seed), rank_(rank), world_(world) {
  for (const auto& path : expand_glob(glob)) {
    const auto shard = read_shard(path);
    const int max_token = shard.empty() ? 0 : *std::max_element(shard.begin(), shard.end());
    shards_.push_back({path, static_cast<int64_t>(shard.size()), max_token});
    tokens_.insert(tokens_.end(), shard.begin(), shard.end());
  }
  check_one_batch(glob, static_cast<int64_t>(tokens_.size()), static_cast<int64_t>(B_) * world_, T_);
  n_windows_ = windows_in(static_cast<int64_t>(tokens_.size()), T_);
  build_order();
}

void check_token_ids(const std::vector<ShardInfo>& shards, int vocab) {
  for (const auto& s : shards)
    if (s.max_token >= vocab)
      throw DataError("shard " + s.path + " holds token id " + std::to_string(s.max_token) + " but model.vocab = " +
                      std::to_string(vocab) + "; allowed: model.vocab > every token id");
}

int64_t batches_in(int64_t tokens, int64_t sequences, int T) { return windows_in(tokens, T) / sequences; }

void check_one_batch(const std::string& glob, int64_t tokens, int64_t sequences, int T) {
  if (batches_in(tokens, sequences, T) < 1)
    throw DataError("shards '" + glob + "' hold " + std::to_string(tokens) + " tokens: too few for one batch of " +
                    std::to_string(sequences) + " sequences of " + std::to_string(T) + "+1 tokens");
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
