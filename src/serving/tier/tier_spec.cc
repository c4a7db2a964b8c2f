// MakeTiers and ParseByteSize (offload.h): the tier list of a command line
// ("host:4GiB,disk:PATH:20GiB,redis://...") made into tier objects.
// Stateless; thread-safe.
#include <cctype>
#include <cstdlib>
#include <utility>

#include <fmt/format.h>

#include "kvcache/serving/offload.h"

namespace kvcache {

Result<uint64_t> ParseByteSize(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string num(text.substr(0, i));
  const std::string_view unit = text.substr(i);
  char* endp = nullptr;
  const double v = num.empty() ? -1 : std::strtod(num.c_str(), &endp);
  static constexpr std::pair<std::string_view, double> kUnits[] = {
      {"", 1}, {"B", 1}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name && v >= 0 && endp == num.c_str() + num.size()) {
      return static_cast<uint64_t>(v * scale);
    }
  }
  return Status::InvalidArgument(
      fmt::format("size '{}': expected a number with B, KiB, MiB, GiB or TiB", text));
}

Result<std::vector<std::shared_ptr<Tier>>> MakeTiers(std::string_view specs) {
  std::vector<std::shared_ptr<Tier>> out;
  while (!specs.empty()) {
    const size_t comma = specs.find(',');
    const std::string_view spec = specs.substr(0, comma);
    specs = comma == std::string_view::npos ? std::string_view() : specs.substr(comma + 1);
    if (spec.starts_with("host:")) {
      KV_ASSIGN_OR_RETURN(const uint64_t bytes, ParseByteSize(spec.substr(5)));
      out.push_back(NewHostTier({.capacity_bytes = bytes}));
    } else if (spec.starts_with("disk:")) {
      const std::string_view rest = spec.substr(5);
      const size_t colon = rest.rfind(':');
      if (colon == std::string_view::npos || colon == 0) {
        return Status::InvalidArgument(fmt::format("tier '{}': expected disk:PATH:SIZE", spec));
      }
      KV_ASSIGN_OR_RETURN(const uint64_t bytes, ParseByteSize(rest.substr(colon + 1)));
      DiskTierOptions d;
      d.path = std::string(rest.substr(0, colon));
      d.capacity_bytes = bytes;
      KV_ASSIGN_OR_RETURN(std::unique_ptr<Tier> t, OpenDiskTier(d));
      out.push_back(std::move(t));
    } else if (spec.starts_with("redis://")) {
      RedisTierOptions r;
      r.url = std::string(spec);
      KV_ASSIGN_OR_RETURN(std::unique_ptr<Tier> t, NewRedisTier(r));
      out.push_back(std::move(t));
    } else {
      return Status::InvalidArgument(fmt::format(
          "tier '{}': expected host:SIZE, disk:PATH:SIZE or redis://[:password@]host:port[/db]", spec));
    }
  }
  return out;
}

}  // namespace kvcache
