// Fuzz target `gguf`: model::GgufFile::FromBytes on arbitrary bytes
// (model/io/gguf.cc), then everything a loader does with an accepted file:
// every metadata accessor on every key, every tensor dequantized
// (model/tensor/gguf_dequant.cc, bounded) with the SIMD result bit-identical to the
// scalar reference (NaN payloads aside: a NaN scale gives NaN either way),
// and the tokenizer built from the metadata (byte-level BPE or
// SentencePiece, model/tokenizer/gguf_tokenizer.cc) encoding and decoding the input's last bytes.
// Properties: a refused file is Corruption / InvalidArgument / Unimplemented /
// NotFound / OutOfRange, never Internal; an accepted tensor's bytes are
// exactly num_bytes; ids the tokenizer returns are inside its vocabulary and
// decode. Thread safety: see fuzz_target.h.
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "fuzz/fuzz_target.h"
#include "model/io/gguf.h"
#include "model/tensor/gguf_dequant.h"
#include "model/tokenizer/gguf_tokenizer.h"

namespace {
using kvcache::StatusCode;

bool Expected(StatusCode c) {
  return c == StatusCode::kCorruption || c == StatusCode::kInvalidArgument ||
         c == StatusCode::kUnimplemented || c == StatusCode::kNotFound ||
         c == StatusCode::kOutOfRange;
}
}  // namespace

KVCACHE_FUZZ_TARGET(gguf) {
  using namespace kvcache;
  using namespace kvcache::model;
  auto file = GgufFile::FromBytes(std::vector<uint8_t>(data, data + size), "fuzz.gguf");
  if (!file.ok()) {
    FUZZ_CHECK(Expected(file.status().code()));
    return 0;
  }
  const GgufFile& f = **file;
  for (const auto& [key, value] : f.metadata()) {
    (void)value;
    FUZZ_CHECK(f.Find(key) != nullptr);
    // Each accessor either gives a value or a typed error; none may crash.
    auto s = f.GetString(key);
    auto u = f.GetU32(key);
    auto i = f.GetInt(key);
    auto x = f.GetF32(key);
    auto b = f.GetBool(key);
    auto sa = f.GetStringArray(key);
    auto ia = f.GetI32Array(key);
    auto fa = f.GetF32Array(key);
    for (const Status* st : {&s.status(), &u.status(), &i.status(), &x.status(), &b.status(),
                             &sa.status(), &ia.status(), &fa.status()}) {
      FUZZ_CHECK(st->ok() || st->code() != StatusCode::kInternal);
    }
  }
  size_t budget = size_t{1} << 16;  // values dequantized per input
  std::vector<float> simd, scalar;
  for (const GgufTensor& t : f.tensors()) {
    FUZZ_CHECK(t.bytes.size() == t.num_bytes);
    if (!CanDequantize(t.type) || t.cols() == 0) continue;
    const uint64_t rows = t.rows(), cols = t.cols();
    FUZZ_CHECK(rows * t.row_bytes() == t.num_bytes);
    for (uint64_t r = 0; r < rows && budget >= cols; ++r, budget -= cols) {
      simd.assign(cols, 0.0f);
      scalar.assign(cols, 1.0f);
      const uint8_t* src = t.bytes.data() + r * t.row_bytes();
      const Status a = DequantizeRow(t.type, src, cols, simd.data());
      const Status c = DequantizeRowScalar(t.type, src, cols, scalar.data());
      FUZZ_CHECK(a.ok() == c.ok());
      if (!a.ok()) continue;
      for (uint64_t k = 0; k < cols; ++k) {
        uint32_t x, y;
        std::memcpy(&x, &simd[k], 4);
        std::memcpy(&y, &scalar[k], 4);
        const bool both_nan = simd[k] != simd[k] && scalar[k] != scalar[k];  // payloads may differ
        FUZZ_CHECK_MSG(x == y || both_nan, "%s value %llu of %s: SIMD 0x%08x, scalar 0x%08x",
                       GgmlTypeName(t.type).c_str(), static_cast<unsigned long long>(k),
                       t.name.c_str(), x, y);
      }
    }
  }
  auto tok = GgufTokenizer::FromGguf(f);
  if (!tok.ok()) {
    FUZZ_CHECK(Expected(tok.status().code()));
    return 0;
  }
  const std::string_view text(reinterpret_cast<const char*>(data) + (size > 64 ? size - 64 : 0),
                              size > 64 ? 64 : size);
  for (bool special : {false, true}) {
    BpeEncodeOptions o;
    o.parse_special = special;
    auto ids = tok->Encode(text, o);
    if (!ids.ok()) {
      FUZZ_CHECK(ids.status().code() == StatusCode::kInvalidArgument);
      continue;
    }
    for (int32_t id : *ids) FUZZ_CHECK(id >= 0 && static_cast<uint32_t>(id) < tok->vocab_size());
    FUZZ_CHECK(tok->Decode(*ids).ok());
  }
  return 0;
}
