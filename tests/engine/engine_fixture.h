// Shared by the engine tests: stories260K loaded once as a LoadedModel, the
// reference (model::Generate on one sequence alone), and a driver that reads
// every stream of a set of requests to the end.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/decoder/decoder.h"
#include "model/decoder/loaded_model.h"
#include "model/generate/generate.h"
#include "model/kv/kv_factory.h"

namespace kvcache::engine::testing {

inline const model::LoadedModel* Stories() {
  static std::unique_ptr<model::LoadedModel> m = [] {
    const std::string dir = std::string(KVCACHE_TESTDATA_DIR) + "/stories260K/";
    auto r = model::LoadedModel::Load(dir + "stories260K_v1.bin", dir + "tokenizer.bin");
    return r.ok() ? std::move(r).value() : nullptr;
  }();
  EXPECT_NE(m, nullptr) << "cannot load stories260K from testdata/";
  return m.get();
}

// Prompt i of a family: texts of different lengths, every third one starting
// with the same long sentence (a shared prefix).
inline std::vector<int32_t> Prompt(const model::LoadedModel& m, int i) {
  static const char* const kOpenings[] = {
      "Once upon a time, there was a little girl named Lily.",
      "The sun was hot and the dog wanted to play in the park with his ball.",
      "Tom had a red car.",
      "One day, a bird flew over the big tree and saw a cat sleeping under it.",
      "Mom said it was time for bed, but Ben wanted one more story about the moon.",
  };
  const std::string shared =
      "Once upon a time, in a small town by the sea, there lived a kind old man who loved to "
      "build boats out of wood. ";
  std::string text = (i % 3 == 0 ? shared : std::string()) + kOpenings[i % 5];
  for (int k = 0; k < i % 4; ++k) text += " She was happy.";
  auto ids = m.Encode(text);
  EXPECT_TRUE(ids.ok());
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

// What `kvcache generate` gives for the prompt alone: greedy or seeded plain
// sampling on a contiguous f32 cache.
inline std::vector<int32_t> GenerateAlone(const model::LoadedModel& m, const std::vector<int32_t>& prompt,
                                          uint32_t max_tokens, bool ignore_eos,
                                          model::SamplingOptions sampling = {}) {
  model::Decoder d(m.model(), 1);
  model::KvBackendOptions o;
  auto kv = model::CreateKvBackend(d.attention_shape(), o);
  EXPECT_TRUE(kv.ok());
  model::GenerateOptions g;
  g.max_new_tokens = max_tokens;
  g.stop_at_eos = !ignore_eos;
  g.stop_tokens = m.stop_tokens();
  g.sampling = sampling;
  auto r = model::Generate(d, **kv, prompt, g);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->tokens : std::vector<int32_t>{};
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text;  // every token's text, then the tail
  std::vector<TokenOut> outs;
  StreamEvent last;  // the final event
  bool finished = false;
};

// Reads every stream to its final event (at most `limit` in all).
inline std::vector<Outcome> Drain(std::vector<std::shared_ptr<RequestStream>>& streams,
                                  std::chrono::seconds limit = std::chrono::seconds(60)) {
  std::vector<Outcome> out(streams.size());
  const auto end = std::chrono::steady_clock::now() + limit;
  size_t left = streams.size();
  while (left > 0 && std::chrono::steady_clock::now() < end) {
    for (size_t i = 0; i < streams.size(); ++i) {
      if (out[i].finished) continue;
      StreamEvent e;
      if (!streams[i]->Next(&e, std::chrono::milliseconds(5))) continue;
      for (TokenOut& t : e.tokens) {
        out[i].tokens.push_back(t.token);
        out[i].text += t.text;
        out[i].outs.push_back(std::move(t));
      }
      if (e.finished) {
        out[i].text += e.text_tail;
        out[i].last = std::move(e);
        out[i].finished = true;
        --left;
      }
    }
  }
  for (const Outcome& o : out) EXPECT_TRUE(o.finished) << "a request did not finish in time";
  return out;
}

inline RequestParams Greedy(std::vector<int32_t> prompt, uint32_t max_tokens, bool ignore_eos = false) {
  RequestParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.ignore_eos = ignore_eos;
  return p;
}

inline EngineOptions SmallEngine() {
  EngineOptions o;
  o.pool_bytes = 8ull << 20;
  o.max_batch_tokens = 48;
  o.max_running = 16;
  o.threads = 2;
  return o;
}

inline std::unique_ptr<Engine> MakeEngine(const EngineOptions& o) {
  auto e = Engine::Create(*Stories(), o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

inline std::vector<Outcome> RunAll(Engine& e, const std::vector<RequestParams>& params) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const RequestParams& p : params) {
    auto s = e.Submit(p);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) streams.push_back(*s);
  }
  return Drain(streams);
}

}  // namespace kvcache::engine::testing
