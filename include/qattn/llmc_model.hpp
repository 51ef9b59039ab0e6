// llm.c's model file (as train_gpt2.c / train_gpt2.cu write and read it):
//   header: 256 x int32 = [20240326, version, max_seq_len, vocab_size,
//           num_layers, num_heads, channels, padded_vocab_size, 0 ...]
//   then the 16 GPT-2 tensors in ParamLayout order, wte with padded_vocab_size
//   rows (the padding rows zero) and wpe with max_seq_len rows;
//   version 3: fp32 values, version 5: bf16 values.
// GPT-2 configs only: a model with QK-norm has gains llm.c has no place for.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "qattn/config.hpp"

namespace qattn {

constexpr int32_t kLlmcModelMagic = 20240326;
constexpr int32_t kLlmcVersionFp32 = 3;
constexpr int32_t kLlmcVersionBf16 = 5;

struct LlmcError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct LlmcModel {
  ModelConfig model;          // seq_len = the file's max_seq_len
  int32_t version = 0;
  int32_t padded_vocab = 0;
  std::vector<float> params;  // canonical ParamLayout(model) order, padding rows dropped
};

// vocab rounded up to a multiple of 128, as llm.c pads it.
int padded_vocab(int vocab);

// Writes params (ParamLayout(m) order) as an llm.c model file of the given
// version (3: fp32, 5: bf16 rounded to nearest even). Written atomically.
void write_llmc_model(const std::string& path, const ModelConfig& m, const std::vector<float>& params,
                      int32_t version);

// Reads and validates a model file (magic, version, sizes); throws LlmcError
// naming the path and what is wrong.
LlmcModel read_llmc_model(const std::string& path);

// What params_from_llmc_model checks, from the header and the file size alone
// (for qattn validate); throws LlmcError naming model.init_from and the mismatch.
void check_llmc_model(const std::string& path, const ModelConfig& m);

// The parameters a run with model config m starts from: layers, heads, dim and
// vocab must equal the file's, seq_len may be at most its max_seq_len (the
// first seq_len rows of wpe are used). Throws LlmcError naming the mismatch.
std::vector<float> params_from_llmc_model(const std::string& path, const ModelConfig& m);

}  // namespace qattn
