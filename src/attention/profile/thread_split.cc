// The kernels' split of a call into tasks (plan.h), as the profiling header
// (kvcache/attention_profile.h) gives it to the benches.
#include "attention/plan.h"
#include "kvcache/attention_profile.h"

namespace kvcache {

uint32_t AttentionHeadsPerTask(const LayerKvView& v, size_t n_jobs, uint32_t threads) {
  return attention_internal::HeadsPerTask(v, n_jobs, threads);
}

uint32_t AttentionGroupChunkRows() { return attention_internal::kGroupChunkRows; }

}  // namespace kvcache
