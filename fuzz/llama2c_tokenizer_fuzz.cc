// Fuzz target `llama2c_tokenizer`: model::Tokenizer::Parse on arbitrary
// bytes (model/tokenizer/tokenizer.cc), then Encode / Decode on arbitrary text.
// Input: byte 0 picks vocab_size = 259 + byte 0 (the model supplies it in
// real use); the rest is the tokenizer file. When it parses, fixed texts
// and the input's last 64 bytes (any bytes, invalid UTF-8 included) are
// encoded; every id must be inside the vocabulary and decode without
// error, and ids outside it must be refused. Thread safety: fuzz_target.h.
#include <algorithm>
#include <span>
#include <string>
#include <string_view>

#include "fuzz/fuzz_target.h"
#include "model/tokenizer/tokenizer.h"

KVCACHE_FUZZ_TARGET(llama2c_tokenizer) {
  using namespace kvcache;
  if (size < 1) return 0;
  const uint32_t vocab = 259 + data[0];
  auto t = model::Tokenizer::Parse(std::span<const uint8_t>(data + 1, size - 1), vocab);
  if (!t.ok()) {
    FUZZ_CHECK(t.status().code() == StatusCode::kCorruption ||
               t.status().code() == StatusCode::kInvalidArgument);
    return 0;
  }
  FUZZ_CHECK(t->vocab_size() == vocab);
  const size_t tail = std::min<size_t>(64, size - 1);
  const std::string texts[] = {
      "", " ", "Once upon a time", "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80z", "\xff\xfe\x80",
      std::string(reinterpret_cast<const char*>(data + size - tail), tail)};
  for (const std::string& text : texts) {
    for (bool bos : {false, true}) {
      const std::vector<int32_t> ids = t->Encode(text, {.bos = bos, .eos = true});
      for (int32_t id : ids) FUZZ_CHECK(id >= 0 && static_cast<uint32_t>(id) < vocab);
      auto decoded = t->Decode(ids);
      FUZZ_CHECK(decoded.ok());
    }
  }
  FUZZ_CHECK(!t->DecodeToken(1, -1).ok());
  FUZZ_CHECK(!t->DecodeToken(1, static_cast<int32_t>(vocab)).ok());
  for (uint32_t id = 0; id < vocab; ++id) {
    FUZZ_CHECK(t->DecodeToken(1, static_cast<int32_t>(id)).ok());
    FUZZ_CHECK(t->DecodeToken(static_cast<int32_t>(id), static_cast<int32_t>(id)).ok());
  }
  return 0;
}
