// LoadedModel: choosing the loader and the tokenizer.
#include "model/decoder/loaded_model.h"

#include "model/tokenizer/chat_template.h"

namespace kvcache::model {

Result<std::unique_ptr<LoadedModel>> LoadedModel::Load(const std::string& model_path,
                                                       const std::string& tokenizer_path,
                                                       const GgufLoadOptions& options) {
  if (IsGgufFile(model_path)) {
    KV_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, GgufFile::Open(model_path));
    std::shared_ptr<const GgufFile> file(std::move(f));
    KV_ASSIGN_OR_RETURN(GgufTokenizer tok, GgufTokenizer::FromGguf(*file));
    KV_ASSIGN_OR_RETURN(Model m, ModelFromGguf(file, options));
    if (tok.vocab_size() != m.config().vocab_size) {
      return Status::Corruption("GGUF " + model_path + ": the tokenizer has " +
                                std::to_string(tok.vocab_size()) + " tokens, the model " +
                                std::to_string(m.config().vocab_size));
    }
    std::unique_ptr<LoadedModel> out(new LoadedModel(std::move(m)));
    out->bpe_.emplace(std::move(tok));
    return out;
  }
  if (tokenizer_path.empty()) {
    return Status::InvalidArgument(model_path +
                                   " is not a GGUF file; a llama2.c checkpoint needs --tokenizer");
  }
  KV_ASSIGN_OR_RETURN(Model m, LoadModel(model_path));
  KV_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::Load(tokenizer_path, m.config().vocab_size));
  std::unique_ptr<LoadedModel> out(new LoadedModel(std::move(m)));
  out->llama2c_.emplace(std::move(tok));
  return out;
}

Result<std::vector<int32_t>> LoadedModel::Encode(std::string_view text, bool parse_special) const {
  if (llama2c_) return llama2c_->Encode(text);
  BpeEncodeOptions o;
  o.bos = bpe_->add_bos();
  o.parse_special = parse_special;
  return bpe_->Encode(text, o);
}

Result<std::vector<int32_t>> LoadedModel::EncodeChat(std::string_view user_message) const {
  const ChatMessage messages[] = {{"user", std::string(user_message)}};
  return EncodeChat(messages);
}

Result<std::vector<int32_t>> LoadedModel::EncodeChat(std::span<const ChatMessage> messages) const {
  KV_ASSIGN_OR_RETURN(ChatTemplate t, Template());
  KV_RETURN_IF_ERROR(t.Check(messages));
  BpeEncodeOptions o;
  o.parse_special = true;
  return bpe_->Encode(t.Render(messages, /*add_generation_prompt=*/true), o);
}

Result<ChatTemplate> LoadedModel::Template() const {
  if (!bpe_) return Status::Unimplemented("chat needs a GGUF model with a chat template");
  // A Gemma file without a template (the base models) gets Gemma's format.
  if (bpe_->chat_template().empty() && model_.config().family == ModelFamily::kGemma3) {
    return ChatTemplate::Gemma();
  }
  return ChatTemplate::FromJinja(bpe_->chat_template());
}

Result<std::string> LoadedModel::Decode(std::span<const int32_t> ids) const {
  if (llama2c_) return llama2c_->Decode(ids);
  return bpe_->Decode(ids);
}

Result<std::string> LoadedModel::DecodePiece(int32_t prev, int32_t t) const {
  if (llama2c_) return llama2c_->DecodeToken(prev, t);
  return bpe_->DecodeToken(t);
}

std::vector<int32_t> LoadedModel::stop_tokens() const {
  if (llama2c_) return {kBosToken, kEosToken};
  std::vector<int32_t> out;
  if (bpe_->eos_id() >= 0) out.push_back(bpe_->eos_id());
  if (bpe_->bos_id() >= 0 && bpe_->bos_id() != bpe_->eos_id()) out.push_back(bpe_->bos_id());
  // Gemma ends a turn with <end_of_turn>: a generation ends there too.
  if (model_.config().family == ModelFamily::kGemma3) {
    if (auto end_of_turn = bpe_->SpecialId("<end_of_turn>"); end_of_turn.ok()) out.push_back(*end_of_turn);
  }
  return out;
}

}  // namespace kvcache::model
