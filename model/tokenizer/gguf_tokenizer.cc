// The tokenizers' FromGguf: the tokenizer.* metadata of a GGUF file into a
// BpeVocab or an SpmVocab, with errors that name the key and the file; and
// GgufTokenizer, which picks between them.
#include "model/tokenizer/gguf_tokenizer.h"

#include "model/io/gguf.h"

namespace kvcache::model {
namespace {

Status InFile(const GgufFile& file, const Status& s) {
  return Status(s.code(), "GGUF tokenizer in " + file.path() + ": " + s.message());
}

// The keys both kinds read beside the tokens: token_type, bos/eos_token_id
// (checked against the tokens), add_bos_token and chat_template, each left
// as it is when absent.
Status ReadCommonKeys(const GgufFile& file, VocabBase* out) {
  if (file.Find("tokenizer.ggml.token_type") != nullptr) {
    auto types = file.GetI32Array("tokenizer.ggml.token_type");
    if (!types.ok()) return InFile(file, types.status());
    out->token_types = std::move(types).value();
  }
  const size_t n_tokens = out->tokens.size();
  for (auto [key, dst] : {std::pair{"tokenizer.ggml.bos_token_id", &out->bos_id},
                          std::pair{"tokenizer.ggml.eos_token_id", &out->eos_id}}) {
    if (file.Find(key) == nullptr) continue;
    auto id = file.GetU32(key);
    if (!id.ok()) return InFile(file, id.status());
    if (*id >= n_tokens) {
      return Status::Corruption("GGUF tokenizer in " + file.path() + ": " + key + " = " +
                                std::to_string(*id) + " is outside the vocabulary of " +
                                std::to_string(n_tokens));
    }
    *dst = static_cast<int32_t>(*id);
  }
  if (file.Find("tokenizer.ggml.add_bos_token") != nullptr) {
    auto add = file.GetBool("tokenizer.ggml.add_bos_token");
    if (!add.ok()) return InFile(file, add.status());
    out->add_bos = *add;
  }
  if (file.Find("tokenizer.chat_template") != nullptr) {
    auto tmpl = file.GetString("tokenizer.chat_template");
    if (!tmpl.ok()) return InFile(file, tmpl.status());
    out->chat_template = std::move(tmpl).value();
  }
  return Status::Ok();
}

// A list of strings under `key` into *out.
Status ReadStrings(const GgufFile& file, std::string_view key, std::vector<std::string>* out) {
  auto v = file.GetStringArray(key);
  if (!v.ok()) return InFile(file, v.status());
  *out = std::move(v).value();
  return Status::Ok();
}

// Tokenizer::Create(v), its error naming the file.
template <typename Tokenizer, typename Vocab>
Result<Tokenizer> CreateInFile(const GgufFile& file, Vocab v) {
  auto t = Tokenizer::Create(std::move(v));
  if (!t.ok()) return InFile(file, t.status());
  return t;
}

// tokenizer.ggml.model, which must be `want` (Unimplemented otherwise).
Status CheckModel(const GgufFile& file, std::string_view want, std::string_view kind) {
  auto model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) return InFile(file, model.status());
  if (*model != want) {
    return Status::Unimplemented("GGUF tokenizer in " + file.path() +
                                 ": tokenizer.ggml.model is '" + *model + "'; only '" +
                                 std::string(want) + "' (" + std::string(kind) +
                                 ") is supported here");
  }
  return Status::Ok();
}

}  // namespace

Result<BpeTokenizer> BpeTokenizer::FromGguf(const GgufFile& file) {
  KV_RETURN_IF_ERROR(CheckModel(file, "gpt2", "byte-level BPE"));
  BpeVocab v;
  KV_RETURN_IF_ERROR(ReadStrings(file, "tokenizer.ggml.tokens", &v.tokens));
  KV_RETURN_IF_ERROR(ReadStrings(file, "tokenizer.ggml.merges", &v.merges));
  auto pre = file.GetString("tokenizer.ggml.pre");
  if (!pre.ok()) return InFile(file, pre.status());
  v.pre = std::move(pre).value();
  KV_RETURN_IF_ERROR(ReadCommonKeys(file, &v));
  return CreateInFile<BpeTokenizer>(file, std::move(v));
}

namespace {

Result<SpmTokenizer> SpmFromGguf(const GgufFile& file) {
  KV_RETURN_IF_ERROR(CheckModel(file, "llama", "SentencePiece"));
  SpmVocab v;
  KV_RETURN_IF_ERROR(ReadStrings(file, "tokenizer.ggml.tokens", &v.tokens));
  if (file.Find("tokenizer.ggml.scores") != nullptr) {
    auto scores = file.GetF32Array("tokenizer.ggml.scores");
    if (!scores.ok()) return InFile(file, scores.status());
    v.scores = std::move(scores).value();
  }
  // llama.cpp's defaults for a SentencePiece vocabulary.
  if (v.tokens.size() > 2) {
    v.bos_id = 1;
    v.eos_id = 2;
  }
  v.add_bos = true;
  v.add_space_prefix = true;
  KV_RETURN_IF_ERROR(ReadCommonKeys(file, &v));
  if (file.Find("tokenizer.ggml.add_space_prefix") != nullptr) {
    auto add = file.GetBool("tokenizer.ggml.add_space_prefix");
    if (!add.ok()) return InFile(file, add.status());
    v.add_space_prefix = *add;
  }
  return CreateInFile<SpmTokenizer>(file, std::move(v));
}

}  // namespace

Result<GgufTokenizer> GgufTokenizer::FromGguf(const GgufFile& file) {
  auto model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) return InFile(file, model.status());
  if (*model == "gpt2") {
    KV_ASSIGN_OR_RETURN(BpeTokenizer t, BpeTokenizer::FromGguf(file));
    return GgufTokenizer(std::move(t));
  }
  if (*model == "llama") {
    KV_ASSIGN_OR_RETURN(SpmTokenizer t, SpmFromGguf(file));
    return GgufTokenizer(std::move(t));
  }
  return Status::Unimplemented("GGUF tokenizer in " + file.path() + ": tokenizer.ggml.model is '" +
                               *model + "'; supported: 'gpt2' (byte-level BPE), 'llama' "
                               "(SentencePiece)");
}

}  // namespace kvcache::model
