// Which SIMD target runtime dispatch selects on this CPU.
#pragma once

#include <string>
#include <vector>

namespace kvcache {

// Name of the Highway target the library's kernels dispatch to here
// ("AVX3_ZEN4", "AVX3", "AVX2", "SSE4", "EMU128", ...).
std::string SimdTarget();
// Every target compiled in that this CPU supports, best first.
std::vector<std::string> SupportedSimdTargets();

}  // namespace kvcache
