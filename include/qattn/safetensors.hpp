// safetensors files, the tensor format Hugging Face models are stored in:
//   8 bytes: N, the header length (uint64, little-endian)
//   N bytes: a JSON object, one entry per tensor,
//              "NAME": {"dtype": "F32", "shape": [rows, cols], "data_offsets": [begin, end]},
//            and "__metadata__": {string: string} (transformers wants "format": "pt");
//            padded with spaces to a multiple of 8
//   then the data: each tensor's values row-major and little-endian at
//   [begin, end) counted from the end of the header. The tensors tile the data
//   exactly: no gap, no overlap, nothing after the last one.
#pragma once
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace qattn {

struct SafetensorsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The float types qattn reads (all three) and writes (F32, BF16).
enum class TensorDtype { f32, bf16, f16 };
std::string to_string(TensorDtype);  // "F32" | "BF16" | "F16", the header's names

struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;  // product(shape) values, row-major
};

// Writes the tensors in the given order, converted to dtype (F32 or BF16,
// rounded to nearest even), with the metadata strings. Written atomically: a
// failure leaves no file behind. Throws SafetensorsError naming path.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       TensorDtype dtype, const std::map<std::string, std::string>& metadata);

// One safetensors file. Opening reads and validates the whole header (its
// length against the file, the JSON, every entry's dtype, shape and offsets,
// the tiling of the data); the values are read on demand.
class SafetensorsFile {
 public:
  struct Entry {
    std::string dtype;           // the header's name: "F32", "BF16", "I64", ...
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0; // byte range in the data
  };

  explicit SafetensorsFile(const std::string& path);  // throws SafetensorsError naming path
  const std::string& path() const { return path_; }
  const std::map<std::string, Entry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // A tensor's values as fp32 (exact from F32, BF16 and F16); throws naming
  // the tensor when it is absent or of another dtype.
  std::vector<float> read(const std::string& name) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace qattn
