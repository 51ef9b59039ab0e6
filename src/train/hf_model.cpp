// Hugging Face GPT-2 directories: ParamLayout <-> GPT2LMHeadModel's tensors.
#include "qattn/hf_model.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "qattn/atomic_file.hpp"
#include "qattn/model.hpp"

namespace qattn {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kLayerNormEps = 1e-5;  // src/cpu/ops: qattn's LayerNorm

// One ParamLayout tensor under its GPT-2 name (after "transformer." for the
// whole-model tensors, after "transformer.h.N." for the per-layer ones).
struct HfTensor {
  ParamTensor tensor;
  const char* name;
  bool transposed;  // Conv1D weight: stored (in, out)
};
constexpr HfTensor kHfTensors[] = {
    {P_WTE, "wte.weight", false},          {P_WPE, "wpe.weight", false},
    {P_LN1W, "ln_1.weight", false},        {P_LN1B, "ln_1.bias", false},
    {P_QKVW, "attn.c_attn.weight", true},  {P_QKVB, "attn.c_attn.bias", false},
    {P_ATTPROJW, "attn.c_proj.weight", true}, {P_ATTPROJB, "attn.c_proj.bias", false},
    {P_LN2W, "ln_2.weight", false},        {P_LN2B, "ln_2.bias", false},
    {P_FCW, "mlp.c_fc.weight", true},      {P_FCB, "mlp.c_fc.bias", false},
    {P_FCPROJW, "mlp.c_proj.weight", true}, {P_FCPROJB, "mlp.c_proj.bias", false},
    {P_LNFW, "ln_f.weight", false},        {P_LNFB, "ln_f.bias", false},
};

bool per_layer(ParamTensor t) { return t >= P_LN1W && t <= P_FCPROJB; }

// One layer's slice of tensor t as ParamLayout holds it: (rows, cols) or (n).
std::vector<int64_t> layout_shape(ParamTensor t, const ModelConfig& m) {
  const int64_t V = m.vocab, T = m.seq_len, C = m.dim;
  switch (t) {
    case P_WTE: return {V, C};
    case P_WPE: return {T, C};
    case P_QKVW: return {3 * C, C};
    case P_QKVB: return {3 * C};
    case P_ATTPROJW: return {C, C};
    case P_FCW: return {4 * C, C};
    case P_FCB: return {4 * C};
    case P_FCPROJW: return {C, 4 * C};
    default: return {C};  // LayerNorm gains and biases, the C-wide biases
  }
}

std::vector<int64_t> hf_shape(const HfTensor& h, const ModelConfig& m) {
  std::vector<int64_t> s = layout_shape(h.tensor, m);
  if (h.transposed) std::swap(s[0], s[1]);
  return s;
}

std::string hf_name(const HfTensor& h, int layer, const std::string& prefix) {
  return prefix + (per_layer(h.tensor) ? "h." + std::to_string(layer) + "." : "") + h.name;
}

// (rows, cols) -> (cols, rows)
std::vector<float> transpose(const float* x, int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(c * rows + r)] = x[r * cols + c];
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += "\n  " + l;
  return s;
}

void require_gpt2(const ModelConfig& m, const std::string& what) {
  if (m.qk_norm.on())
    throw HfError(what + ": model.qk_norm is on (form \"" + to_string(m.qk_norm.form) +
                  "\"), but GPT-2 (transformers' GPT2LMHeadModel) has no QK-norm; allowed: GPT-2 "
                  "configs with model.qk_norm = false");
}

// config.json -> ModelConfig, with every setting qattn's model fixes checked.
ModelConfig read_hf_config(const fs::path& path) {
  const std::string where = path.string();
  std::ifstream f(path);
  if (!f) throw HfError(where + ": cannot open (an HF model directory holds config.json and model.safetensors)");
  json c;
  try {
    c = json::parse(f);
  } catch (const json::parse_error& e) {
    throw HfError(where + ": not valid JSON: " + e.what());
  }
  if (!c.is_object()) throw HfError(where + ": expected a JSON object");
  std::vector<std::string> problems;
  auto size_key = [&](const char* key, int& out) {
    if (!c.contains(key)) {
      problems.push_back(std::string(key) + ": missing; expected a positive integer");
    } else if (!c[key].is_number_integer() || c[key].get<int64_t>() < 1 || c[key].get<int64_t>() > (1 << 24)) {
      problems.push_back(std::string(key) + ": " + c[key].dump() + " is not allowed; expected a positive integer");
    } else {
      out = c[key].get<int>();
    }
  };
  // A setting GPT-2 configs may carry, that must have qattn's value (absent: transformers' default).
  auto fixed = [&](const char* key, const json& dflt, const std::vector<json>& allowed, const std::string& why) {
    const json v = c.contains(key) ? c[key] : dflt;
    for (const json& a : allowed)
      if (v == a || (v.is_number() && a.is_number() && std::abs(v.get<double>() - a.get<double>()) <= 1e-12)) return;
    std::string list;
    for (const json& a : allowed) list += (list.empty() ? "" : " | ") + a.dump();
    problems.push_back(std::string(key) + ": " + v.dump() + " is not allowed; allowed: " + list + " (" + why + ")");
  };
  if (c.value("model_type", json()) != "gpt2")
    problems.push_back("model_type: " + c.value("model_type", json()).dump() + " is not allowed; allowed: \"gpt2\"");
  ModelConfig m;  // QK-norm off, as GPT-2
  size_key("vocab_size", m.vocab);
  size_key("n_positions", m.seq_len);
  size_key("n_embd", m.dim);
  size_key("n_layer", m.layers);
  size_key("n_head", m.heads);
  if (problems.empty() && m.dim % m.heads != 0)
    problems.push_back("n_embd: " + std::to_string(m.dim) + " is not divisible by n_head = " + std::to_string(m.heads));
  fixed("activation_function", "gelu_new", {"gelu_new", "gelu_pytorch_tanh"}, "qattn's GELU is the tanh form");
  fixed("layer_norm_epsilon", kLayerNormEps, {kLayerNormEps}, "qattn's LayerNorm epsilon");
  fixed("n_inner", nullptr, {nullptr, 4 * m.dim}, "qattn's MLP is 4 n_embd wide");
  fixed("scale_attn_weights", true, {true}, "qattn scales scores by 1/sqrt(head dim)");
  fixed("scale_attn_by_inverse_layer_idx", false, {false}, "qattn does not scale by layer");
  fixed("tie_word_embeddings", true, {true}, "qattn's head is wte");
  fixed("add_cross_attention", false, {false}, "qattn's model is a decoder alone");
  if (!problems.empty()) throw HfError(where + ": not a GPT-2 config qattn can run:" + join(problems));
  return m;
}

}  // namespace

bool is_model_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

void write_hf_model(const std::string& dir, const ModelConfig& m, const std::vector<float>& params,
                    TensorDtype dtype, const std::map<std::string, std::string>& metadata) {
  require_gpt2(m, dir);
  if (dtype != TensorDtype::f32 && dtype != TensorDtype::bf16)
    throw HfError(dir + ": dtype " + to_string(dtype) + " is not allowed; allowed: F32 | BF16");
  const ParamLayout lay(m);
  if (params.size() != lay.total)
    throw HfError(dir + ": " + std::to_string(params.size()) + " parameters given, the model has " +
                  std::to_string(lay.total));
  std::vector<TensorToWrite> tensors;
  for (int layer = 0; layer < m.layers; ++layer)
    for (const HfTensor& h : kHfTensors) {
      if (!per_layer(h.tensor) && layer > 0) continue;
      const std::vector<int64_t> shape = layout_shape(h.tensor, m);
      const size_t n = per_layer(h.tensor) ? lay.size[h.tensor] / m.layers : lay.size[h.tensor];
      const float* x = params.data() + lay.offset[h.tensor] + static_cast<size_t>(layer) * n;
      tensors.push_back({hf_name(h, layer, "transformer."), hf_shape(h, m),
                         h.transposed ? transpose(x, shape[0], shape[1]) : std::vector<float>(x, x + n)});
    }
  std::map<std::string, std::string> meta = metadata;
  meta["format"] = "pt";  // transformers refuses safetensors files without it

  json config = {{"architectures", {"GPT2LMHeadModel"}},
                 {"model_type", "gpt2"},
                 {"vocab_size", m.vocab},
                 {"n_positions", m.seq_len},
                 {"n_ctx", m.seq_len},
                 {"n_embd", m.dim},
                 {"n_layer", m.layers},
                 {"n_head", m.heads},
                 {"n_inner", nullptr},
                 {"activation_function", "gelu_new"},
                 {"layer_norm_epsilon", kLayerNormEps},
                 {"scale_attn_weights", true},
                 {"scale_attn_by_inverse_layer_idx", false},
                 {"reorder_and_upcast_attn", false},
                 {"tie_word_embeddings", true},
                 {"initializer_range", 0.02},
                 {"resid_pdrop", 0.0},  // qattn trains without dropout
                 {"embd_pdrop", 0.0},
                 {"attn_pdrop", 0.0},
                 {"use_cache", true},
                 {"torch_dtype", dtype == TensorDtype::f32 ? "float32" : "bfloat16"}};
  // End-of-text of the tokenizers qattn knows: GPT-2's (50256) and bytes' (256).
  if (m.vocab == 50257 || m.vocab == 257) config["bos_token_id"] = config["eos_token_id"] = m.vocab - 1;

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw HfError(dir + ": cannot create the directory: " + ec.message());
  const std::string weights = (fs::path(dir) / "model.safetensors").string();
  try {
    write_safetensors(weights, tensors, dtype, meta);
  } catch (const SafetensorsError& e) {
    throw HfError(e.what());
  }
  try {
    write_file_atomically((fs::path(dir) / "config.json").string(),
                          [&](std::ostream& f) { f << config.dump(2) << '\n'; });
  } catch (const std::runtime_error& e) {
    fs::remove(weights, ec);  // a directory without config.json would only mislead
    throw HfError(e.what());
  }
}

HfModel read_hf_model(const std::string& dir) {
  HfModel out;
  ModelConfig& m = out.model;
  m = read_hf_config(fs::path(dir) / "config.json");
  const std::string weights = (fs::path(dir) / "model.safetensors").string();
  try {
    const SafetensorsFile file(weights);
    // transformers saves GPT2LMHeadModel's tensors under "transformer."; the
    // original GPT-2 checkpoints hold GPT2Model's, without the prefix.
    const std::string prefix = file.has("wte.weight") && !file.has("transformer.wte.weight") ? "" : "transformer.";
    const ParamLayout lay(m);
    out.params.assign(lay.total, 0.0f);
    std::vector<std::string> problems;
    std::set<std::string> used;
    for (int layer = 0; layer < m.layers; ++layer)
      for (const HfTensor& h : kHfTensors) {
        if (!per_layer(h.tensor) && layer > 0) continue;
        const std::string name = hf_name(h, layer, prefix);
        const std::vector<int64_t> want = hf_shape(h, m);
        used.insert(name);
        if (!file.has(name)) {
          problems.push_back("tensor " + name + " is missing (shape " + shape_text(want) + " expected)");
          continue;
        }
        const auto& e = file.tensors().at(name);
        if (e.shape != want) {
          problems.push_back("tensor " + name + " has shape " + shape_text(e.shape) + "; config.json implies " +
                             shape_text(want));
          continue;
        }
        std::vector<float> x = file.read(name);
        if (h.transposed) x = transpose(x.data(), want[0], want[1]);
        // Whole-model tensors are read at layer 0 only, so one offset formula serves both.
        const size_t at = lay.offset[h.tensor] + layer * x.size();
        std::copy(x.begin(), x.end(), out.params.begin() + static_cast<std::ptrdiff_t>(at));
      }
    for (const auto& [name, e] : file.tensors()) {
      if (used.count(name)) continue;
      if (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")) continue;  // causal-mask buffers
      if (name == "lm_head.weight") {  // a tied head saved anyway must be wte
        const auto wte = out.params.begin() + static_cast<std::ptrdiff_t>(lay.offset[P_WTE]);
        const std::vector<float> head = e.shape == hf_shape(kHfTensors[0], m) ? file.read(name) : std::vector<float>();
        if (head.size() != lay.size[P_WTE] || !std::equal(head.begin(), head.end(), wte))
          problems.push_back("tensor lm_head.weight differs from " + prefix +
                             "wte.weight; qattn ties the head to the token embedding");
        continue;
      }
      problems.push_back("tensor " + name + " (" + e.dtype + " " + shape_text(e.shape) +
                         ") has no place in qattn's GPT-2");
    }
    if (!problems.empty()) throw HfError(weights + ": not the GPT-2 that config.json describes:" + join(problems));
  } catch (const SafetensorsError& e) {
    throw HfError(e.what());
  }
  return out;
}

std::vector<float> params_from_hf_model(const std::string& dir, const ModelConfig& m) {
  const std::string what = "model.init_from = " + dir;
  require_gpt2(m, what);
  HfModel file;
  try {
    file = read_hf_model(dir);
  } catch (const HfError& e) {
    throw HfError(what + ": " + e.what());
  }
  const ModelConfig& f = file.model;
  const std::string config = (fs::path(dir) / "config.json").string();
  std::vector<std::string> diff;
  auto check = [&](const char* key, const char* ours, int have, int want) {
    if (have != want)
      diff.push_back(config + ": " + key + " = " + std::to_string(have) + " but " + ours + " = " +
                     std::to_string(want));
  };
  check("vocab_size", "model.vocab", f.vocab, m.vocab);
  check("n_layer", "model.layers", f.layers, m.layers);
  check("n_head", "model.heads", f.heads, m.heads);
  check("n_embd", "model.dim", f.dim, m.dim);
  if (m.seq_len > f.seq_len)
    diff.push_back(config + ": n_positions = " + std::to_string(f.seq_len) + " but model.seq_len = " +
                   std::to_string(m.seq_len) + "; allowed: model.seq_len <= n_positions");
  if (!diff.empty()) throw HfError(what + ": the model differs:" + join(diff));
  return params_for_context(f, file.params, m);
}

}  // namespace qattn
