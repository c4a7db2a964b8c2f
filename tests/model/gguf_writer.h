// A small GGUF writer for tests: builds good files from metadata and
// tensors, and broken ones through the override fields (a wrong offset,
// type or dims) or by editing/truncating the bytes it returns.
// Not thread-safe; one writer per test.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "model/io/gguf.h"

namespace kvcache::model::testing {

class GgufWriter {
 public:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;  // GGUF order
    uint32_t type = 0;           // GgmlType code
    std::vector<uint8_t> data;
    int64_t offset_override = -1;  // written instead of the computed offset
  };

  // Raw metadata: key, type code, then the encoded value bytes.
  void KvRaw(std::string_view key, uint32_t type, const std::vector<uint8_t>& value) {
    Str(kv_, key);
    Pod(kv_, type);
    kv_.insert(kv_.end(), value.begin(), value.end());
    ++n_kv_;
  }
  void KvU32(std::string_view key, uint32_t v) { KvRaw(key, 4, Bytes(v)); }
  void KvI32(std::string_view key, int32_t v) { KvRaw(key, 5, Bytes(v)); }
  void KvU64(std::string_view key, uint64_t v) { KvRaw(key, 10, Bytes(v)); }
  void KvF32(std::string_view key, float v) { KvRaw(key, 6, Bytes(v)); }
  void KvF64(std::string_view key, double v) { KvRaw(key, 12, Bytes(v)); }
  void KvBool(std::string_view key, bool v) { KvRaw(key, 7, {static_cast<uint8_t>(v)}); }
  void KvStr(std::string_view key, std::string_view v) {
    std::vector<uint8_t> b;
    Str(b, v);
    KvRaw(key, 8, b);
  }
  void KvStrArray(std::string_view key, const std::vector<std::string>& v) { KvArray(key, 8, v); }
  void KvI32Array(std::string_view key, const std::vector<int32_t>& v) { KvArray(key, 5, v); }
  void KvF32Array(std::string_view key, const std::vector<float>& v) { KvArray(key, 6, v); }

  void AddTensor(Tensor t) { tensors_.push_back(std::move(t)); }

  // The whole file. Tensors are laid out in order at `alignment` boundaries.
  std::vector<uint8_t> Build(uint32_t version = 3, uint32_t alignment = 32) const {
    std::vector<uint8_t> out;
    Pod(out, uint32_t{0x46554747});
    Pod(out, version);
    Pod(out, uint64_t{tensors_.size()});
    Pod(out, n_kv_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    uint64_t off = 0;
    std::vector<uint64_t> offsets;
    for (const Tensor& t : tensors_) {
      Str(out, t.name);
      Pod(out, static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) Pod(out, d);
      Pod(out, t.type);
      offsets.push_back(off);
      Pod(out, t.offset_override >= 0 ? static_cast<uint64_t>(t.offset_override) : off);
      off += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    while (out.size() % alignment != 0) out.push_back(0);
    const size_t base = out.size();
    for (size_t k = 0; k < tensors_.size(); ++k) {
      out.resize(base + offsets[k], 0);
      out.insert(out.end(), tensors_[k].data.begin(), tensors_[k].data.end());
    }
    return out;
  }

  template <class T>
  static std::vector<uint8_t> Bytes(T v) {
    std::vector<uint8_t> b(sizeof v);
    std::memcpy(b.data(), &v, sizeof v);
    return b;
  }
  template <class T>
  static void Pod(std::vector<uint8_t>& b, T v) {
    const auto x = Bytes(v);
    b.insert(b.end(), x.begin(), x.end());
  }
  static void Str(std::vector<uint8_t>& b, std::string_view s) {
    Pod(b, uint64_t{s.size()});
    b.insert(b.end(), s.begin(), s.end());
  }

 private:
  // An array value: element type code, count, then each element.
  template <typename T>
  void KvArray(std::string_view key, uint32_t element_type, const std::vector<T>& v) {
    std::vector<uint8_t> b;
    Pod(b, element_type);
    Pod(b, uint64_t{v.size()});
    for (const T& x : v) {
      if constexpr (std::is_same_v<T, std::string>) {
        Str(b, x);
      } else {
        Pod(b, x);
      }
    }
    KvRaw(key, 9, b);
  }

  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

// Writes bytes to `path` (overwriting); false on failure.
inline bool WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  // An empty vector's data() may be null, which fwrite must not be given.
  const bool ok = bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace kvcache::model::testing
