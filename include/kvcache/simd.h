// Which SIMD target runtime dispatch selects on this CPU, and a process-wide
// override of that choice.
//
// Thread safety: SimdTarget and SupportedSimdTargets may be called from any
// thread. UseSimdTarget changes what every later kernel call dispatches to; call
// it while no other thread is running library kernels (at start-up, or between
// benchmark rounds), as a change in the middle of an operation could let its
// parts run on different targets (each is correct, the mix only muddles timing).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kvcache/status.h"

namespace kvcache {

// Name of the Highway target the library's kernels dispatch to now
// ("AVX3", "AVX2", "SSE4", "EMU128", ...).
std::string SimdTarget();
// Every target compiled in that this CPU supports, best first. Independent of
// UseSimdTarget (detected once, on first use).
std::vector<std::string> SupportedSimdTargets();

// Restricts dispatch of every kernel (codecs, attention, linear layers, eval) to
// the target `name` (case-insensitive, one of SupportedSimdTargets()); naming the
// best one restores the default choice. A name that is not compiled in or not
// supported by this CPU is InvalidArgument (the message lists the valid choices)
// and leaves dispatch unchanged.
Status UseSimdTarget(std::string_view name);

}  // namespace kvcache
