// Hugging Face GPT-2 model directories, as transformers' GPT2LMHeadModel saves
// and loads them: config.json and model.safetensors.
//   tensors: transformer.wte.weight (V, C), transformer.wpe.weight (T, C),
//            transformer.h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}.{weight, bias},
//            transformer.ln_f.{weight, bias}; lm_head.weight is wte (tied) and not stored.
//   GPT-2's Conv1D keeps a weight as (in, out), the transpose of ParamLayout's
//   (out, in) rows; the q, k, v columns of c_attn are in qattn's order.
//   config:  gelu_new (the tanh GELU), layer_norm_epsilon 1e-5, n_inner 4C and
//            1/sqrt(head dim) attention scaling: qattn's model exactly.
// GPT-2 configs only: QK-norm has no place in GPT-2 and is refused.
#pragma once
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "qattn/config.hpp"
#include "qattn/safetensors.hpp"

namespace qattn {

struct HfError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// True when path is a directory (an HF model directory, as model.init_from
// tells it from an llm.c model file).
bool is_model_dir(const std::string& path);

// Writes DIR/model.safetensors (dtype F32 or BF16, the metadata strings added
// to "format": "pt") and then DIR/config.json, creating DIR; each file is
// written atomically, and when config.json fails the new model.safetensors is
// removed again. params in ParamLayout(m) order. Throws HfError.
void write_hf_model(const std::string& dir, const ModelConfig& m, const std::vector<float>& params,
                    TensorDtype dtype, const std::map<std::string, std::string>& metadata = {});

struct HfModel {
  ModelConfig model;          // seq_len = the config's n_positions
  std::vector<float> params;  // ParamLayout(model) order
};

// Reads and validates a model directory: config.json (model_type gpt2, the
// sizes, and the settings qattn's model has: activation, epsilon, n_inner,
// scaling, tied head) and model.safetensors (every tensor present with the
// shape the config implies, F32, BF16 or F16; names with or without the
// "transformer." prefix; the attention-mask buffers older transformers saved
// are skipped). Throws HfError naming the file, the key or tensor, the value
// and what was expected.
HfModel read_hf_model(const std::string& dir);

// The parameters a run with model config m starts from: vocab, layers, heads
// and dim must equal the directory's, seq_len may be at most its n_positions
// (the first seq_len rows of wpe are used). Throws HfError naming what differs.
std::vector<float> params_from_hf_model(const std::string& dir, const ModelConfig& m);

}  // namespace qattn
