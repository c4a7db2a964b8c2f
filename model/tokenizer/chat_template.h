// The conversation formats for `generate --chat` and /v1/chat/completions,
// rendered in C++: ChatML, recognised from a model's Jinja chat template
// (tokenizer.chat_template), and Gemma's turn format, which a Gemma file
// without a template gets (model/decoder/loaded_model.h chooses).
//
// This is not a Jinja engine. FromJinja accepts exactly two template texts
// (byte for byte, apart from the default system prompt), the two forms of
// ChatML that Hugging Face models ship:
//   with a default system prompt (SmolLM2's):
//     {% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}
//     {{ '<|im_start|>system\nSYSTEM<|im_end|>\n' }}{% endif %}{{'<|im_start|>' +
//     message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}
//     {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
//     (one line in the file; SYSTEM any text without quote, backslash or '<|')
//   without one: the same less the {% if loop.first ... %}...{% endif %} part.
// Any other template is Unimplemented, so a model whose format differs is
// never prompted wrongly. Render produces what the template produces:
//   [<|im_start|>system\nSYSTEM<|im_end|>\n   if there is a default and the
//                                             first message is not "system"]
//   <|im_start|>ROLE\nCONTENT<|im_end|>\n     for each message
//   <|im_start|>assistant\n                   with add_generation_prompt
// (the special tokens as text: encode with parse_special).
//
// Gemma renders what Gemma's published template renders:
//   <bos>
//   <start_of_turn>ROLE\n[SYSTEM\n\n]CONTENT<end_of_turn>\n   for each turn
//   <start_of_turn>model\n                      with add_generation_prompt
// where ROLE is "model" for "assistant" (the role as given otherwise),
// CONTENT is trimmed of surrounding whitespace, and a first message of role
// "system" is no turn of its own: its content and a blank line open the
// first turn. The turns after it must alternate user, assistant, user, ...
// (Check).
//
// Thread safety: immutable; share it freely.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "kvcache/status.h"

namespace kvcache::model {

// The pieces of the two accepted template texts: kLoopOpen, then
// optionally kDefaultOpen SYSTEM kDefaultClose, then kBody.
namespace chatml {
inline constexpr std::string_view kLoopOpen = "{% for message in messages %}";
inline constexpr std::string_view kDefaultOpen =
    "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n";
inline constexpr std::string_view kDefaultClose = "<|im_end|>\n' }}{% endif %}";
inline constexpr std::string_view kBody =
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
}  // namespace chatml

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  // See the file comment. Unimplemented (quoting the start of the template)
  // for anything but the two ChatML forms.
  static Result<ChatTemplate> FromJinja(std::string_view jinja);
  // ChatML with the given default system prompt ("" for none).
  static ChatTemplate ChatMl(std::string default_system);
  // Gemma's turn format.
  static ChatTemplate Gemma();

  enum class Kind { kChatMl, kGemma };
  Kind kind() const { return kind_; }

  const std::string& default_system() const { return default_system_; }
  bool has_default_system() const { return has_default_system_; }

  // InvalidArgument when the format cannot hold the conversation (Gemma:
  // turns that do not alternate user / assistant); ChatML holds any.
  Status Check(std::span<const ChatMessage> messages) const;
  std::string Render(std::span<const ChatMessage> messages, bool add_generation_prompt) const;

 private:
  ChatTemplate() = default;
  std::string RenderGemma(std::span<const ChatMessage> messages, bool add_generation_prompt) const;
  Kind kind_ = Kind::kChatMl;
  std::string default_system_;
  bool has_default_system_ = false;
};

}  // namespace kvcache::model
