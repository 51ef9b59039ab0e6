// llm.c token shards and the data loader.
// Shard format: 256 x int32 header (magic 20240520, version 1, token count),
// then uint16 tokens. Every shard is validated when opened.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace qattn {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr size_t kShardHeaderBytes = 256 * sizeof(int32_t);

struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Reads and validates one shard (magic, version, size = 1024 + 2 * count).
// Throws DataError naming the path and what is wrong (a directory, or the
// OS's reason when it cannot be read).
std::vector<uint16_t> read_shard(const std::string& path);
// Validates only the header and file size; returns the token count.
int64_t validate_shard(const std::string& path);
// Writes a shard atomically (temporary name, then rename).
void write_shard(const std::string& path, const uint16_t* tokens, size_t count);
// Expands a glob, sorted; throws DataError when nothing matches.
std::vector<std::string> expand_glob(const std::string& pattern);

// What one shard holds, for the checks training makes before it starts.
struct ShardInfo {
  std::string path;
  int64_t tokens = 0;
  int max_token = 0;  // the largest token id (0 when empty)
};
// Validates a shard and reads its tokens in chunks, keeping only ShardInfo.
ShardInfo scan_shard(const std::string& path);
// Throws DataError naming the first shard that holds a token id >= vocab.
void check_token_ids(const std::vector<ShardInfo>& shards, int vocab);
// The whole batches of `sequences` windows of T + 1 tokens (one every T
// tokens) that `tokens` tokens hold.
int64_t batches_in(int64_t tokens, int64_t sequences, int T);
// Throws DataError unless `tokens` (of the shards of glob) fill one batch of
// `sequences` windows of T + 1 tokens.
void check_one_batch(const std::string& glob, int64_t tokens, int64_t sequences, int T);

// (B, T+1) windows over the concatenated shards. The train loader visits
// non-overlapping windows in an order shuffled per epoch with the seed; the
// rank/world split gives each data-parallel rank its own slice of every global
// batch. The val loader (shuffle = false) reads a fixed prefix.
class DataLoader {
 public:
  DataLoader(const std::string& glob, int B, int T, bool shuffle, uint64_t seed, int rank = 0,
             int world = 1);
  // Fills inputs and targets, each (B, T).
  void next(std::vector<int32_t>& inputs, std::vector<int32_t>& targets);
  void reset();                         // back to the first batch of epoch 0
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t windows() const { return n_windows_; }
  // Position, for checkpoints: (epoch, batch index within the epoch).
  int64_t epoch() const { return epoch_; }
  int64_t cursor() const { return cursor_; }
  void seek(int64_t epoch, int64_t cursor);
  const std::vector<ShardInfo>& shards() const { return shards_; }

 private:
  void build_order();
  std::vector<uint16_t> tokens_;        // all shards concatenated
  std::vector<int64_t> order_;          // window indices of this epoch
  int B_, T_;
  bool shuffle_;
  uint64_t seed_;
  int rank_, world_;
  int64_t n_windows_ = 0, epoch_ = 0, cursor_ = 0;
  std::vector<ShardInfo> shards_;
};

}  // namespace qattn
