// NPY reader/writer: see include/kvcache/npy.h.
//
// File layout: "\x93NUMPY", major, minor, header length (uint16 LE for 1.0,
// uint32 LE for 2.0/3.0), then an ASCII (3.0: UTF-8) Python dict literal
// {'descr': '<f4', 'fortran_order': False, 'shape': (T, H, D), } padded with
// spaces to a multiple of 64 bytes and ended by '\n', then the raw data.
#include "kvcache/npy.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <variant>

#include "kvcache/float16.h"

namespace kvcache {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr uint64_t kMaxElements = uint64_t{1} << 40;

// f16 for a float, as FloatToF16 (kvcache/float16.h) except that every NaN
// is written as the canonical quiet NaN of its sign.
uint16_t FloatToHalf(float f) {
  if (std::isnan(f)) return std::signbit(f) ? 0xFE00 : 0x7E00;
  return FloatToF16(f);
}

// --- a tiny parser for the header's Python dict literal ---
struct Tuple {
  std::vector<uint64_t> items;
};
using Value = std::variant<std::string, bool, Tuple>;

class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : s_(text) {}

  Result<std::map<std::string, Value>> ParseDict() {
    std::map<std::string, Value> dict;
    SkipSpace();
    if (!Eat('{')) return Error("expected '{'");
    SkipSpace();
    while (!Eat('}')) {
      KV_ASSIGN_OR_RETURN(std::string key, ParseString());
      SkipSpace();
      if (!Eat(':')) return Error("expected ':' after key");
      KV_ASSIGN_OR_RETURN(Value value, ParseValue());
      if (!dict.emplace(key, std::move(value)).second) return Error("duplicate key '" + key + "'");
      SkipSpace();
      if (Eat(',')) {
        SkipSpace();
        continue;
      }
      SkipSpace();
      if (!Eat('}')) return Error("expected ',' or '}'");
      break;
    }
    SkipSpace();
    if (pos_ != s_.size()) return Error("trailing characters after the dict");
    return dict;
  }

 private:
  Status Error(const std::string& what) const {
    return Status::Corruption(fmt::format("npy header: {} at offset {} in \"{}\"", what, pos_, s_));
  }
  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool Eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool EatWord(std::string_view w) {
    if (s_.substr(pos_, w.size()) == w) {
      pos_ += w.size();
      return true;
    }
    return false;
  }
  Result<std::string> ParseString() {
    SkipSpace();
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) return Error("expected a quoted string");
    const char quote = s_[pos_++];
    const size_t end = s_.find(quote, pos_);
    if (end == std::string_view::npos) return Error("unterminated string");
    std::string out(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return out;
  }
  Result<Value> ParseValue() {
    SkipSpace();
    if (pos_ >= s_.size()) return Error("expected a value");
    const char c = s_[pos_];
    if (c == '\'' || c == '"') {
      KV_ASSIGN_OR_RETURN(std::string str, ParseString());
      return Value(std::move(str));
    }
    if (EatWord("True")) return Value(true);
    if (EatWord("False")) return Value(false);
    if (Eat('(')) {
      Tuple t;
      SkipSpace();
      while (!Eat(')')) {
        KV_ASSIGN_OR_RETURN(uint64_t n, ParseInt());
        t.items.push_back(n);
        SkipSpace();
        if (Eat(',')) {
          SkipSpace();
          continue;
        }
        if (!Eat(')')) return Error("expected ',' or ')' in shape");
        break;
      }
      return Value(std::move(t));
    }
    return Error("unexpected character");
  }
  Result<uint64_t> ParseInt() {
    SkipSpace();
    const size_t start = pos_;
    uint64_t n = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      const uint64_t digit = static_cast<uint64_t>(s_[pos_] - '0');
      if (n > (std::numeric_limits<uint64_t>::max() - digit) / 10) return Error("shape value too large");
      n = n * 10 + digit;
      ++pos_;
    }
    if (pos_ == start) return Error("expected a non-negative integer in shape");
    if (pos_ < s_.size() && s_[pos_] == 'L') ++pos_;  // Python 2 long suffix
    return n;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

uint32_t ReadLe(const uint8_t* p, int n) {
  uint32_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

uint64_t NpyArray::num_elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

Result<NpyArray> ParseNpy(std::span<const uint8_t> bytes) {
  if (bytes.size() < kMagicLen + 2 || std::memcmp(bytes.data(), kMagic, kMagicLen) != 0) {
    return Status::Corruption("npy: bad magic (not a .npy file)");
  }
  const uint8_t major = bytes[6], minor = bytes[7];
  if (major < 1 || major > 3) {
    return Status::InvalidArgument(fmt::format("npy: unsupported format version {}.{}", major, minor));
  }
  const size_t len_bytes = major == 1 ? 2 : 4;
  const size_t prefix = kMagicLen + 2 + len_bytes;
  if (bytes.size() < prefix) return Status::Corruption("npy: truncated header length");
  const uint64_t header_len = ReadLe(bytes.data() + kMagicLen + 2, static_cast<int>(len_bytes));
  if (bytes.size() - prefix < header_len) {
    return Status::Corruption(fmt::format("npy: truncated header ({} bytes declared, {} present)",
                                          header_len, bytes.size() - prefix));
  }
  std::string_view header(reinterpret_cast<const char*>(bytes.data() + prefix), header_len);
  KV_ASSIGN_OR_RETURN(auto dict, HeaderParser(header).ParseDict());

  auto descr_it = dict.find("descr");
  auto fortran_it = dict.find("fortran_order");
  auto shape_it = dict.find("shape");
  if (descr_it == dict.end() || fortran_it == dict.end() || shape_it == dict.end() || dict.size() != 3) {
    return Status::Corruption(
        "npy header: needs exactly the keys 'descr', 'fortran_order' and 'shape'");
  }
  const auto* descr = std::get_if<std::string>(&descr_it->second);
  const auto* fortran = std::get_if<bool>(&fortran_it->second);
  const auto* shape = std::get_if<Tuple>(&shape_it->second);
  if (descr == nullptr || fortran == nullptr || shape == nullptr) {
    return Status::Corruption("npy header: 'descr' must be a string, 'fortran_order' a bool, 'shape' a tuple");
  }
  NpyArray out;
  size_t elem_bytes;
  if (*descr == "<f4") {
    out.stored_dtype = NpyDtype::kF32;
    elem_bytes = 4;
  } else if (*descr == "<f2") {
    out.stored_dtype = NpyDtype::kF16;
    elem_bytes = 2;
  } else {
    return Status::InvalidArgument(fmt::format(
        "npy: unsupported dtype '{}' (only little-endian float32 '<f4' and float16 '<f2')", *descr));
  }
  if (*fortran) {
    return Status::InvalidArgument("npy: fortran_order arrays are not supported (save in C order)");
  }
  out.shape = shape->items;
  uint64_t n = 1;
  for (uint64_t d : out.shape) {
    if (d != 0 && n > kMaxElements / d) {
      return Status::InvalidArgument("npy: array too large");
    }
    n *= d;
  }
  const uint64_t data_bytes = n * elem_bytes;
  const uint64_t present = bytes.size() - prefix - header_len;
  if (present < data_bytes) {
    return Status::Corruption(fmt::format("npy: truncated data ({} bytes for shape with {} elements, {} present)",
                                          data_bytes, n, present));
  }
  if (present > data_bytes) {
    return Status::Corruption(fmt::format("npy: {} unexpected bytes after the data", present - data_bytes));
  }
  const uint8_t* p = bytes.data() + prefix + header_len;
  out.data.resize(n);
  if (elem_bytes == 4) {
    for (uint64_t i = 0; i < n; ++i) out.data[i] = std::bit_cast<float>(ReadLe(p + 4 * i, 4));
  } else {
    for (uint64_t i = 0; i < n; ++i) out.data[i] = F16ToFloat(static_cast<uint16_t>(ReadLe(p + 2 * i, 2)));
  }
  return out;
}

Result<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError(fmt::format("npy: cannot open '{}'", path));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::IoError(fmt::format("npy: error reading '{}'", path));
  auto parsed = ParseNpy(bytes);
  if (!parsed.ok()) {
    return Status(parsed.status().code(), fmt::format("{}: {}", path, parsed.status().message()));
  }
  return parsed;
}

Result<std::vector<uint8_t>> EncodeNpy(std::span<const uint64_t> shape, std::span<const float> data,
                                       const NpyWriteOptions& options) {
  if (options.major_version < 1 || options.major_version > 3) {
    return Status::InvalidArgument(fmt::format("npy: cannot write version {}", options.major_version));
  }
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  if (n != data.size()) {
    return Status::InvalidArgument(fmt::format("npy: shape holds {} elements, data has {}", n, data.size()));
  }
  std::string dims;  // "3, 4" or "3," (a one-element tuple) or "" (a scalar)
  for (size_t i = 0; i < shape.size(); ++i) dims += fmt::format("{}{}", i ? ", " : "", shape[i]);
  if (shape.size() == 1) dims += ",";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}",
                                   options.dtype == NpyDtype::kF32 ? "<f4" : "<f2", dims);
  const size_t len_bytes = options.major_version == 1 ? 2 : 4;
  const size_t prefix = kMagicLen + 2 + len_bytes;
  const size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.append(total - prefix - header.size() - 1, ' ');
  header.push_back('\n');
  if (len_bytes == 2 && header.size() > 0xFFFF) {
    return Status::InvalidArgument("npy: header too long for version 1.0 (write version 2)");
  }
  std::vector<uint8_t> out(kMagic, kMagic + kMagicLen);
  out.push_back(options.major_version);
  out.push_back(0);
  for (size_t i = 0; i < len_bytes; ++i) out.push_back(static_cast<uint8_t>(header.size() >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  for (float f : data) {
    const uint32_t bits = options.dtype == NpyDtype::kF32 ? std::bit_cast<uint32_t>(f) : FloatToHalf(f);
    const size_t nb = options.dtype == NpyDtype::kF32 ? 4 : 2;
    for (size_t i = 0; i < nb; ++i) out.push_back(static_cast<uint8_t>(bits >> (8 * i)));
  }
  return out;
}

Status WriteNpy(const std::string& path, std::span<const uint64_t> shape, std::span<const float> data,
                const NpyWriteOptions& options) {
  KV_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, EncodeNpy(shape, data, options));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::IoError(fmt::format("npy: cannot create '{}'", path));
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return Status::IoError(fmt::format("npy: error writing '{}'", path));
  return Status::Ok();
}

}  // namespace kvcache
