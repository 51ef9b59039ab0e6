// Where the CUDA backend keeps the parameters (and their gradients and AdamW
// state), and which part of them this rank's optimizer owns (ZeRO-1).
//
// Blocks: block 0 holds wte (Vp padded rows), wpe and the final LayerNorm;
// block 1 + l holds layer l's tensors. A layer's gradients are thus one
// contiguous range that the backward hands to NCCL as soon as the layer is
// done. Each slice starts 128-element aligned (cuBLASLt's fastest algorithms),
// each block is padded to a multiple of shards x 128 elements, so every rank's
// shard of a block is aligned too. Padding is zero and never trained.
#pragma once
#include <array>
#include <cstddef>
#include <vector>

#include "qattn/model.hpp"

namespace qattn::cuda {

class DeviceLayout {
 public:
  static constexpr size_t kAlign = 128;  // elements: 256-byte aligned bf16, 512-byte fp32

  // One tensor of one layer (layer 0 for the tensors outside the layers).
  struct Slice {
    int tensor, layer;
    size_t offset;  // on the device
    size_t host;    // in the canonical ParamLayout
    size_t count;   // canonical elements (wte: V rows, not Vp)
  };
  // A contiguous range this rank's optimizer updates, and where its fp32
  // master weights and moments sit in the packed optimizer state.
  struct Owned {
    size_t begin, count, packed;
  };

  // shards = 1: one owned range, the whole buffer (one GPU, or ZeRO-0).
  // shards = world (ZeRO-1): rank `shard` owns the shard-th part of every block.
  DeviceLayout(const ParamLayout& canonical, int layers, size_t padded_wte, int shards, int shard)
      : shards_(shards) {
    for (auto& o : offset_) o.assign(layers > 0 ? layers : 1, 0);
    auto place = [&](int t, int layer, size_t per_layer, size_t allocated) {
      offset_[t][layer] = total_;
      slices_.push_back({t, layer, total_, canonical.offset[t] + layer * per_layer, per_layer});
      total_ += round_up(allocated, kAlign);
    };
    auto end_block = [&] {
      total_ = round_up(total_, kAlign * shards);
      block_begin_.push_back(total_);
    };
    block_begin_.push_back(0);
    for (int t : {P_WTE, P_WPE, P_LNFW, P_LNFB})
      place(t, 0, canonical.size[t], t == P_WTE ? padded_wte : canonical.size[t]);
    end_block();
    for (int l = 0; l < layers; ++l) {
      for (int t = 0; t < P_COUNT; ++t) {
        if (!ParamLayout::layered(t) || canonical.size[t] == 0) continue;
        const size_t per_layer = canonical.size[t] / layers;
        place(t, l, per_layer, per_layer);
      }
      end_block();
    }
    if (shards == 1) {
      owned_.push_back({0, total_, 0});
    } else {
      for (int b = 0; b < blocks(); ++b) {
        const size_t part = block_size(b) / shards;
        owned_.push_back({block_begin_[b] + shard * part, part, block_begin_[b] / shards});
      }
    }
  }

  size_t total() const { return total_; }                    // elements of params / grads
  size_t packed_total() const { return total_ / shards_; }   // elements of master / m / v
  size_t offset(int tensor, int layer = 0) const { return offset_[tensor][layer]; }
  const std::vector<Slice>& slices() const { return slices_; }
  const std::vector<Owned>& owned() const { return owned_; }
  int blocks() const { return static_cast<int>(block_begin_.size()) - 1; }
  size_t block_begin(int b) const { return block_begin_[b]; }
  size_t block_size(int b) const { return block_begin_[b + 1] - block_begin_[b]; }
  size_t shard_size(int b) const { return block_size(b) / shards_; }

 private:
  static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }
  int shards_;
  size_t total_ = 0;
  std::array<std::vector<size_t>, P_COUNT> offset_;
  std::vector<Slice> slices_;
  std::vector<size_t> block_begin_;  // blocks() + 1 entries
  std::vector<Owned> owned_;
};

}  // namespace qattn::cuda
