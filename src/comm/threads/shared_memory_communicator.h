// SharedMemoryCommunicator: the Communicator of one replica thread among the
// threads of one process. Buffers are never copied through the group: each
// member publishes pointers to its own buffers and the others read them
// directly.
//
// all_reduce: after one round that publishes (send, recv), member r reduces
// slice r of the elements from every member's send buffer (in member order)
// and writes the result into every member's recv buffer; a second round keeps
// every buffer alive until all members are done with it. Each element is
// computed once, by one member, so every member receives the same bits.
// Cost: 2 rounds; each member reads count*size/N*N bytes and writes count*size
// bytes in total (count/N per destination).
#pragma once

#include <memory>

#include "comm/threads/local_group.h"
#include "distribute/communicator.h"

namespace distribute::internal {

class SharedMemoryCommunicator final : public Communicator {
 public:
  SharedMemoryCommunicator(std::shared_ptr<LocalGroup> group, int rank);

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string_view backend_name() const override { return "threads"; }

  std::vector<std::string> exchange(std::string payload, const CollectiveCall& call) override;
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                  const CollectiveCall& call, std::int64_t mean_divisor = 0) override;
  void all_gather_v(const void* send, void* recv, std::span<const std::size_t> counts, std::size_t outer,
                    DType dtype, const CollectiveCall& call) override;
  void broadcast(void* buffer, std::size_t count, DType dtype, int root, const CollectiveCall& call) override;
  void barrier(const CollectiveCall& call) override;
  void abort(ErrorCode code, const std::string& message, int origin_rank) noexcept override;

 private:
  std::shared_ptr<LocalGroup> group_;
  int rank_;
};

}  // namespace distribute::internal
