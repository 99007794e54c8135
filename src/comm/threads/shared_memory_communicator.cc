#include "comm/threads/shared_memory_communicator.h"

#include <cstring>
#include <vector>

#include "core/reduce_kernels.h"

namespace distribute::internal {

SharedMemoryCommunicator::SharedMemoryCommunicator(std::shared_ptr<LocalGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {}

std::vector<std::string> SharedMemoryCommunicator::exchange(std::string payload, const CollectiveCall& call) {
  const auto& entries = group_->arrive(rank_, LocalGroup::Entry{.payload = std::move(payload)}, call);
  std::vector<std::string> all;
  all.reserve(entries.size());
  for (const auto& e : entries) all.push_back(e.payload);
  return all;
}

void SharedMemoryCommunicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                          const CollectiveCall& call, std::int64_t mean_divisor) {
  const int n = size();
  const std::size_t esz = size_of(dtype);
  if (n == 1) {
    const void* srcs[1] = {send};
    if (op == ReduceOp::kMean && mean_divisor > 1) {
      reduce_sources(recv, srcs, count, dtype, op, mean_divisor);
    } else if (send != recv && count > 0) {
      std::memcpy(recv, send, count * esz);
    }
    return;
  }
  const auto& entries = group_->arrive(rank_, LocalGroup::Entry{.send = send, .recv = recv}, call);
  const std::size_t begin = count * static_cast<std::size_t>(rank_) / static_cast<std::size_t>(n);
  const std::size_t end = count * static_cast<std::size_t>(rank_ + 1) / static_cast<std::size_t>(n);
  if (end > begin) {
    std::vector<const void*> srcs(static_cast<std::size_t>(n));
    for (int q = 0; q < n; ++q) {
      srcs[static_cast<std::size_t>(q)] = static_cast<const std::byte*>(entries[static_cast<std::size_t>(q)].send) + begin * esz;
    }
    auto* mine = static_cast<std::byte*>(recv) + begin * esz;
    reduce_sources(mine, srcs, end - begin, dtype, op, mean_divisor > 0 ? mean_divisor : n);
    for (int q = 0; q < n; ++q) {
      if (q == rank_) continue;
      std::memcpy(static_cast<std::byte*>(entries[static_cast<std::size_t>(q)].recv) + begin * esz, mine,
                  (end - begin) * esz);
    }
  }
  group_->arrive(rank_, LocalGroup::Entry{}, call);  // nobody leaves while others still use its buffers
}

void SharedMemoryCommunicator::all_gather_v(const void* send, void* recv, std::span<const std::size_t> counts,
                                            std::size_t outer, DType dtype, const CollectiveCall& call) {
  const int n = size();
  const std::size_t esz = size_of(dtype);
  std::size_t row = 0;
  for (std::size_t c : counts) row += c;
  if (n == 1) {
    if (send != recv && row * outer > 0) std::memcpy(recv, send, row * outer * esz);
    return;
  }
  const auto& entries = group_->arrive(rank_, LocalGroup::Entry{.send = send, .recv = recv}, call);
  auto* dst = static_cast<std::byte*>(recv);
  for (std::size_t o = 0; o < outer; ++o) {
    for (int q = 0; q < n; ++q) {
      const std::size_t bytes = counts[static_cast<std::size_t>(q)] * esz;
      if (bytes == 0) continue;
      std::memcpy(dst, static_cast<const std::byte*>(entries[static_cast<std::size_t>(q)].send) + o * bytes, bytes);
      dst += bytes;
    }
  }
  group_->arrive(rank_, LocalGroup::Entry{}, call);
}

void SharedMemoryCommunicator::broadcast(void* buffer, std::size_t count, DType dtype, int root,
                                         const CollectiveCall& call) {
  if (size() == 1) return;
  const auto& entries = group_->arrive(rank_, LocalGroup::Entry{.recv = buffer}, call);
  if (rank_ != root && count > 0) {
    std::memcpy(buffer, entries[static_cast<std::size_t>(root)].recv, count * size_of(dtype));
  }
  group_->arrive(rank_, LocalGroup::Entry{}, call);
}

void SharedMemoryCommunicator::barrier(const CollectiveCall& call) {
  if (size() > 1) group_->arrive(rank_, LocalGroup::Entry{}, call);
}

void SharedMemoryCommunicator::abort(ErrorCode code, const std::string& message, int origin_rank) noexcept {
  group_->abort(code, message, origin_rank);
}

}  // namespace distribute::internal
