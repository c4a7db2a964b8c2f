// VocabSpecials: the special-token checks both GGUF tokenizers make.
#include "model/tokenizer/vocab_base.h"

namespace kvcache::model {

Status VocabSpecials::TakeSpecials(VocabBase& vocab, std::string_view kind) {
  const size_t n = vocab.tokens.size();
  for (int32_t id : {vocab.bos_id, vocab.eos_id}) {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      return Status::Corruption(std::string(kind) + " special token id " + std::to_string(id) +
                                " is outside the vocabulary of " + std::to_string(n));
    }
  }
  bos_id_ = vocab.bos_id;
  eos_id_ = vocab.eos_id;
  add_bos_ = vocab.add_bos;
  chat_template_ = std::move(vocab.chat_template);
  return Status::Ok();
}

Result<std::vector<int32_t>> VocabSpecials::BeginIds(std::string_view kind, size_t text_bytes,
                                                      size_t max_bytes,
                                                      const TextEncodeOptions& options) const {
  if (text_bytes > max_bytes) {
    return Status::InvalidArgument(std::string(kind) + " text of " + std::to_string(text_bytes) +
                                   " bytes is longer than the limit of " +
                                   std::to_string(max_bytes));
  }
  if ((options.bos && bos_id_ < 0) || (options.eos && eos_id_ < 0)) {
    return Status::InvalidArgument(std::string(kind) + " vocabulary has no " +
                                   (options.bos && bos_id_ < 0 ? "BOS" : "EOS") + " token");
  }
  std::vector<int32_t> ids;
  ids.reserve(text_bytes / 3 + 2);
  if (options.bos) ids.push_back(bos_id_);
  return ids;
}

Status VocabSpecials::CheckId(int32_t id, uint32_t vocab_size, size_t position) {
  if (id >= 0 && static_cast<uint32_t>(id) < vocab_size) return Status::Ok();
  return Status::InvalidArgument(
      "token id " + std::to_string(id) +
      (position == SIZE_MAX ? std::string() : " at position " + std::to_string(position)) +
      " is outside the vocabulary of " + std::to_string(vocab_size));
}

}  // namespace kvcache::model
