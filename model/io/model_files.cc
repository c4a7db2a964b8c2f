// Loading a checkpoint and its tokenizer together.
#include "model/io/model_files.h"

namespace kvcache::model {

Result<std::unique_ptr<ModelFiles>> LoadModelFiles(const std::string& model_path,
                                                   const std::string& tokenizer_path) {
  KV_ASSIGN_OR_RETURN(Model model, LoadModel(model_path));
  KV_ASSIGN_OR_RETURN(Tokenizer tokenizer,
                      Tokenizer::Load(tokenizer_path, model.config().vocab_size));
  return std::unique_ptr<ModelFiles>(new ModelFiles{std::move(model), std::move(tokenizer)});
}

}  // namespace kvcache::model
