// What `kvcache demo` shows for the reference decoder: a story (llama2.c
// checkpoints) or a chat answer (a GGUF instruct model, `chat`) generated
// with the K/V in kvcache (plain and speculative, which must agree), a table
// of teacher-forced perplexity and KL against the f32 cache for each KV
// format, and the K/V memory each format needs for the model's whole
// context. Formats the model's head_dim cannot take and formats not built
// yet are listed as such.
//
// Thread safety: reentrant (loads its own model).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/format.h"
#include "kvcache/status.h"
#include "model/kv/kv_factory.h"

namespace kvcache::tools {

struct DemoReportOptions {
  std::string model_path;      // GGUF file, or llama2.c v1 checkpoint
  std::string tokenizer_path;  // llama2.c: its tokenizer.bin
  std::string prompt = "Once upon a time";
  bool chat = false;       // the prompt is one user turn in the chat template
  uint32_t threads = 2;    // threads for the weight products
  uint32_t chunk_tokens = 1;  // table passes after the prefill (1 = decode steps)
  uint32_t max_table_tokens = 0;  // score at most this many tokens (0 = all)
  uint32_t story_tokens = 160;
  uint32_t draft_tokens = 4;  // speculative rerun of the story; 0 = skip
  // Text scored for the table; empty = DemoStoryText().
  std::string text;
  std::string text_name = "a short story";  // how the table's title names it
  // The table's passes: a prompt of prefill_tokens in one pass (where the
  // cache calibrates its per-head transforms), then one decode step per token.
  uint32_t prefill_tokens = 16;
  // Formats in the table; empty = DefaultDemoFormats().
  std::vector<FormatPair> formats;
  // Precision windows ("turbo4+s4+r120") added to the table on the cache
  // backend, each against its own f32 run; bits counted at the model's
  // context with the window's bf16 slots.
  std::vector<model::KvVariant> windows;
  // Backend of the story and the table (its formats field is ignored: the
  // story uses f32).
  model::KvBackendOptions backend;
};

// A short story written for the demo and the tests (no data set's text).
std::string_view DemoStoryText();
// f32, f16, bf16, fp8_e4m3, q8, two mixed pairs, the turbo formats, q8_0, q4_0.
std::vector<FormatPair> DefaultDemoFormats();

// Prints the story and the table to `out`. Errors (files, a failing cache)
// are returned; an unsupported or unavailable format is a table row.
Status PrintDemoReport(const DemoReportOptions& options, std::FILE* out);

}  // namespace kvcache::tools
