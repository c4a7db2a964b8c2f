// A checkpoint and its tokenizer loaded together (the tokenizer's size comes
// from the checkpoint's vocab_size).
//
// Thread safety: immutable after loading.
#pragma once

#include <memory>
#include <string>

#include "kvcache/status.h"
#include "model/io/checkpoint.h"
#include "model/tokenizer/tokenizer.h"

namespace kvcache::model {

struct ModelFiles {
  Model model;
  Tokenizer tokenizer;
};

// Errors name the file that failed.
Result<std::unique_ptr<ModelFiles>> LoadModelFiles(const std::string& model_path,
                                                   const std::string& tokenizer_path);

}  // namespace kvcache::model
