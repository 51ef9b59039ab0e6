// llm.c model files: write (fp32 / bf16) and read, mapped onto ParamLayout.
#include "qattn/atomic_file.hpp"
#include "qattn/llmc_model.hpp"

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "float_bits.hpp"
#include "qattn/model.hpp"

namespace qattn {

namespace {

constexpr int kHeaderInts = 256;
constexpr int kLlmcTensors = P_QGAMMA;  // llm.c's 16 tensors: ParamLayout up to lnfb

// Element count of each tensor in the file: ParamLayout's, except wte, which
// has padded_vocab rows.
std::array<size_t, kLlmcTensors> file_sizes(const ModelConfig& m, int vp) {
  const ParamLayout lay(m);
  std::array<size_t, kLlmcTensors> n{};
  for (int t = 0; t < kLlmcTensors; ++t) n[t] = lay.size[t];
  n[P_WTE] = static_cast<size_t>(vp) * m.dim;
  return n;
}

void require_no_qk_norm(const ModelConfig& m, const std::string& what) {
  if (m.qk_norm.on())
    throw LlmcError(what + ": model.qk_norm is on (form \"" + to_string(m.qk_norm.form) +
                    "\"), but llm.c's model file has no place for the QK-norm parameters; allowed: "
                    "GPT-2 configs with model.qk_norm = false");
}

}  // namespace

int padded_vocab(int vocab) { return (vocab + 127) / 128 * 128; }

void write_llmc_model(const std::string& path, const ModelConfig& m, const std::vector<float>& params,
                      int32_t version) {
  require_no_qk_norm(m, path);
  if (version != kLlmcVersionFp32 && version != kLlmcVersionBf16)
    throw LlmcError(path + ": version " + std::to_string(version) + " is not allowed; allowed: 3 (fp32) | 5 (bf16)");
  const ParamLayout lay(m);
  if (params.size() != lay.total)
    throw LlmcError(path + ": " + std::to_string(params.size()) + " parameters given, the model has " +
                    std::to_string(lay.total));
  const int vp = padded_vocab(m.vocab);
  std::array<int32_t, kHeaderInts> header{};
  header[0] = kLlmcModelMagic;
  header[1] = version;
  header[2] = m.seq_len;
  header[3] = m.vocab;
  header[4] = m.layers;
  header[5] = m.heads;
  header[6] = m.dim;
  header[7] = vp;

  // Values in file order: wte padded with zero rows, then the other tensors as they are.
  std::vector<float> values;
  values.reserve(lay.total + static_cast<size_t>(vp - m.vocab) * m.dim);
  const auto end_of = [&](int t) { return params.begin() + static_cast<std::ptrdiff_t>(lay.offset[t] + lay.size[t]); };
  values.insert(values.end(), params.begin(), end_of(P_WTE));
  values.resize(values.size() + static_cast<size_t>(vp - m.vocab) * m.dim, 0.0f);
  values.insert(values.end(), end_of(P_WTE), end_of(P_LNFB));

  try {
    write_file_atomically(path, [&](std::ostream& f) {
      f.write(reinterpret_cast<const char*>(header.data()), sizeof header);
      if (version == kLlmcVersionFp32) {
        f.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * 4));
      } else {
        std::vector<uint16_t> half(values.size());
        for (size_t i = 0; i < values.size(); ++i) half[i] = bf16_from_float(values[i]);
        f.write(reinterpret_cast<const char*>(half.data()), static_cast<std::streamsize>(half.size() * 2));
      }
    }, /*binary=*/true);
  } catch (const std::runtime_error& e) {
    throw LlmcError(e.what());
  }
}

namespace {

// Reads and checks the header (magic, version, plausible shape, file size);
// leaves f at the first value. The returned model has no params yet.
LlmcModel read_header(const std::string& path, std::ifstream& f) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw LlmcError(path + ": is a directory; allowed: an llm.c model file");
  f.open(path, std::ios::binary);
  if (!f) throw LlmcError(path + ": cannot open llm.c model file: " + std::strerror(errno));
  std::array<int32_t, kHeaderInts> h{};
  if (!f.read(reinterpret_cast<char*>(h.data()), sizeof h))
    throw LlmcError(path + ": shorter than the 1024-byte llm.c header");
  if (h[0] != kLlmcModelMagic)
    throw LlmcError(path + ": magic " + std::to_string(h[0]) + " is not an llm.c model file's (" +
                    std::to_string(kLlmcModelMagic) + ")");
  if (h[1] != kLlmcVersionFp32 && h[1] != kLlmcVersionBf16)
    throw LlmcError(path + ": version " + std::to_string(h[1]) + " is not supported; allowed: 3 (fp32) | 5 (bf16)");
  LlmcModel out;
  out.version = h[1];
  ModelConfig& m = out.model;
  m.seq_len = h[2], m.vocab = h[3], m.layers = h[4], m.heads = h[5], m.dim = h[6];
  out.padded_vocab = h[7];
  if (m.seq_len < 1 || m.vocab < 2 || m.layers < 1 || m.heads < 1 || m.dim < 1 || m.dim % m.heads != 0 ||
      out.padded_vocab < m.vocab)
    throw LlmcError(path + ": implausible header (max_seq_len " + std::to_string(m.seq_len) + ", vocab " +
                    std::to_string(m.vocab) + ", padded vocab " + std::to_string(out.padded_vocab) +
                    ", layers " + std::to_string(m.layers) + ", heads " + std::to_string(m.heads) +
                    ", channels " + std::to_string(m.dim) + ")");
  size_t count = 0;
  for (size_t n : file_sizes(m, out.padded_vocab)) count += n;
  const size_t elem = h[1] == kLlmcVersionFp32 ? 4 : 2;
  const auto want = sizeof h + count * elem, got = std::filesystem::file_size(path, ec);
  if (ec) throw LlmcError(path + ": cannot read its size: " + ec.message());
  if (got != want)
    throw LlmcError(path + ": " + std::to_string(got) + " bytes; the header implies " + std::to_string(want));
  return out;
}

}  // namespace

LlmcModel read_llmc_model(const std::string& path) {
  std::ifstream f;
  LlmcModel out = read_header(path, f);
  const ModelConfig& m = out.model;
  const auto sizes = file_sizes(m, out.padded_vocab);
  size_t count = 0;
  for (size_t n : sizes) count += n;
  std::vector<float> values(count);
  if (out.version == kLlmcVersionFp32) {
    f.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(count * 4));
  } else {
    std::vector<uint16_t> half(count);
    f.read(reinterpret_cast<char*>(half.data()), static_cast<std::streamsize>(count * 2));
    for (size_t i = 0; i < count; ++i) values[i] = float_from_bf16(half[i]);
  }
  if (!f) throw LlmcError(path + ": read failed: " + std::strerror(errno));
  // Drop wte's padding rows: the real rows come first.
  const size_t wte_real = static_cast<size_t>(m.vocab) * m.dim;
  out.params.reserve(count - (sizes[P_WTE] - wte_real));
  out.params.insert(out.params.end(), values.begin(), values.begin() + static_cast<std::ptrdiff_t>(wte_real));
  out.params.insert(out.params.end(), values.begin() + static_cast<std::ptrdiff_t>(sizes[P_WTE]), values.end());
  return out;
}

void check_llmc_model(const std::string& path, const ModelConfig& m) {
  require_no_qk_norm(m, "model.init_from = " + path);
  std::ifstream f;
  const ModelConfig file = [&] {
    try {
      return read_header(path, f).model;
    } catch (const LlmcError& e) {
      throw LlmcError("model.init_from = " + std::string(e.what()));
    }
  }();
  std::string diff;
  auto check = [&](const char* key, int want, int have) {
    if (want != have) diff += std::string(diff.empty() ? "" : ", ") + "model." + key + " = " +
                              std::to_string(want) + " but the file has " + std::to_string(have);
  };
  check("vocab", m.vocab, file.vocab);
  check("layers", m.layers, file.layers);
  check("heads", m.heads, file.heads);
  check("dim", m.dim, file.dim);
  if (m.seq_len > file.seq_len)
    diff += std::string(diff.empty() ? "" : ", ") + "model.seq_len = " + std::to_string(m.seq_len) +
            " exceeds the file's max_seq_len " + std::to_string(file.seq_len);
  if (!diff.empty()) throw LlmcError("model.init_from = " + path + ": " + diff);
}

std::vector<float> params_from_llmc_model(const std::string& path, const ModelConfig& m) {
  check_llmc_model(path, m);
  const LlmcModel file = [&] {
    try {
      return read_llmc_model(path);
    } catch (const LlmcError& e) {
      throw LlmcError("model.init_from = " + std::string(e.what()));
    }
  }();
  return params_for_context(file.model, file.params, m);
}

}  // namespace qattn
