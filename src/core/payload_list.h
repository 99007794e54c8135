// One string holding several, each behind its length: how one member's
// several payloads travel in one exchange (a worker's replicas' signatures
// across workers, the hierarchical backend's leader).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace distribute::internal {

std::string encode_payload_list(const std::vector<std::string>& payloads);
// InternalError if `bytes` is not a whole encoded list.
std::vector<std::string> decode_payload_list(std::string_view bytes);

}  // namespace distribute::internal
