// Reading GGUF model files (llama.cpp's format, versions 2 and 3).
//
// This is model loading, not the cache's concern, so it lives in model/ and
// not in include/kvcache: kvcache itself never reads weights.
//
// File layout (little-endian):
//   "GGUF" u32 version  u64 tensor_count  u64 metadata_count
//   metadata_count x { string key, u32 value_type, value }
//   tensor_count   x { string name, u32 n_dims (1..4), u64 dims[n_dims],
//                      u32 ggml_type, u64 offset }
//   padding to `general.alignment` (u32, a power of two; default 32)
//   tensor data: each tensor at data_start + offset (offset % alignment == 0)
// where a string is { u64 length, bytes (not NUL-terminated) } and an array
// value is { u32 element_type, u64 count, count x element } (arrays may nest).
// dims[0] is the innermost (contiguous) dimension, so a matrix [cols, rows]
// in GGUF order is `rows` rows of `cols` values, each row a whole number of
// its type's blocks.
//
// GgufFile::Open maps the file read-only and validates everything it can
// without touching the tensor bytes: every string, count and array stays
// inside the file, keys and tensor names are unique, every tensor's type is
// known, its dims are positive, its row is a whole number of blocks, and its
// bytes lie inside the file. Any failure is a Corruption (or IoError)
// naming the file and what, where (byte offset) it is; nothing is kept.
//
// The tensor types, their block sizes and their decoding are the tensor
// floor's (model/tensor/ggml_type.h, model/tensor/gguf_dequant.h).
//
// Thread safety: a GgufFile is immutable after Open; share it freely. The
// spans it hands out point into the mapping and live as long as the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/status.h"
#include "model/tensor/ggml_type.h"

namespace kvcache::model {

// GGUF metadata value types (the on-disk u32 codes).
enum class GgufType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};
// "uint32", "string", "array", ...; "type N" for an unknown code.
std::string GgufTypeName(GgufType type);

// One metadata value. Exactly one payload field is meaningful, by `type`:
// integers and bool in `i` (unsigned values above INT64_MAX are kept in `u`
// as well; `u` always holds the bit pattern), floats in `f`, strings in
// `str`, arrays in `array` with every element of type `element_type`.
struct GgufValue {
  GgufType type = GgufType::kUint8;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string str;
  GgufType element_type = GgufType::kUint8;
  std::vector<GgufValue> array;

  bool is_integer() const;  // any of the eight integer types (not bool)
};

struct GgufTensor {
  std::string name;
  std::vector<uint64_t> dims;  // GGUF order: dims[0] innermost
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;             // relative to the start of tensor data
  uint64_t num_bytes = 0;          // exact size of its data
  std::span<const uint8_t> bytes;  // into the mapping

  uint64_t num_values() const;
  uint64_t cols() const { return dims.empty() ? 0 : dims[0]; }
  uint64_t rows() const { return cols() == 0 ? 0 : num_values() / cols(); }
  uint64_t row_bytes() const;  // bytes of one row (cols values)
  // "[576, 49152]".
  std::string DimsString() const;
};

class GgufFile {
 public:
  // Maps and validates `path` (see the file comment). IoError if it cannot
  // be opened or mapped, Corruption for a malformed file; both name the path.
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // The same from bytes in memory (kept by the file); `name` stands for the
  // path in messages.
  static Result<std::unique_ptr<GgufFile>> FromBytes(std::vector<uint8_t> bytes,
                                                     const std::string& name);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // byte offset of tensor data
  uint64_t file_bytes() const { return size_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  // nullptr when absent.
  const GgufValue* Find(std::string_view key) const;

  // Typed accessors. NotFound naming the key when it is absent;
  // InvalidArgument naming the key, its type and the wanted one otherwise.
  // Integers of any width are accepted where the value fits the result
  // (OutOfRange naming the key and value when it does not); floats accept
  // float32 and float64.
  Result<std::string> GetString(std::string_view key) const;
  Result<uint32_t> GetU32(std::string_view key) const;
  Result<int64_t> GetInt(std::string_view key) const;
  Result<float> GetF32(std::string_view key) const;
  Result<bool> GetBool(std::string_view key) const;
  // Arrays: every element must have the wanted kind (a string array for
  // GetStringArray, an integer array for GetI32Array, ...).
  Result<std::vector<std::string>> GetStringArray(std::string_view key) const;
  Result<std::vector<int32_t>> GetI32Array(std::string_view key) const;
  Result<std::vector<float>> GetF32Array(std::string_view key) const;

  // Tensors in file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // NotFound naming the tensor and the file.
  Result<const GgufTensor*> FindTensor(std::string_view name) const;
  // FindTensor, then Corruption unless its dims equal `dims` (GGUF order),
  // naming the tensor, the wanted and the found shape.
  Result<const GgufTensor*> FindTensor(std::string_view name,
                                       const std::vector<uint64_t>& dims) const;
  // The whole tensor as f32 (FindTensor with dims, then DequantizeRow).
  Result<std::vector<float>> ReadF32(std::string_view name,
                                     const std::vector<uint64_t>& dims) const;

 private:
  GgufFile() = default;
  Status Parse();
  std::string Where(uint64_t offset) const;

  std::string path_;
  const uint8_t* map_ = nullptr;  // the mapping, or owned_.data()
  bool mapped_ = false;
  std::vector<uint8_t> owned_;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensor> tensors_;
};

}  // namespace kvcache::model
