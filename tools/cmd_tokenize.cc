// `kvcache tokenize`: a text's token ids under a GGUF file's tokenizer
// (byte-level BPE or SentencePiece, from the file's metadata; the weights
// are not read). BOS first when the file's add_bos_token says so (--no-bos
// leaves it out); special-token texts ("<start_of_turn>", "<|im_end|>") are
// those tokens unless --no-parse-special, as llama-tokenize does by default.
// Prints the ids on one line, space-separated, or with --json one object:
// {"tokenizer": "gpt2"|"llama", "ids": [...], "pieces": [...]} (each
// token's text; bytes that are not valid UTF-8 as U+FFFD). --text-file
// reads the text from a file, byte for byte. Errors (no such file, not a
// GGUF tokenizer, text the vocabulary cannot encode) go to stderr with exit
// code 2.
#include <fmt/format.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/io/gguf.h"
#include "model/tokenizer/gguf_tokenizer.h"
#include "tools/command.h"

namespace kvcache::tools {
namespace {

struct TokenizeOptions {
  std::string model_path, text, text_file;
  bool json = false;
  bool no_bos = false;
  bool no_parse_special = false;
};

int Fail(const Status& s) {
  fmt::print(stderr, "kvcache tokenize: {}\n", s.ToString());
  return 2;
}

Result<std::string> ReadText(const TokenizeOptions& o) {
  if (o.text_file.empty()) return o.text;
  std::ifstream in(o.text_file, std::ios::binary);
  if (!in) return Status::NotFound("cannot open --text-file " + o.text_file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::IoError("cannot read --text-file " + o.text_file);
  return text;
}

int RunTokenize(const TokenizeOptions& o) {
  auto text = ReadText(o);
  if (!text.ok()) return Fail(text.status());
  auto file = model::GgufFile::Open(o.model_path);
  if (!file.ok()) return Fail(file.status());
  auto tok = model::GgufTokenizer::FromGguf(**file);
  if (!tok.ok()) return Fail(tok.status());
  model::BpeEncodeOptions eo;
  eo.bos = tok->add_bos() && !o.no_bos;
  eo.parse_special = !o.no_parse_special;
  auto ids = tok->Encode(*text, eo);
  if (!ids.ok()) return Fail(ids.status());
  if (!o.json) {
    fmt::print("{}\n", fmt::join(*ids, " "));
    return 0;
  }
  nlohmann::json pieces = nlohmann::json::array();
  for (int32_t id : *ids) {
    auto piece = tok->DecodeToken(id);
    if (!piece.ok()) return Fail(piece.status());
    pieces.push_back(std::move(piece).value());
  }
  nlohmann::json out;
  out["tokenizer"] = tok->model_name();
  out["ids"] = *ids;
  out["pieces"] = std::move(pieces);
  fmt::print("{}\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  return 0;
}

const bool kRegistered = RegisterOptionsCommand<TokenizeOptions>(
    "tokenize", "A text's token ids under a GGUF file's tokenizer (BPE or SentencePiece)",
    [](CLI::App* app, TokenizeOptions& o) {
      app->add_option("--model", o.model_path, "GGUF file (only its tokenizer is read)")->required();
      auto* text = app->add_option("--text", o.text, "Text to tokenize");
      auto* file = app->add_option("--text-file", o.text_file, "File whose bytes are the text");
      text->excludes(file);
      file->excludes(text);
      app->add_flag("--json", o.json, R"(One object: {"tokenizer", "ids", "pieces"})");
      app->add_flag("--no-bos", o.no_bos, "Leave out BOS even when the file says add_bos_token");
      app->add_flag("--no-parse-special", o.no_parse_special,
                    "Special-token texts in the text stay text");
    },
    RunTokenize);

}  // namespace
}  // namespace kvcache::tools
