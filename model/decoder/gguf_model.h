// A llama-architecture Model from a GGUF file (SmolLM2, TinyLlama, ...):
// hyperparameters from the llama.* metadata, weights as views into the
// file's mapping in their stored types (or dequantized to f32 at load).
//
// Keys read: general.architecture (must be "llama"), llama.block_count,
// .embedding_length, .feed_forward_length, .attention.head_count,
// .attention.head_count_kv (default head_count), .context_length,
// .rope.freq_base (default 10000), .rope.dimension_count (default head_dim;
// partial RoPE is Unimplemented), .attention.layer_norm_rms_epsilon
// (default 1e-5), llama.vocab_size (default token_embd's rows).
// Tensors: token_embd, output_norm, output (absent = tied to token_embd),
// blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
// ffn_gate, ffn_up, ffn_down}.weight, each checked against the shape the
// metadata implies; a missing tensor, a wrong shape or a type the reader
// cannot decode is an error naming the tensor.
//
// RoPE: GGUF's llama tensors are stored permuted for the "normal" RoPE
// layout (pairs (2i, 2i+1) of each head), the same layout as llama2.c's
// export, so the decoder's ApplyRope applies unchanged.
//
// Thread safety: loading is reentrant; the Model is immutable afterwards.
#pragma once

#include <memory>
#include <string>

#include "kvcache/status.h"
#include "model/io/checkpoint.h"
#include "model/io/gguf.h"

namespace kvcache::model {

struct GgufLoadOptions {
  // Decode every matrix to f32 at load (4 bytes a weight) instead of
  // keeping the file's types; for measuring the two representations.
  bool dequantize_at_load = false;
  // How Q4_1 / Q8_0 matrices take their inputs (matmul.h): exact f32, or
  // rounded to int8 per 32 values for the integer-lane product.
  MatMulInputs matmul_inputs = MatMulInputs::kF32;
  // The sequence capacity (max_seq_len); 0 = llama.context_length.
  uint32_t max_seq_len = 0;
};

Result<Model> LoadGgufModel(const std::string& path, const GgufLoadOptions& options = {});
Result<Model> ModelFromGguf(std::shared_ptr<const GgufFile> file, const GgufLoadOptions& options = {});

// True iff `path` starts with the GGUF magic (the CLI picks the loader).
bool IsGgufFile(const std::string& path);

}  // namespace kvcache::model
