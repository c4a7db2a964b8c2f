// The model cache folder, as scripts/fetch_model.sh computes it.
#include "model/io/model_store.h"

#include <cstdlib>

namespace kvcache::model {

std::string ModelCacheDir() {
  const char* dir = std::getenv("KVCACHE_MODEL_DIR");
  if (dir != nullptr && dir[0] != '\0') return dir;
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr && home[0] != '\0' ? home : ".") + "/.cache/kvcache/models";
}

std::string SmolLm2Path() { return ModelCacheDir() + "/" + kSmolLm2FileName; }
std::string Gemma3Path() { return ModelCacheDir() + "/" + kGemma3FileName; }

}  // namespace kvcache::model
