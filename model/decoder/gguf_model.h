// A Model from a GGUF file whose general.architecture is "llama" (SmolLM2,
// TinyLlama, ...) or "gemma3" (Gemma 3 270M, 1B, ...): hyperparameters from
// the <arch>.* metadata, weights as views into the file's mapping in their
// stored types (or dequantized to f32 at load). Another architecture is
// Unimplemented, naming it; nothing is kept on any error.
//
// Keys read (<arch>.): block_count, embedding_length, feed_forward_length,
// attention.head_count, attention.head_count_kv (default head_count),
// context_length, rope.freq_base (default 10000), rope.dimension_count
// (default head_dim; partial RoPE is Unimplemented),
// attention.layer_norm_rms_epsilon (default 1e-5; gemma3 1e-6),
// attention.key_length / value_length (head_dim when not dim / heads),
// vocab_size (default token_embd's rows); gemma3 also
// attention.sliding_window (every 6th layer global, as llama.cpp has it)
// and rope.scaling.{type, factor} (linear, global layers only).
// Tensors: token_embd, output_norm, output (absent = tied to token_embd),
// blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
// ffn_gate, ffn_up, ffn_down}.weight, and for gemma3 blk.N.{attn_q_norm,
// attn_k_norm, post_attention_norm, post_ffw_norm}.weight, each checked
// against the shape the metadata implies; a missing tensor, a wrong shape
// or a type the reader cannot decode is an error naming the tensor. A
// max_seq_len beyond context_length is InvalidArgument naming both.
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
  // The sequence capacity (max_seq_len); 0 = <arch>.context_length; more
  // than it is an error.
  uint32_t max_seq_len = 0;
};

Result<Model> LoadGgufModel(const std::string& path, const GgufLoadOptions& options = {});
Result<Model> ModelFromGguf(std::shared_ptr<const GgufFile> file, const GgufLoadOptions& options = {});

// True iff `path` starts with the GGUF magic (the CLI picks the loader).
bool IsGgufFile(const std::string& path);

}  // namespace kvcache::model
