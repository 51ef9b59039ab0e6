// Hugging Face model directories and safetensors: the file format byte by
// byte, damaged files refused with what is wrong, the GPT-2 names and Conv1D
// layout checked by a GPT-2 forward written from transformers' definition
// against qattn's logits, export -> model.init_from round trips (fp32 exact,
// bf16 rounded), mismatches named, and `qattn export --format hf` end to end.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "qattn/checkpoint.hpp"
#include "qattn/cpu/gpt2.hpp"
#include "qattn/hf_model.hpp"
#include "qattn/model.hpp"
#include "qattn/safetensors.hpp"
#include "run_helpers.hpp"

using namespace qattn;
using namespace qattn::test;
using nlohmann::json;

namespace {

ModelConfig small_model() {
  ModelConfig m;
  m.vocab = 37, m.layers = 2, m.heads = 2, m.dim = 8, m.seq_len = 6;
  return m;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file assembled by hand: header length, the header as given, the data.
void write_raw_safetensors(const fs::path& p, const json& header, const std::string& data) {
  const std::string text = header.dump();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((text.size() >> (8 * i)) & 0xFF);
  write_bytes(p, bytes + text + data);
}

// The header of a safetensors file, parsed.
json header_of(const fs::path& p) {
  const std::string b = file_bytes(p);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(b[i])) << (8 * i);
  return json::parse(b.substr(8, n));
}

// GPT-2 as transformers' modeling_gpt2 defines it, in double, from the
// tensors of an HF directory by their names: Conv1D is x @ W + b with W
// (in, out); c_attn's output splits into q | k | v, each viewed as (heads,
// head dim); causal softmax of q.k / sqrt(head dim); gelu_new; LayerNorm with
// epsilon 1e-5; the head is wte. Returns the logits (T, V) of one sequence.
std::vector<double> hf_gpt2_logits(const std::string& dir, const std::vector<int32_t>& tokens) {
  const json cfg = json::parse(std::ifstream(fs::path(dir) / "config.json"));
  const int V = cfg["vocab_size"], C = cfg["n_embd"], L = cfg["n_layer"], H = cfg["n_head"];
  const int T = static_cast<int>(tokens.size()), hd = C / H;
  const SafetensorsFile st((fs::path(dir) / "model.safetensors").string());
  auto get = [&](const std::string& name) {
    const std::vector<float> f = st.read("transformer." + name);
    return std::vector<double>(f.begin(), f.end());
  };
  using Mat = std::vector<double>;  // (T, n) row-major
  auto layernorm = [&](const Mat& x, const std::string& name) {
    const Mat w = get(name + ".weight"), b = get(name + ".bias");
    Mat y(x.size());
    for (int t = 0; t < T; ++t) {
      double mean = 0, var = 0;
      for (int c = 0; c < C; ++c) mean += x[t * C + c] / C;
      for (int c = 0; c < C; ++c) var += (x[t * C + c] - mean) * (x[t * C + c] - mean) / C;
      for (int c = 0; c < C; ++c) y[t * C + c] = (x[t * C + c] - mean) / std::sqrt(var + 1e-5) * w[c] + b[c];
    }
    return y;
  };
  auto conv1d = [&](const Mat& x, int in, const std::string& name) {
    const Mat w = get(name + ".weight"), b = get(name + ".bias");
    const int out = static_cast<int>(b.size());
    Mat y(static_cast<size_t>(T) * out);
    for (int t = 0; t < T; ++t)
      for (int o = 0; o < out; ++o) {
        double s = b[o];
        for (int i = 0; i < in; ++i) s += x[t * in + i] * w[static_cast<size_t>(i) * out + o];
        y[static_cast<size_t>(t) * out + o] = s;
      }
    return y;
  };
  const Mat wte = get("wte.weight"), wpe = get("wpe.weight");
  Mat h(static_cast<size_t>(T) * C);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) h[t * C + c] = wte[tokens[t] * C + c] + wpe[t * C + c];
  for (int l = 0; l < L; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    const Mat qkv = conv1d(layernorm(h, p + "ln_1"), C, p + "attn.c_attn");
    Mat att(static_cast<size_t>(T) * C, 0.0);
    for (int head = 0; head < H; ++head)
      for (int i = 0; i < T; ++i) {
        std::vector<double> w(i + 1);
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= i; ++j) {
          double s = 0;
          for (int e = 0; e < hd; ++e) s += qkv[i * 3 * C + head * hd + e] * qkv[j * 3 * C + C + head * hd + e];
          w[j] = s / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, w[j]);
        }
        for (int j = 0; j <= i; ++j) sum += (w[j] = std::exp(w[j] - mx));
        for (int j = 0; j <= i; ++j)
          for (int e = 0; e < hd; ++e) att[i * C + head * hd + e] += w[j] / sum * qkv[j * 3 * C + 2 * C + head * hd + e];
      }
    const Mat proj = conv1d(att, C, p + "attn.c_proj");
    for (size_t i = 0; i < h.size(); ++i) h[i] += proj[i];
    Mat fc = conv1d(layernorm(h, p + "ln_2"), C, p + "mlp.c_fc");
    for (double& x : fc) x = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    const Mat mlp = conv1d(fc, 4 * C, p + "mlp.c_proj");
    for (size_t i = 0; i < h.size(); ++i) h[i] += mlp[i];
  }
  const Mat f = layernorm(h, "ln_f");
  Mat logits(static_cast<size_t>(T) * V);
  for (int t = 0; t < T; ++t)
    for (int v = 0; v < V; ++v) {
      double s = 0;
      for (int c = 0; c < C; ++c) s += f[t * C + c] * wte[v * C + c];
      logits[static_cast<size_t>(t) * V + v] = s;
    }
  return logits;
}

}  // namespace

TEST_CASE("safetensors: the header as the format defines it, F32 exact and BF16 rounded", "[hf]") {
  const auto d = scratch_dir("st_format");
  const fs::path p = d / "a.safetensors";
  const std::vector<TensorToWrite> tensors = {{"b.weight", {2, 3}, {1, 2, 3, 4, 5, -6.5f}},
                                              {"a.bias", {3}, {1.0f + 1.0f / 256, 0.1f, -0.0f}}};
  write_safetensors(p.string(), tensors, TensorDtype::f32, {{"format", "pt"}});
  const std::string bytes = file_bytes(p);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  CHECK((8 + n) % 8 == 0);  // the data starts aligned
  CHECK(bytes.size() == 8 + n + 9 * 4);
  const json h = header_of(p);
  CHECK(h["__metadata__"] == json{{"format", "pt"}});
  CHECK(h["b.weight"] == json{{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}});
  CHECK(h["a.bias"] == json{{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {24, 36}}});
  float six;
  std::memcpy(&six, bytes.data() + 8 + n + 20, 4);
  CHECK(six == -6.5f);  // little-endian fp32, row-major

  const SafetensorsFile f(p.string());
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.read("b.weight") == tensors[0].values);
  CHECK(f.read("a.bias") == tensors[1].values);

  write_safetensors(p.string(), tensors, TensorDtype::bf16, {});
  const SafetensorsFile g(p.string());
  CHECK(header_of(p)["a.bias"]["dtype"] == "BF16");
  CHECK(g.tensors().at("a.bias").end - g.tensors().at("a.bias").begin == 6);
  CHECK(g.read("b.weight") == tensors[0].values);              // exact in bf16
  CHECK(g.read("a.bias")[0] == 1.0f);                          // a tie rounds to even
  CHECK(std::abs(g.read("a.bias")[1] - 0.1f) < 0.1f / 256);
  CHECK_THROWS_WITH(g.read("c"), Catch::Contains("tensor \"c\" is missing"));
}

TEST_CASE("safetensors: F16 reads exactly; damaged and lying files are refused with what is wrong", "[hf]") {
  const auto d = scratch_dir("st_damaged");
  const fs::path p = d / "x.safetensors";
  // 1, -2, 65504 (largest half), 2^-24 (smallest subnormal), inf
  const uint16_t half[5] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7C00};
  const std::string data(reinterpret_cast<const char*>(half), 10);
  json h = {{"t", {{"dtype", "F16"}, {"shape", {5}}, {"data_offsets", {0, 10}}}}};
  write_raw_safetensors(p, h, data);
  const auto v = SafetensorsFile(p.string()).read("t");
  CHECK(v == std::vector<float>{1.0f, -2.0f, 65504.0f, 0x1p-24f, INFINITY});

  auto refused = [&](const json& header, const std::string& payload) {
    write_raw_safetensors(p, header, payload);
    try {
      SafetensorsFile f(p.string());
      return std::string("(accepted)");
    } catch (const SafetensorsError& e) {
      return std::string(e.what());
    }
  };
  SECTION("truncated: the data ends before the last tensor") {
    CHECK_THAT(refused(h, data.substr(0, 8)), Catch::Contains(p.string()) && Catch::Contains("\"t\"") &&
                                                  Catch::Contains("reach beyond the 8 data bytes") &&
                                                  Catch::Contains("truncated"));
  }
  SECTION("truncated inside the header") {
    write_raw_safetensors(p, h, data);
    fs::resize_file(p, 20);
    CHECK_THROWS_WITH(SafetensorsFile(p.string()), Catch::Contains("exceeds the 12 bytes after it"));
    fs::resize_file(p, 5);
    CHECK_THROWS_WITH(SafetensorsFile(p.string()), Catch::Contains("shorter than the 8-byte header length"));
  }
  SECTION("the header lies about the shape") {
    h["t"]["shape"] = {6};
    CHECK_THAT(refused(h, data), Catch::Contains("span 10 bytes, but F16 [6] needs 12"));
  }
  SECTION("tensors overlap or leave gaps") {
    json two = {{"a", {{"dtype", "F16"}, {"shape", {3}}, {"data_offsets", {0, 6}}}},
                {"b", {{"dtype", "F16"}, {"shape", {3}}, {"data_offsets", {4, 10}}}}};
    CHECK_THAT(refused(two, data), Catch::Contains("\"b\" starts at data byte 4, but \"a\" ends at 6 (overlap)"));
    two["b"]["data_offsets"] = {6, 12};
    two["a"]["data_offsets"] = {2, 8};
    two["a"]["shape"] = {3};
    CHECK_THAT(refused(two, data + "xx"), Catch::Contains("\"a\" starts at data byte 2") && Catch::Contains("(gap)"));
    CHECK_THAT(refused(h, data + "extra!"), Catch::Contains("6 bytes after the last tensor"));
  }
  SECTION("bad header entries") {
    CHECK_THAT(refused({{"t", {{"dtype", "F17"}, {"shape", {5}}, {"data_offsets", {0, 10}}}}}, data),
               Catch::Contains("dtype \"F17\" is not a safetensors dtype"));
    CHECK_THAT(refused({{"t", {{"dtype", "F16"}, {"shape", {-5}}, {"data_offsets", {0, 10}}}}}, data),
               Catch::Contains("is not a list of sizes"));
    CHECK_THAT(refused({{"t", {{"dtype", "F16"}, {"shape", {5}}, {"data_offsets", {10, 0}}}}}, data),
               Catch::Contains("begin <= end"));
    CHECK_THAT(refused({{"__metadata__", {{"format", 1}}}}, ""), Catch::Contains("expected a string"));
    CHECK_THAT(refused(json::array(), ""), Catch::Contains("expected a JSON object"));
    write_bytes(p, std::string("\x04\0\0\0\0\0\0\0{{{{", 12));
    CHECK_THROWS_WITH(SafetensorsFile(p.string()), Catch::Contains("header is not valid JSON"));
  }
  SECTION("a dtype qattn does not read is named") {
    write_raw_safetensors(p, {{"i", {{"dtype", "I64"}, {"shape", {1}}, {"data_offsets", {0, 8}}}}}, std::string(8, '\0'));
    CHECK_THROWS_WITH(SafetensorsFile(p.string()).read("i"),
                      Catch::Contains("\"i\" has dtype I64; allowed: F32 | BF16 | F16"));
  }
}

TEST_CASE("HF export: GPT-2's names, Conv1D transposes and config.json", "[hf]") {
  const auto d = scratch_dir("hf_layout");
  const ModelConfig m = small_model();
  const auto params = random_params(m, 0.5f);
  write_hf_model(d.string(), m, params, TensorDtype::f32, {{"qattn.step", "7"}});

  const json c = json::parse(std::ifstream(d / "config.json"));
  CHECK(c["architectures"] == json{"GPT2LMHeadModel"});
  CHECK(c["model_type"] == "gpt2");
  CHECK(c["vocab_size"] == 37);
  CHECK(c["n_positions"] == 6);
  CHECK(c["n_ctx"] == 6);
  CHECK(c["n_embd"] == 8);
  CHECK(c["n_layer"] == 2);
  CHECK(c["n_head"] == 2);
  CHECK(c["activation_function"] == "gelu_new");
  CHECK(c["layer_norm_epsilon"] == 1e-5);
  CHECK(c["tie_word_embeddings"] == true);
  CHECK(c["torch_dtype"] == "float32");
  CHECK_FALSE(c.contains("eos_token_id"));  // vocab 37 is no tokenizer qattn knows

  const SafetensorsFile st((d / "model.safetensors").string());
  CHECK(st.metadata().at("format") == "pt");
  CHECK(st.metadata().at("qattn.step") == "7");
  CHECK(st.tensors().size() == 4 + 12 * 2);
  CHECK_FALSE(st.has("lm_head.weight"));
  const ParamLayout lay(m);
  const int C = m.dim;
  CHECK(st.tensors().at("transformer.wte.weight").shape == std::vector<int64_t>{37, C});
  CHECK(st.tensors().at("transformer.wpe.weight").shape == std::vector<int64_t>{6, C});
  CHECK(st.tensors().at("transformer.h.1.attn.c_attn.weight").shape == std::vector<int64_t>{C, 3 * C});
  CHECK(st.tensors().at("transformer.h.1.mlp.c_fc.weight").shape == std::vector<int64_t>{C, 4 * C});
  CHECK(st.tensors().at("transformer.h.1.mlp.c_proj.weight").shape == std::vector<int64_t>{4 * C, C});
  // c_attn.weight[i][o] of layer 1 is ParamLayout's qkvw[1][o][i].
  const auto w = st.read("transformer.h.1.attn.c_attn.weight");
  const float* qkvw1 = params.data() + lay.offset[P_QKVW] + 3 * C * C;
  for (int i = 0; i < C; ++i)
    for (int o = 0; o < 3 * C; ++o) REQUIRE(w[i * 3 * C + o] == qkvw1[o * C + i]);
  CHECK(st.read("transformer.h.1.mlp.c_fc.bias") ==
        std::vector<float>(params.begin() + lay.offset[P_FCB] + 4 * C, params.begin() + lay.offset[P_FCB] + 8 * C));

  ModelConfig gpt2 = m;
  gpt2.vocab = 50257;
  write_hf_model((d / "g").string(), gpt2, std::vector<float>(ParamLayout(gpt2).total), TensorDtype::bf16);
  const json g = json::parse(std::ifstream(d / "g" / "config.json"));
  CHECK(g["eos_token_id"] == 50256);
  CHECK(g["bos_token_id"] == 50256);
  CHECK(g["torch_dtype"] == "bfloat16");

  for (const QkNormForm form : {QkNormForm::gain, QkNormForm::logit_scale}) {
    ModelConfig qk = m;
    qk.qk_norm.form = form;
    CHECK_THROWS_WITH(write_hf_model((d / "qk").string(), qk, std::vector<float>(ParamLayout(qk).total), TensorDtype::f32),
                      Catch::Contains(std::string("model.qk_norm is on (form \"") + to_string(form)) &&
                          Catch::Contains("GPT-2") && Catch::Contains("has no QK-norm"));
    CHECK_FALSE(fs::exists(d / "qk"));
  }
}

TEST_CASE("HF export: GPT-2 computed from the exported tensors by transformers' definition gives qattn's logits",
          "[hf]") {
  const auto d = scratch_dir("hf_forward");
  const ModelConfig m = small_model();
  const auto params = random_params(m, 0.5f, 11);
  write_hf_model(d.string(), m, params, TensorDtype::f32);
  cpu::Gpt2<double> model(m, AttentionConfig{});
  std::copy(params.begin(), params.end(), model.params.begin());
  const std::vector<int32_t> in = {3, 36, 0, 17, 17, 5}, tg(6, 0);
  model.forward(in.data(), tg.data(), 1, 6);
  const auto hf = hf_gpt2_logits(d.string(), in);
  REQUIRE(hf.size() == model.logits().size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < hf.size(); ++i) {
    worst = std::max(worst, std::abs(hf[i] - model.logits()[i]));
    scale = std::max(scale, std::abs(hf[i]));
  }
  INFO("max |difference| " << worst << " of logits up to " << scale);
  CHECK(scale > 1.0);
  CHECK(worst < 1e-9 * scale);  // the same function, summed in another order
}

TEST_CASE("HF round trip: export, then model.init_from reads the same parameters and logits", "[hf]") {
  const auto d = scratch_dir("hf_round_trip");
  const ModelConfig m = small_model();
  const auto params = random_params(m, 0.5f);
  write_hf_model(d.string(), m, params, TensorDtype::f32);
  const auto back = params_from_hf_model(d.string(), m);
  CHECK(back == params);  // bit for bit
  cpu::Gpt2<float> a(m, AttentionConfig{}), b(m, AttentionConfig{});
  a.params = params;
  b.params = back;
  const std::vector<int32_t> in = {1, 2, 3, 4, 5, 6}, tg = {2, 3, 4, 5, 6, 7};
  CHECK(a.forward(in.data(), tg.data(), 1, 6) == b.forward(in.data(), tg.data(), 1, 6));
  CHECK(a.logits() == b.logits());

  SECTION("bf16: each value rounded to nearest even, and exact from there on") {
    write_hf_model((d / "bf16").string(), m, params, TensorDtype::bf16);
    const auto rounded = params_from_hf_model((d / "bf16").string(), m);
    size_t off = 0;
    for (size_t i = 0; i < params.size(); ++i) off += std::abs(rounded[i] - params[i]) > std::abs(params[i]) / 256;
    CHECK(off == 0);
    write_hf_model((d / "bf16b").string(), m, rounded, TensorDtype::bf16);
    CHECK(file_bytes(d / "bf16" / "model.safetensors") == file_bytes(d / "bf16b" / "model.safetensors"));
  }
  SECTION("a shorter seq_len takes the first rows of wpe") {
    ModelConfig shorter = m;
    shorter.seq_len = 4;
    const auto p = params_from_hf_model(d.string(), shorter);
    const ParamLayout s(shorter), l(m);
    CHECK(std::equal(p.begin() + s.offset[P_WPE], p.begin() + s.offset[P_WPE] + s.size[P_WPE],
                     params.begin() + l.offset[P_WPE]));
    CHECK(std::equal(p.begin() + s.offset[P_LN1W], p.end(), params.begin() + l.offset[P_LN1W]));
  }
  SECTION("the original GPT-2 checkpoints' layout: no prefix, mask buffers, a tied lm_head saved") {
    const SafetensorsFile st((d / "model.safetensors").string());
    std::vector<TensorToWrite> t;
    for (const auto& [name, e] : st.tensors()) t.push_back({name.substr(12), e.shape, st.read(name)});
    t.push_back({"h.0.attn.bias", {1, 1, 6, 6}, std::vector<float>(36, 1.0f)});
    t.push_back({"lm_head.weight", {37, 8}, st.read("transformer.wte.weight")});
    write_safetensors((d / "model.safetensors").string(), t, TensorDtype::f32, {{"format", "pt"}});
    CHECK(params_from_hf_model(d.string(), m) == params);
  }
}

TEST_CASE("HF model directories: what differs is named (file, key or tensor, value, expected)", "[hf]") {
  const auto d = scratch_dir("hf_errors");
  const ModelConfig m = small_model();
  const auto params = random_params(m, 0.5f);
  write_hf_model(d.string(), m, params, TensorDtype::f32);
  const std::string weights = (d / "model.safetensors").string(), config = (d / "config.json").string();
  auto error_of = [&](const ModelConfig& want) {
    try {
      params_from_hf_model(d.string(), want);
      return std::string("(accepted)");
    } catch (const HfError& e) {
      return std::string(e.what());
    }
  };
  // Rewrites model.safetensors with `edit` applied to its tensor list.
  auto rewrite = [&](const std::function<void(std::vector<TensorToWrite>&)>& edit) {
    const SafetensorsFile st(weights);
    std::vector<TensorToWrite> t;
    for (const auto& [name, e] : st.tensors()) t.push_back({name, e.shape, st.read(name)});
    edit(t);
    write_safetensors(weights, t, TensorDtype::f32, {{"format", "pt"}});
  };
  auto edit_config = [&](const std::function<void(json&)>& edit) {
    json c = json::parse(std::ifstream(config));
    edit(c);
    std::ofstream(config) << c.dump();
  };

  SECTION("sizes that differ from the run's model config") {
    ModelConfig other = m;
    other.vocab = 50257, other.dim = 16, other.seq_len = 64;
    const std::string e = error_of(other);
    CHECK_THAT(e, Catch::Contains("model.init_from = " + d.string()) &&
                      Catch::Contains(config + ": vocab_size = 37 but model.vocab = 50257") &&
                      Catch::Contains(config + ": n_embd = 8 but model.dim = 16") &&
                      Catch::Contains("n_positions = 6 but model.seq_len = 64"));
    for (const QkNormForm form : {QkNormForm::gain, QkNormForm::logit_scale}) {
      ModelConfig qk = m;
      qk.qk_norm.form = form;
      CHECK_THAT(error_of(qk), Catch::Contains(std::string("model.qk_norm is on (form \"") + to_string(form)));
    }
  }
  SECTION("a truncated safetensors file") {
    fs::resize_file(weights, fs::file_size(weights) - 4);
    CHECK_THAT(error_of(m), Catch::Contains(weights) && Catch::Contains("truncated file"));
  }
  SECTION("a header that lies about the data") {
    std::string b = file_bytes(weights);
    const auto at = b.find("[8,24]");  // transformer.h.0.attn.c_attn.weight's shape, the first [C, 3C]
    REQUIRE(at != std::string::npos);
    b.replace(at, 6, "[8,25]");
    write_bytes(weights, b);
    CHECK_THAT(error_of(m), Catch::Contains(weights) && Catch::Contains("transformer.h.0.attn.c_attn.weight") &&
                                Catch::Contains("span 768 bytes, but F32 [8, 25] needs 800"));
  }
  SECTION("a tensor of the wrong shape, a missing one, an unknown one") {
    rewrite([](std::vector<TensorToWrite>& t) {
      for (auto it = t.begin(); it != t.end();) {
        if (it->name == "transformer.h.1.mlp.c_fc.bias") {
          it = t.erase(it);
          continue;
        }
        if (it->name == "transformer.h.0.attn.c_proj.weight") it->shape = {4, 16};  // same count, wrong shape
        ++it;
      }
      t.push_back({"transformer.h.0.attn.q_norm.weight", {4}, std::vector<float>(4, 1.0f)});
    });
    const std::string e = error_of(m);
    CHECK_THAT(e, Catch::Contains(weights) &&
                      Catch::Contains("tensor transformer.h.1.mlp.c_fc.bias is missing (shape [32] expected)") &&
                      Catch::Contains("tensor transformer.h.0.attn.c_proj.weight has shape [4, 16]; config.json "
                                      "implies [8, 8]") &&
                      Catch::Contains("transformer.h.0.attn.q_norm.weight (F32 [4]) has no place"));
  }
  SECTION("an untied head") {
    rewrite([](std::vector<TensorToWrite>& t) {
      t.push_back({"lm_head.weight", {37, 8}, std::vector<float>(37 * 8, 0.5f)});
    });
    CHECK_THAT(error_of(m), Catch::Contains("lm_head.weight differs from transformer.wte.weight"));
  }
  SECTION("config.json settings qattn's model does not have") {
    edit_config([](json& c) {
      c["activation_function"] = "gelu";
      c["layer_norm_epsilon"] = 1e-6;
      c["n_inner"] = 64;
      c.erase("n_head");
    });
    const std::string e = error_of(m);
    CHECK_THAT(e, Catch::Contains(config) &&
                      Catch::Contains("activation_function: \"gelu\" is not allowed; allowed: \"gelu_new\" | "
                                      "\"gelu_pytorch_tanh\"") &&
                      Catch::Contains("layer_norm_epsilon: 1e-06 is not allowed") &&
                      Catch::Contains("n_inner: 64 is not allowed; allowed: null | 32") &&
                      Catch::Contains("n_head: missing"));
    edit_config([](json& c) { c["model_type"] = "llama"; });
    CHECK_THAT(error_of(m), Catch::Contains("model_type: \"llama\" is not allowed; allowed: \"gpt2\""));
  }
  SECTION("no config.json, or no model.safetensors") {
    fs::remove(weights);
    CHECK_THAT(error_of(m), Catch::Contains(weights) && Catch::Contains("cannot open"));
    fs::remove(config);
    CHECK_THAT(error_of(m), Catch::Contains(config) && Catch::Contains("cannot open"));
  }
}

TEST_CASE("qattn export --format hf, then a run starts from the directory with model.init_from", "[hf][cli]") {
  const auto d = scratch_dir("hf_cli");
  make_corpus(d);
  const auto cfg = write_json(d / "src.json", tiny_config(d, "src", 8));
  REQUIRE(exit_code(run_qattn({"train", cfg.string()}, {}, d / "log.txt")) == 0);
  const fs::path run = d / "runs" / "src", out = d / "hf";
  REQUIRE(exit_code(run_qattn({"export", "--checkpoint", run.string(), "--format", "hf", "--out", out.string()}, {},
                              d / "log.txt")) == 0);
  const Checkpoint ck = load_checkpoint(latest_checkpoint(run.string()));
  const HfModel hf = read_hf_model(out.string());
  CHECK(hf.params == ck.params);
  CHECK(hf.model.vocab == 257);
  CHECK(SafetensorsFile((out / "model.safetensors").string()).metadata().at("qattn.step") == "8");

  // The new run's untrained model is the exported one: its step-0 val loss is
  // the source run's final val loss (same val batches).
  json j = tiny_config(d, "dst", 8);
  j["model"]["init_from"] = out.string();
  const auto dst = write_json(d / "dst.json", j);
  REQUIRE(exit_code(run_qattn({"train", dst.string()}, {}, d / "log.txt")) == 0);
  const auto val_of = [](const std::string& row) {  // step,tokens,lr,train,val,norm,
    std::vector<std::string> f;
    std::stringstream ss(row);
    for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
    return f.at(4);
  };
  CHECK(val_of(loss_columns(d / "runs" / "dst" / "metrics.csv").front()) ==
        val_of(loss_columns(run / "metrics.csv").back()));
  CHECK(read_text(d / "log.txt").find("initialised from Hugging Face model directory") != std::string::npos);

  // `qattn sample --temperature 0 --ids` (what tools/dev/hf_check.sh compares
  // with transformers) is the argmax path of the exported model.
  const fs::path ids = d / "ids.txt";
  REQUIRE(exit_code(run_qattn({"sample", "--checkpoint", run.string(), "--tokens", "6", "--temperature", "0", "--ids"},
                              {}, ids)) == 0);
  std::vector<int32_t> context = {256};  // the byte tokenizer's end-of-text
  cpu::Gpt2<float> model(hf.model, AttentionConfig{});
  model.params = hf.params;
  std::string want;
  for (int n = 0; n < 6; ++n) {
    const int T = static_cast<int>(context.size());
    model.forward(context.data(), std::vector<int32_t>(T, 0).data(), 1, T);
    const float* last = model.logits().data() + static_cast<size_t>(T - 1) * 257;
    context.push_back(static_cast<int32_t>(std::max_element(last, last + 257) - last));
    want += (n ? " " : "") + std::to_string(context.back());
  }
  CHECK(read_text(ids) == want + "\n");

  // A mismatch stops the run before it trains, naming the key.
  j["model"]["dim"] = 32;
  j["log"]["name"] = "bad";
  const auto bad = write_json(d / "bad.json", j);
  CHECK(exit_code(run_qattn({"train", bad.string()}, {}, d / "bad.txt")) != 0);
  CHECK(read_text(d / "bad.txt").find("n_embd = 16 but model.dim = 32") != std::string::npos);
}
