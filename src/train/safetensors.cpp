// safetensors: write (F32, BF16) and read with the header fully validated.
// Values are little-endian in the file, as on every host qattn builds for.
#include "qattn/safetensors.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "float_bits.hpp"
#include "qattn/atomic_file.hpp"

namespace qattn {

using nlohmann::json;

namespace {

// Larger headers are refused, as the reference implementation refuses them.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Bytes per element of every dtype the format defines (a file may hold
// tensors qattn never reads; their sizes still have to add up).
int dtype_bytes(const std::string& d) {
  static const std::map<std::string, int> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
      {"I64", 8},  {"U64", 8}, {"F64", 8}};
  const auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::string to_string(TensorDtype d) {
  switch (d) {
    case TensorDtype::f32: return "F32";
    case TensorDtype::bf16: return "BF16";
    case TensorDtype::f16: return "F16";
  }
  return "?";
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       TensorDtype dtype, const std::map<std::string, std::string>& metadata) {
  if (dtype == TensorDtype::f16)
    throw SafetensorsError(path + ": writing F16 is not supported; allowed: F32 | BF16");
  const uint64_t elem = dtype == TensorDtype::f32 ? 4 : 2;
  json header = json::object();
  header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    uint64_t count = 1;
    for (int64_t n : t.shape) count *= static_cast<uint64_t>(n);
    if (count != t.values.size() || t.name.empty() || t.name == "__metadata__" || header.contains(t.name))
      throw SafetensorsError(path + ": tensor \"" + t.name + "\" with shape " + shape_text(t.shape) + " and " +
                             std::to_string(t.values.size()) +
                             " values cannot be written (names must be unique and not empty, the values "
                             "must fill the shape)");
    header[t.name] = {{"dtype", to_string(dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + count * elem}}};
    offset += count * elem;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  try {
    write_file_atomically(path, [&](std::ostream& f) {
      uint8_t length[8];
      for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
      f.write(reinterpret_cast<const char*>(length), 8);
      f.write(text.data(), static_cast<std::streamsize>(text.size()));
      std::vector<uint16_t> half;
      for (const TensorToWrite& t : tensors) {
        if (dtype == TensorDtype::f32) {
          f.write(reinterpret_cast<const char*>(t.values.data()), static_cast<std::streamsize>(t.values.size() * 4));
        } else {
          half.resize(t.values.size());
          std::transform(t.values.begin(), t.values.end(), half.begin(), bf16_from_float);
          f.write(reinterpret_cast<const char*>(half.data()), static_cast<std::streamsize>(half.size() * 2));
        }
      }
    }, /*binary=*/true);
  } catch (const std::runtime_error& e) {
    throw SafetensorsError(e.what());
  }
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  auto fail = [&](const std::string& what) { throw SafetensorsError(path + ": " + what); };
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open safetensors file");
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) fail("cannot read its size: " + ec.message());
  if (size < 8) fail(std::to_string(size) + " bytes, shorter than the 8-byte header length");
  uint8_t length[8];
  f.read(reinterpret_cast<char*>(length), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(length[i]) << (8 * i);
  if (n > kMaxHeaderBytes)
    fail("header length " + std::to_string(n) + " exceeds the " + std::to_string(kMaxHeaderBytes) +
         " bytes allowed (not a safetensors file?)");
  if (n > size - 8)
    fail("header length " + std::to_string(n) + " exceeds the " + std::to_string(size - 8) +
         " bytes after it (truncated file?)");
  std::string text(n, '\0');
  if (!f.read(text.data(), static_cast<std::streamsize>(n))) fail("read of the header failed");
  data_start_ = 8 + n;
  const uint64_t data_bytes = size - data_start_;

  json header;
  try {
    header = json::parse(text);
  } catch (const json::parse_error& e) {
    fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail("header is " + std::string(header.type_name()) + ", expected a JSON object");
  for (const auto& [name, v] : header.items()) {
    const std::string where = "header entry \"" + name + "\": ";
    if (name == "__metadata__") {
      if (!v.is_object()) fail(where + "expected an object of strings");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) fail(where + "value of \"" + k + "\" is " + s.dump() + ", expected a string");
        metadata_[k] = s.get<std::string>();
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") || v.size() != 3)
      fail(where + v.dump() + " is not allowed; allowed: {\"dtype\", \"shape\", \"data_offsets\"}");
    Entry e;
    if (!v["dtype"].is_string() || dtype_bytes(v["dtype"].get<std::string>()) == 0)
      fail(where + "dtype " + v["dtype"].dump() + " is not a safetensors dtype");
    e.dtype = v["dtype"].get<std::string>();
    if (!v["shape"].is_array()) fail(where + "shape " + v["shape"].dump() + " is not a list of sizes");
    uint64_t bytes = static_cast<uint64_t>(dtype_bytes(e.dtype));
    for (const json& d : v["shape"]) {
      if (!d.is_number_unsigned()) fail(where + "shape " + v["shape"].dump() + " is not a list of sizes");
      e.shape.push_back(d.get<int64_t>());
      if (__builtin_mul_overflow(bytes, d.get<uint64_t>(), &bytes))
        fail(where + "shape " + v["shape"].dump() + " is too large");
    }
    const json& o = v["data_offsets"];
    if (!o.is_array() || o.size() != 2 || !o[0].is_number_unsigned() || !o[1].is_number_unsigned() ||
        o[0].get<uint64_t>() > o[1].get<uint64_t>())
      fail(where + "data_offsets " + o.dump() + " is not allowed; allowed: [begin, end] with begin <= end");
    e.begin = o[0].get<uint64_t>();
    e.end = o[1].get<uint64_t>();
    if (e.end - e.begin != bytes)
      fail(where + "data_offsets " + o.dump() + " span " + std::to_string(e.end - e.begin) + " bytes, but " +
           e.dtype + " " + shape_text(e.shape) + " needs " + std::to_string(bytes));
    if (e.end > data_bytes)
      fail(where + "data_offsets " + o.dump() + " reach beyond the " + std::to_string(data_bytes) +
           " data bytes the file holds (truncated file?)");
    tensors_.emplace(name, std::move(e));
  }
  // The tensors must tile the data: sorted by start, each begins where the last ended.
  std::vector<std::pair<uint64_t, const std::string*>> order;
  for (const auto& [name, e] : tensors_) order.emplace_back(e.begin, &name);
  std::sort(order.begin(), order.end());
  uint64_t at = 0;
  const std::string* previous = nullptr;
  for (const auto& [begin, name] : order) {
    const Entry& e = tensors_.at(*name);
    if (begin != at)
      fail("tensor \"" + *name + "\" starts at data byte " + std::to_string(begin) +
           (previous ? ", but \"" + *previous + "\" ends at " : ", but the data starts at ") + std::to_string(at) +
           (begin < at ? " (overlap)" : " (gap)"));
    at = e.end;
    previous = name;
  }
  if (at != data_bytes)
    fail(std::to_string(data_bytes - at) + " bytes after the last tensor (the header covers " + std::to_string(at) +
         " of " + std::to_string(data_bytes) + " data bytes)");
}

std::vector<float> SafetensorsFile::read(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw SafetensorsError(path_ + ": tensor \"" + name + "\" is missing");
  const Entry& e = it->second;
  const int elem = dtype_bytes(e.dtype);
  if (e.dtype != "F32" && e.dtype != "BF16" && e.dtype != "F16")
    throw SafetensorsError(path_ + ": tensor \"" + name + "\" has dtype " + e.dtype + "; allowed: F32 | BF16 | F16");
  std::ifstream f(path_, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(data_start_ + e.begin));
  const size_t count = (e.end - e.begin) / elem;
  std::vector<float> out(count);
  if (elem == 4) {
    f.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(count * 4));
  } else {
    std::vector<uint16_t> half(count);
    f.read(reinterpret_cast<char*>(half.data()), static_cast<std::streamsize>(count * 2));
    std::transform(half.begin(), half.end(), out.begin(), e.dtype == "BF16" ? float_from_bf16 : float_from_f16);
  }
  if (!f) throw SafetensorsError(path_ + ": read of tensor \"" + name + "\" failed");
  return out;
}

}  // namespace qattn
