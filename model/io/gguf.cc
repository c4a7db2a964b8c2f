// GGUF parsing: a bounds-checked cursor over the read-only mapping, the
// typed metadata accessors, and tensor lookup. Dequantization kernels live
// in model/tensor/gguf_dequant.cc.
#include "model/io/gguf.h"

#include "model/tensor/gguf_dequant.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_set>

namespace kvcache::model {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;

std::string Num(uint64_t v) { return std::to_string(v); }

// Reads forward through [0, size); every read is checked against the end.
class Cursor {
 public:
  Cursor(const uint8_t* p, uint64_t size) : p_(p), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  template <class T>
  bool Read(T* v) {
    if (left() < sizeof(T)) return false;
    std::memcpy(v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool ReadString(std::string* s) {
    uint64_t n;
    if (!Read(&n) || left() < n) return false;
    s->assign(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return true;
  }

 private:
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// Smallest on-disk size of one value of `t` (to bound array counts).
uint64_t MinValueBytes(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
    case GgufType::kString:
      return 8;
    case GgufType::kArray:
      return 12;
  }
  return 0;
}

template <class T>
bool ReadInt(Cursor& c, GgufValue* v) {
  T x;
  if (!c.Read(&x)) return false;
  v->i = static_cast<int64_t>(x);
  v->u = static_cast<uint64_t>(x);
  return true;
}

// Reads one value of type t; an empty string on success, else what failed.
std::string ReadValue(Cursor& c, GgufType t, int depth, GgufValue* v) {
  v->type = t;
  const uint64_t at = c.pos();
  const std::string trunc = "truncated " + GgufTypeName(t) + " value at byte " + Num(at);
  switch (t) {
    case GgufType::kUint8: return ReadInt<uint8_t>(c, v) ? "" : trunc;
    case GgufType::kInt8: return ReadInt<int8_t>(c, v) ? "" : trunc;
    case GgufType::kUint16: return ReadInt<uint16_t>(c, v) ? "" : trunc;
    case GgufType::kInt16: return ReadInt<int16_t>(c, v) ? "" : trunc;
    case GgufType::kUint32: return ReadInt<uint32_t>(c, v) ? "" : trunc;
    case GgufType::kInt32: return ReadInt<int32_t>(c, v) ? "" : trunc;
    case GgufType::kUint64: return ReadInt<uint64_t>(c, v) ? "" : trunc;
    case GgufType::kInt64: return ReadInt<int64_t>(c, v) ? "" : trunc;
    case GgufType::kBool: {
      uint8_t b;
      if (!c.Read(&b)) return trunc;
      if (b > 1) return "bool value " + Num(b) + " (not 0 or 1) at byte " + Num(at);
      v->i = v->u = b;
      return "";
    }
    case GgufType::kFloat32: {
      float f;
      if (!c.Read(&f)) return trunc;
      v->f = f;
      return "";
    }
    case GgufType::kFloat64: return c.Read(&v->f) ? "" : trunc;
    case GgufType::kString: return c.ReadString(&v->str) ? "" : trunc;
    case GgufType::kArray: {
      if (depth >= kMaxArrayDepth) {
        return "arrays nested deeper than " + Num(kMaxArrayDepth) + " at byte " + Num(at);
      }
      uint32_t et;
      uint64_t n;
      if (!c.Read(&et) || !c.Read(&n)) return trunc;
      const uint64_t min_bytes = MinValueBytes(static_cast<GgufType>(et));
      if (min_bytes == 0) return "array of unknown value type " + Num(et) + " at byte " + Num(at);
      if (n > c.left() / min_bytes) {
        return "array of " + Num(n) + " elements at byte " + Num(at) + " runs past the end";
      }
      v->element_type = static_cast<GgufType>(et);
      v->array.resize(n);
      for (uint64_t k = 0; k < n; ++k) {
        std::string e = ReadValue(c, v->element_type, depth + 1, &v->array[k]);
        if (!e.empty()) return e;
      }
      return "";
    }
  }
  return "unknown value type " + Num(static_cast<uint32_t>(t)) + " at byte " + Num(at);
}

bool IsFloat(GgufType t) { return t == GgufType::kFloat32 || t == GgufType::kFloat64; }
bool IsSigned(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 ||
         t == GgufType::kInt64;
}

// The value as an integer in [lo, hi], or an error message.
template <class T>
std::string IntIn(const GgufValue& v, T* out) {
  if (IsSigned(v.type)) {
    if (v.i < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        (v.i > 0 && static_cast<uint64_t>(v.i) > static_cast<uint64_t>(std::numeric_limits<T>::max()))) {
      return "value " + std::to_string(v.i) + " does not fit";
    }
    *out = static_cast<T>(v.i);
  } else {
    if (v.u > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
      return "value " + Num(v.u) + " does not fit";
    }
    *out = static_cast<T>(v.u);
  }
  return "";
}

// The prefix of an error at byte `offset` of the file at `path`.
std::string WhereIn(const std::string& path, uint64_t offset) {
  return "GGUF " + path + " (byte " + Num(offset) + "): ";
}

// The header: magic, version (2 or 3), the tensor and metadata counts
// (bounded by what the file can hold). An empty string on success, else the
// error.
std::string ReadHeader(Cursor& c, const std::string& path, uint32_t* version,
                       uint64_t* n_tensors, uint64_t* n_kv) {
  uint32_t magic = 0;
  if (!c.Read(&magic) || magic != kMagic) return "GGUF " + path + ": not a GGUF file (bad magic)";
  if (!c.Read(version)) return WhereIn(path, c.pos()) + "truncated header";
  if (*version != 2 && *version != 3) {
    return "GGUF " + path + ": version " + Num(*version) + " is not supported (only 2 and 3)";
  }
  if (!c.Read(n_tensors) || !c.Read(n_kv)) return WhereIn(path, c.pos()) + "truncated header";
  // Each key takes at least 12 bytes, each tensor info at least 28.
  if (*n_kv > c.left() / 12 || *n_tensors > c.left() / 28) {
    return WhereIn(path, c.pos()) + "header claims " + Num(*n_tensors) + " tensors and " +
           Num(*n_kv) + " metadata keys, more than the file holds";
  }
  return "";
}

// Metadata entry k (key, type, value) into *out; a key already in *seen is
// an error. An empty string on success, else the error.
std::string ReadMetadataEntry(Cursor& c, const std::string& path, uint64_t k,
                              std::unordered_set<std::string>* seen,
                              std::pair<std::string, GgufValue>* out) {
  const uint64_t at = c.pos();
  std::string key;
  uint32_t t;
  if (!c.ReadString(&key) || !c.Read(&t)) {
    return WhereIn(path, at) + "truncated metadata key " + Num(k);
  }
  if (!seen->insert(key).second) return WhereIn(path, at) + "duplicate metadata key '" + key + "'";
  GgufValue v;
  const std::string e = ReadValue(c, static_cast<GgufType>(t), 0, &v);
  if (!e.empty()) return "GGUF " + path + ": metadata '" + key + "': " + e;
  *out = {std::move(key), std::move(v)};
  return "";
}

// Tensor info k (name, dims, type, offset) into *t with its byte size: a
// name already in *seen, an unknown type, bad dims, a row that is not whole
// blocks or an offset off the alignment is an error. An empty string on
// success, else the error.
std::string ReadTensorInfo(Cursor& c, const std::string& path, uint64_t k, uint32_t alignment,
                           std::unordered_set<std::string>* seen, GgufTensor* t) {
  const uint64_t at = c.pos();
  const std::string where = WhereIn(path, at);
  uint32_t nd = 0, type = 0;
  if (!c.ReadString(&t->name) || !c.Read(&nd)) return where + "truncated tensor info " + Num(k);
  if (nd == 0 || nd > kMaxDims) {
    return where + "tensor '" + t->name + "' has " + Num(nd) + " dims (1 to 4 allowed)";
  }
  t->dims.resize(nd);
  for (uint32_t d = 0; d < nd; ++d) {
    if (!c.Read(&t->dims[d])) return where + "truncated tensor info '" + t->name + "'";
  }
  if (!c.Read(&type) || !c.Read(&t->offset)) return where + "truncated tensor info '" + t->name + "'";
  t->type = static_cast<GgmlType>(type);
  if (!seen->insert(t->name).second) return where + "duplicate tensor '" + t->name + "'";
  const GgmlTypeSize s = GgmlTypeSizeOf(t->type);
  if (s.block_values == 0) {
    return where + "tensor '" + t->name + "' has unknown ggml type " + Num(type);
  }
  // Sizes: positive dims whose product stays far from overflow.
  uint64_t values = 1;
  for (uint64_t d : t->dims) {
    if (d == 0 || d > (uint64_t{1} << 40) || values > (uint64_t{1} << 62) / d) {
      return where + "tensor '" + t->name + "' has bad dims " + t->DimsString();
    }
    values *= d;
  }
  if (t->dims[0] % s.block_values != 0) {
    return where + "tensor '" + t->name + "' (" + GgmlTypeName(t->type) + ") row of " +
           Num(t->dims[0]) + " values is not a multiple of the block size " + Num(s.block_values);
  }
  t->num_bytes = values / s.block_values * s.block_bytes;
  if (t->offset % alignment != 0) {
    return where + "tensor '" + t->name + "' offset " + Num(t->offset) +
           " is not a multiple of the alignment " + Num(alignment);
  }
  return "";
}

}  // namespace

std::string GgufTypeName(GgufType type) {
  switch (type) {
    case GgufType::kUint8: return "uint8";
    case GgufType::kInt8: return "int8";
    case GgufType::kUint16: return "uint16";
    case GgufType::kInt16: return "int16";
    case GgufType::kUint32: return "uint32";
    case GgufType::kInt32: return "int32";
    case GgufType::kFloat32: return "float32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kUint64: return "uint64";
    case GgufType::kInt64: return "int64";
    case GgufType::kFloat64: return "float64";
  }
  return "type " + Num(static_cast<uint32_t>(type));
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kUint16:
    case GgufType::kInt16:
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kUint64:
    case GgufType::kInt64:
      return true;
    default:
      return false;
  }
}

uint64_t GgufTensor::num_values() const {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  return dims.empty() ? 0 : n;
}

uint64_t GgufTensor::row_bytes() const {
  const GgmlTypeSize s = GgmlTypeSizeOf(type);
  return s.block_values == 0 ? 0 : cols() / s.block_values * s.block_bytes;
}

std::string GgufTensor::DimsString() const {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + Num(dims[i]);
  return s + "]";
}

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return Status::IoError("cannot stat " + path + ": " + std::strerror(e));
  }
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* m = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return Status::IoError("cannot map " + path + ": " + std::strerror(e));
    }
    f->map_ = static_cast<const uint8_t*>(m);
    f->mapped_ = true;
  }
  ::close(fd);
  KV_RETURN_IF_ERROR(f->Parse());
  return f;
}

Result<std::unique_ptr<GgufFile>> GgufFile::FromBytes(std::vector<uint8_t> bytes,
                                                     const std::string& name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = name;
  f->owned_ = std::move(bytes);
  f->map_ = f->owned_.data();
  f->size_ = f->owned_.size();
  KV_RETURN_IF_ERROR(f->Parse());
  return f;
}

GgufFile::~GgufFile() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(map_), size_);
}

std::string GgufFile::Where(uint64_t offset) const { return WhereIn(path_, offset); }

Status GgufFile::Parse() {
  Cursor c(map_, size_);
  uint64_t n_tensors = 0, n_kv = 0;
  if (const std::string e = ReadHeader(c, path_, &version_, &n_tensors, &n_kv); !e.empty()) {
    return Status::Corruption(e);
  }
  std::unordered_set<std::string> seen;
  metadata_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::pair<std::string, GgufValue> entry;
    const std::string e = ReadMetadataEntry(c, path_, k, &seen, &entry);
    if (!e.empty()) return Status::Corruption(e);
    metadata_.push_back(std::move(entry));
  }
  if (const GgufValue* a = Find("general.alignment")) {
    uint32_t al = 0;
    if (!a->is_integer() || !IntIn(*a, &al).empty() || al == 0 || (al & (al - 1)) != 0) {
      return Status::Corruption("GGUF " + path_ + ": general.alignment is not a power-of-two uint32");
    }
    alignment_ = al;
  }
  seen.clear();
  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor t;
    const std::string e = ReadTensorInfo(c, path_, k, alignment_, &seen, &t);
    if (!e.empty()) return Status::Corruption(e);
    tensors_.push_back(std::move(t));
  }
  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  for (GgufTensor& t : tensors_) {
    const uint64_t room = size_ >= data_offset_ ? size_ - data_offset_ : 0;
    if (t.offset > room || t.num_bytes > room - t.offset) {
      return Status::Corruption("GGUF " + path_ + ": tensor '" + t.name + "' " + GgmlTypeName(t.type) + " " +
                                t.DimsString() + " at data offset " + Num(t.offset) + " needs " +
                                Num(t.num_bytes) + " bytes, but the file has " + Num(room) +
                                " bytes of tensor data (truncated?)");
    }
    t.bytes = std::span<const uint8_t>(map_ + data_offset_ + t.offset, t.num_bytes);
  }
  return Status::Ok();
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  for (const auto& [k, v] : metadata_) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {

Status Missing(const std::string& path, std::string_view key) {
  return Status::NotFound("GGUF " + path + ": metadata key '" + std::string(key) + "' not found");
}
Status WrongType(const std::string& path, std::string_view key, const GgufValue& v,
                 const std::string& want) {
  std::string have = GgufTypeName(v.type);
  if (v.type == GgufType::kArray) have = "array of " + GgufTypeName(v.element_type);
  return Status::InvalidArgument("GGUF " + path + ": metadata key '" + std::string(key) + "' is " + have +
                                 ", not " + want);
}

}  // namespace

Result<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (v->type != GgufType::kString) return WrongType(path_, key, *v, "string");
  return v->str;
}

Result<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (!v->is_integer()) return WrongType(path_, key, *v, "an integer");
  int64_t out = 0;
  const std::string e = IntIn(*v, &out);
  if (!e.empty()) return Status::OutOfRange("GGUF " + path_ + ": metadata key '" + std::string(key) + "': " + e + " in int64");
  return out;
}

Result<uint32_t> GgufFile::GetU32(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (!v->is_integer()) return WrongType(path_, key, *v, "an integer");
  uint32_t out = 0;
  const std::string e = IntIn(*v, &out);
  if (!e.empty()) return Status::OutOfRange("GGUF " + path_ + ": metadata key '" + std::string(key) + "': " + e + " in uint32");
  return out;
}

Result<float> GgufFile::GetF32(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (!IsFloat(v->type)) return WrongType(path_, key, *v, "float32");
  return static_cast<float>(v->f);
}

Result<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (v->type != GgufType::kBool) return WrongType(path_, key, *v, "bool");
  return v->i != 0;
}

Result<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (v->type != GgufType::kArray || v->element_type != GgufType::kString) {
    return WrongType(path_, key, *v, "array of string");
  }
  std::vector<std::string> out;
  out.reserve(v->array.size());
  for (const GgufValue& e : v->array) out.push_back(e.str);
  return out;
}

Result<std::vector<int32_t>> GgufFile::GetI32Array(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  GgufValue probe;
  probe.type = v->element_type;
  if (v->type != GgufType::kArray || !probe.is_integer()) {
    return WrongType(path_, key, *v, "array of integers");
  }
  std::vector<int32_t> out(v->array.size());
  for (size_t k = 0; k < out.size(); ++k) {
    const std::string e = IntIn(v->array[k], &out[k]);
    if (!e.empty()) {
      return Status::OutOfRange("GGUF " + path_ + ": metadata key '" + std::string(key) + "' element " +
                                Num(k) + ": " + e + " in int32");
    }
  }
  return out;
}

Result<std::vector<float>> GgufFile::GetF32Array(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (v->type != GgufType::kArray || !IsFloat(v->element_type)) {
    return WrongType(path_, key, *v, "array of float32");
  }
  std::vector<float> out(v->array.size());
  for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<float>(v->array[k].f);
  return out;
}

Result<const GgufTensor*> GgufFile::FindTensor(std::string_view name) const {
  for (const GgufTensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return Status::NotFound("GGUF " + path_ + ": tensor '" + std::string(name) + "' not found");
}

Result<const GgufTensor*> GgufFile::FindTensor(std::string_view name,
                                               const std::vector<uint64_t>& dims) const {
  KV_ASSIGN_OR_RETURN(const GgufTensor* t, FindTensor(name));
  if (t->dims != dims) {
    GgufTensor want;
    want.dims = dims;
    return Status::Corruption("GGUF " + path_ + ": tensor '" + t->name + "' has shape " + t->DimsString() +
                              ", the model's metadata needs " + want.DimsString());
  }
  return t;
}

Result<std::vector<float>> GgufFile::ReadF32(std::string_view name,
                                             const std::vector<uint64_t>& dims) const {
  KV_ASSIGN_OR_RETURN(const GgufTensor* t, FindTensor(name, dims));
  if (!CanDequantize(t->type)) {
    return Status::Unimplemented("GGUF " + path_ + ": tensor '" + t->name + "' has type " +
                                 GgmlTypeName(t->type) + ", which this reader does not decode (" + DequantizableTypeNames() + ")");
  }
  std::vector<float> out(t->num_values());
  KV_RETURN_IF_ERROR(DequantizeRow(t->type, t->bytes.data(), out.size(), out.data()));
  return out;
}

}  // namespace kvcache::model
