// ChatML: template recognition by exact match, rendering by concatenation.
#include "model/tokenizer/chat_template.h"

namespace kvcache::model {

using namespace chatml;

ChatTemplate ChatTemplate::ChatMl(std::string default_system) {
  ChatTemplate t;
  t.has_default_system_ = !default_system.empty();
  t.default_system_ = std::move(default_system);
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

std::string ChatTemplate::Render(std::span<const ChatMessage> messages,
                                 bool add_generation_prompt) const {
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
