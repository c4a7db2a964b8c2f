// KvVariant parsing, naming, bit accounting and the per-channel block
// key quantizer's scalar reference.
#include "model/kv/kv_variant.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <vector>

#include "kvcache/float16.h"

namespace kvcache::model {
namespace {

constexpr uint32_t kMaxBlockTokens = 4096;

Status Bad(std::string_view text, const std::string& why) {
  return Status::InvalidArgument("kv variant '" + std::string(text) + "': " + why);
}

// "123" -> 123; nullopt-like false on anything else.
bool ParseUint(std::string_view s, uint32_t& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

// One side's spec: a format name, or (keys) "kcB".
Status ParseSide(std::string_view text, std::string_view spec, bool key, KvVariant& v) {
  if (spec.substr(0, 2) == "kc") {
    if (!key) return Bad(text, "per-channel quantization (kc) is for keys only");
    uint32_t bits = 0;
    if (!ParseUint(spec.substr(2), bits) || bits < 2 || bits > 8) {
      return Bad(text, std::string(spec) + ": kc takes 2..8 bits (kc4)");
    }
    v.key_channel.bits = bits;
    return Status::Ok();
  }
  auto f = ParseFormat(spec);
  if (!f.ok()) return Bad(text, f.status().message());
  (key ? v.formats.k : v.formats.v) = *f;
  return Status::Ok();
}

// One "+OPT"; `seen` guards repeats.
Status ParseOption(std::string_view text, std::string_view opt, std::vector<std::string>& seen,
                   KvVariant& v) {
  const std::string key = opt == "sym" || opt == "ob" || opt == "cal" || opt == "rot" || opt == "eb"
                              ? std::string(opt)
                              : std::string(opt.substr(0, 1));
  if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
    return Bad(text, "option '" + key + "' given twice");
  }
  seen.push_back(key);
  if (opt == "sym") return v.key_channel.asymmetric = false, Status::Ok();
  if (opt == "ob") return v.open_block = true, Status::Ok();
  if (opt == "cal") return v.calibrate = true, Status::Ok();
  if (opt == "rot") return v.rotate = true, Status::Ok();
  if (opt == "eb") return v.from_bf16 = true, Status::Ok();
  uint32_t n = 0;
  const bool num = ParseUint(opt.substr(1), n);
  if (num && key == "s") return v.sinks = n, Status::Ok();
  if (num && key == "r") return v.recent = n, Status::Ok();
  if (num && key == "o") return v.key_outliers = n, Status::Ok();
  if (num && key == "g") {
    if (n == 0 || n > kMaxBlockTokens) return Bad(text, "block tokens must be 1..4096");
    return v.block_tokens = n, Status::Ok();
  }
  return Bad(text, "unknown option '" + std::string(opt) +
                       "' (known: sN, rN, ob, gN, sym, cal, rot, oN, eb)");
}

double SideBits(Format f, uint32_t head_dim) {
  return f == Format::kF32 ? 32.0 : BitsPerValue(f, head_dim);
}

}  // namespace

Result<KvVariant> ParseKvVariant(std::string_view text) {
  KvVariant v;
  const size_t plus = text.find('+');
  const std::string_view base = text.substr(0, plus);
  const size_t colon = base.find(':');
  const std::string_view ks = base.substr(0, colon);
  const std::string_view vs = colon == std::string_view::npos ? ks : base.substr(colon + 1);
  KV_RETURN_IF_ERROR(ParseSide(text, ks, true, v));
  if (colon == std::string_view::npos && v.key_channel.bits != 0) {
    return Bad(text, "kc keys need a value format (kc4:turbo4)");
  }
  KV_RETURN_IF_ERROR(ParseSide(text, vs, false, v));
  std::vector<std::string> seen;
  for (size_t at = plus; at != std::string_view::npos;) {
    const size_t next = text.find('+', at + 1);
    const std::string_view opt = text.substr(at + 1, next == std::string_view::npos ? next : next - at - 1);
    if (opt.empty()) return Bad(text, "empty option");
    KV_RETURN_IF_ERROR(ParseOption(text, opt, seen, v));
    at = next;
  }
  if (v.rotate && ((v.key_channel.bits == 0 && IsRotated(v.formats.k)) || IsRotated(v.formats.v))) {
    return Bad(text, "rot is for formats that are not already rotated (turbo formats are)");
  }
  if (!v.key_channel.asymmetric && v.key_channel.bits == 0) {
    return Bad(text, "sym applies to kc keys only");
  }
  return v;
}

std::string KvVariantName(const KvVariant& v) {
  std::string s = v.key_channel.bits != 0 ? std::string("kc").append(std::to_string(v.key_channel.bits))
                                          : std::string(FormatName(v.formats.k));
  s.append(":").append(FormatName(v.formats.v));
  if (v.sinks) s += "+s" + std::to_string(v.sinks);
  if (v.recent) s += "+r" + std::to_string(v.recent);
  if (v.open_block) s += "+ob";
  if (v.block_tokens != 16) s += "+g" + std::to_string(v.block_tokens);
  if (!v.key_channel.asymmetric) s += "+sym";
  if (v.calibrate) s += "+cal";
  if (v.rotate) s += "+rot";
  if (v.key_outliers) s += "+o" + std::to_string(v.key_outliers);
  if (v.from_bf16) s += "+eb";
  return s;
}

VariantBits KvVariantBits(const KvVariant& v, uint32_t head_dim, uint32_t positions) {
  const double d = head_dim, n = std::max(positions, 1u);
  const ChannelQuant& kc = v.key_channel;
  double k = kc.bits != 0 ? kc.bits + (kc.asymmetric ? 32.0 : 16.0) / v.block_tokens
                          : SideBits(v.formats.k, head_dim);
  double val = SideBits(v.formats.v, head_dim);
  // Dense outlier channels (bf16 each row) and their channel indices (one
  // byte per channel per head) on top of the codes of the zeroed channels.
  k += 16.0 * v.key_outliers / d + 8.0 * v.key_outliers / (n * d);
  if (v.calibrate) {  // a mean per channel (and q8 key column scales), f32
    k += (v.formats.k == Format::kQ8 ? 64.0 : 32.0) / n;
    val += 32.0 / n;
  }
  const double open = v.block_mode() ? v.block_tokens - 1 : 0;
  const double exact = std::min(n, v.sinks + v.recent + open);
  auto mix = [&](double b) { return ((n - exact) * b + exact * 16.0) / n; };
  return {mix(k), mix(val)};
}

VariantBits CacheWindowBits(const KvVariant& v, uint32_t head_dim, uint32_t positions) {
  KvVariant plain = KvVariant::Of(v.formats);
  auto calibrates = [](Format f) { return f == Format::kQ8 || IsRotated(f); };
  plain.calibrate = calibrates(v.formats.k) || calibrates(v.formats.v);
  VariantBits bits = KvVariantBits(plain, head_dim, positions);
  const double n = std::max(positions, 1u);
  const double window = std::min(n, static_cast<double>(v.sinks) + v.recent) * 16.0 / n;
  return {bits.k + window, bits.v + window};
}

Status ChannelBlockRoundTrip(const ChannelQuant& quant, uint32_t head_dim,
                             std::span<const float> rows, std::span<float> decoded) {
  if (quant.bits < 2 || quant.bits > 8) {
    return Status::InvalidArgument("channel block: bits must be 2..8");
  }
  if (head_dim == 0 || rows.size() % head_dim != 0 || decoded.size() != rows.size()) {
    return Status::InvalidArgument("channel block: rows are not whole rows of head_dim, or sizes differ");
  }
  const size_t n = rows.size() / head_dim;
  const auto f16 = [](float x) { return F16ToFloat(FloatToF16(x)); };
  for (uint32_t c = 0; c < head_dim; ++c) {
    float lo = INFINITY, hi = -INFINITY;
    for (size_t t = 0; t < n; ++t) {
      lo = std::min(lo, rows[t * head_dim + c]);
      hi = std::max(hi, rows[t * head_dim + c]);
    }
    if (quant.asymmetric) {
      const float top = static_cast<float>((1u << quant.bits) - 1);
      const float scale = f16((hi - lo) / top), m = f16(lo);
      for (size_t t = 0; t < n; ++t) {
        const float x = rows[t * head_dim + c];
        const float q = scale > 0 ? std::clamp(std::round((x - m) / scale), 0.0f, top) : 0.0f;
        decoded[t * head_dim + c] = m + scale * q;
      }
    } else {
      const float half = static_cast<float>(1u << (quant.bits - 1));
      const float d = f16(std::max(std::fabs(lo), std::fabs(hi)) / (half - 0.5f));
      for (size_t t = 0; t < n; ++t) {
        const float x = rows[t * head_dim + c];
        const float q = d > 0 ? std::clamp(std::floor(x / d), -half, half - 1) : 0.0f;
        decoded[t * head_dim + c] = d > 0 ? d * (q + 0.5f) : 0.0f;
      }
    }
  }
  return Status::Ok();
}

}  // namespace kvcache::model
