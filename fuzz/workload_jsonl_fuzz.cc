// Fuzz target `workload_jsonl`: ParseWorkloadJsonl on arbitrary text
// (src/serving/workload.cc). An accepted workload obeys docs/workloads.md:
// non-empty prompts, 1 <= max_new_tokens, 1 <= n <= 256, known outputs no
// longer than max_new_tokens, finite arrivals >= 0 in non-decreasing order.
// Errors are InvalidArgument. Thread safety: see fuzz_target.h.
#include <cmath>
#include <string_view>

#include "fuzz/fuzz_target.h"
#include "kvcache/serving/workload.h"

KVCACHE_FUZZ_TARGET(workload_jsonl) {
  using namespace kvcache;
  auto w = ParseWorkloadJsonl(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!w.ok()) {
    FUZZ_CHECK_MSG(w.status().code() == StatusCode::kInvalidArgument, "%s",
                   w.status().ToString().c_str());
    return 0;
  }
  double last = 0;
  for (const Request& r : *w) {
    FUZZ_CHECK(!r.prompt.empty());
    FUZZ_CHECK(r.prompt.size() <= (1u << 20));
    FUZZ_CHECK(r.max_new_tokens >= 1 && r.max_new_tokens <= (1u << 20));
    FUZZ_CHECK(r.num_samples >= 1 && r.num_samples <= 256);
    FUZZ_CHECK(r.output.size() <= r.max_new_tokens);
    FUZZ_CHECK(std::isfinite(r.arrival) && r.arrival >= 0);
    FUZZ_CHECK(r.arrival >= last);
    last = r.arrival;
  }
  return 0;
}
