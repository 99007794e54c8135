#include "core/payload_list.h"

#include <cstdint>
#include <cstring>

#include "distribute/errors.h"

namespace distribute::internal {

std::string encode_payload_list(const std::vector<std::string>& payloads) {
  std::string out;
  for (const std::string& p : payloads) {
    const std::uint64_t size = p.size();
    out.append(reinterpret_cast<const char*>(&size), sizeof size);
    out += p;
  }
  return out;
}

std::vector<std::string> decode_payload_list(std::string_view bytes) {
  std::vector<std::string> out;
  while (!bytes.empty()) {
    std::uint64_t size = 0;
    if (bytes.size() < sizeof size) throw InternalError("a worker's payload list is truncated");
    std::memcpy(&size, bytes.data(), sizeof size);
    bytes.remove_prefix(sizeof size);
    if (bytes.size() < size) throw InternalError("a worker's payload list is truncated");
    out.emplace_back(bytes.substr(0, size));
    bytes.remove_prefix(size);
  }
  return out;
}

}  // namespace distribute::internal
