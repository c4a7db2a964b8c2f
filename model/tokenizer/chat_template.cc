// ChatML: template recognition by exact match, rendering by concatenation;
// Gemma's turns the same way.
#include "model/tokenizer/chat_template.h"

namespace kvcache::model {

using namespace chatml;

ChatTemplate ChatTemplate::ChatMl(std::string default_system) {
  ChatTemplate t;
  t.has_default_system_ = !default_system.empty();
  t.default_system_ = std::move(default_system);
  return t;
}

ChatTemplate ChatTemplate::Gemma() {
  ChatTemplate t;
  t.kind_ = Kind::kGemma;
  return t;
}

Result<ChatTemplate> ChatTemplate::FromJinja(std::string_view jinja) {
  auto unsupported = [&] {
    std::string head(jinja.substr(0, 80));
    return Status::Unimplemented(
        "chat template is not one of the ChatML forms this project renders (it starts \"" + head +
        "\"); only <|im_start|>role\\n...<|im_end|> templates are supported");
  };
  if (!jinja.starts_with(kLoopOpen)) return unsupported();
  std::string_view rest = jinja.substr(kLoopOpen.size());
  if (rest == kBody) return ChatMl("");
  if (!rest.starts_with(kDefaultOpen)) return unsupported();
  rest.remove_prefix(kDefaultOpen.size());
  const size_t close = rest.find(kDefaultClose);
  if (close == std::string_view::npos || rest.substr(close + kDefaultClose.size()) != kBody) {
    return unsupported();
  }
  const std::string_view system = rest.substr(0, close);
  if (system.empty() || system.find_first_of("'\\") != std::string_view::npos ||
      system.find("<|") != std::string_view::npos) {
    return unsupported();
  }
  return ChatMl(std::string(system));
}

namespace {

// Gemma's first message of role "system" opens the first turn instead.
bool LeadingSystem(std::span<const ChatMessage> messages) {
  return !messages.empty() && messages[0].role == "system";
}

std::string_view Trimmed(std::string_view s) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t begin = s.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(kSpace) - begin + 1);
}

}  // namespace

Status ChatTemplate::Check(std::span<const ChatMessage> messages) const {
  if (kind_ == Kind::kChatMl) return Status::Ok();
  const size_t first = LeadingSystem(messages) ? 1 : 0;
  for (size_t i = first; i < messages.size(); ++i) {
    if ((messages[i].role == "user") != ((i - first) % 2 == 0)) {
      return Status::InvalidArgument(
          "Gemma's chat format needs turns that alternate user / assistant / user / ... (after an "
          "optional first system message); message " +
          std::to_string(i) + " has role \"" + messages[i].role + "\"");
    }
  }
  return Status::Ok();
}

std::string ChatTemplate::RenderGemma(std::span<const ChatMessage> messages,
                                      bool add_generation_prompt) const {
  std::string out = "<bos>";
  const size_t first = LeadingSystem(messages) ? 1 : 0;
  for (size_t i = first; i < messages.size(); ++i) {
    out += "<start_of_turn>";
    out += messages[i].role == "assistant" ? std::string_view("model") : std::string_view(messages[i].role);
    out += "\n";
    if (i == first && first == 1) out += messages[0].content + "\n\n";
    out += Trimmed(messages[i].content);
    out += "<end_of_turn>\n";
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

std::string ChatTemplate::Render(std::span<const ChatMessage> messages,
                                 bool add_generation_prompt) const {
  if (kind_ == Kind::kGemma) return RenderGemma(messages, add_generation_prompt);
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0 && has_default_system_ && messages[0].role != "system") {
      out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
    }
    out += "<|im_start|>" + messages[i].role + "\n" + messages[i].content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace kvcache::model
