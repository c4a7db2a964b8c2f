// BpeTokenizer::FromGguf: the tokenizer.* metadata of a GGUF file into a
// BpeVocab, with errors that name the key and the file.
#include "model/io/gguf.h"
#include "model/tokenizer/bpe_tokenizer.h"

namespace kvcache::model {
namespace {

Status InFile(const GgufFile& file, const Status& s) {
  return Status(s.code(), "GGUF tokenizer in " + file.path() + ": " + s.message());
}

}  // namespace

Result<BpeTokenizer> BpeTokenizer::FromGguf(const GgufFile& file) {
  auto model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) return InFile(file, model.status());
  if (*model != "gpt2") {
    return Status::Unimplemented("GGUF tokenizer in " + file.path() +
                                 ": tokenizer.ggml.model is '" + *model +
                                 "'; only 'gpt2' (byte-level BPE) is supported here");
  }
  BpeVocab v;
  auto tokens = file.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) return InFile(file, tokens.status());
  v.tokens = std::move(tokens).value();
  auto merges = file.GetStringArray("tokenizer.ggml.merges");
  if (!merges.ok()) return InFile(file, merges.status());
  v.merges = std::move(merges).value();
  auto pre = file.GetString("tokenizer.ggml.pre");
  if (!pre.ok()) return InFile(file, pre.status());
  v.pre = std::move(pre).value();
  if (file.Find("tokenizer.ggml.token_type") != nullptr) {
    auto types = file.GetI32Array("tokenizer.ggml.token_type");
    if (!types.ok()) return InFile(file, types.status());
    v.token_types = std::move(types).value();
  }
  for (auto [key, dst] : {std::pair{"tokenizer.ggml.bos_token_id", &v.bos_id},
                          std::pair{"tokenizer.ggml.eos_token_id", &v.eos_id}}) {
    if (file.Find(key) == nullptr) continue;
    auto id = file.GetU32(key);
    if (!id.ok()) return InFile(file, id.status());
    if (*id >= v.tokens.size()) {
      return Status::Corruption("GGUF tokenizer in " + file.path() + ": " + key + " = " +
                                std::to_string(*id) + " is outside the vocabulary of " +
                                std::to_string(v.tokens.size()));
    }
    *dst = static_cast<int32_t>(*id);
  }
  if (file.Find("tokenizer.ggml.add_bos_token") != nullptr) {
    auto add = file.GetBool("tokenizer.ggml.add_bos_token");
    if (!add.ok()) return InFile(file, add.status());
    v.add_bos = *add;
  }
  if (file.Find("tokenizer.chat_template") != nullptr) {
    auto tmpl = file.GetString("tokenizer.chat_template");
    if (!tmpl.ok()) return InFile(file, tmpl.status());
    v.chat_template = std::move(tmpl).value();
  }
  auto t = Create(std::move(v));
  if (!t.ok()) return InFile(file, t.status());
  return t;
}

}  // namespace kvcache::model
