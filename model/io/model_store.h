// Where the project's downloaded models live: the folder that
// scripts/fetch_model.sh fills ($KVCACHE_MODEL_DIR, else
// $HOME/.cache/kvcache/models) and the SmolLM2 and Gemma 3 files in it. Nothing here
// downloads; `./run.sh demo` and `./run.sh test` run the script first.
// Thread safety: reads the environment only; call from any thread.
#pragma once

#include <string>

namespace kvcache::model {

inline constexpr const char* kSmolLm2FileName = "SmolLM2-135M-Instruct.Q4_1.gguf";
inline constexpr const char* kGemma3FileName = "gemma-3-270m-q4_k_m.gguf";

// $KVCACHE_MODEL_DIR if set and non-empty, else $HOME/.cache/kvcache/models
// (".cache/kvcache/models" relative when HOME is unset). No trailing slash.
std::string ModelCacheDir();
// ModelCacheDir() + "/" + kSmolLm2FileName (whether or not it exists).
std::string SmolLm2Path();
// ModelCacheDir() + "/" + kGemma3FileName (`scripts/fetch_model.sh gemma3`).
std::string Gemma3Path();

}  // namespace kvcache::model
