#include "comm/hierarchical/hierarchical_communicator.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/payload_list.h"
#include "core/reduce_kernels.h"
#include "core/storage.h"

namespace distribute::internal {

namespace {
// Each worker's element count: the sum of its `local` replicas' counts.
std::vector<std::size_t> per_worker_counts(std::span<const std::size_t> counts, std::size_t local) {
  std::vector<std::size_t> per_worker(counts.size() / local);
  for (std::size_t w = 0; w < per_worker.size(); ++w) {
    per_worker[w] = std::accumulate(counts.begin() + static_cast<std::ptrdiff_t>(w * local),
                                    counts.begin() + static_cast<std::ptrdiff_t>((w + 1) * local), std::size_t{0});
  }
  return per_worker;
}
}  // namespace

HierarchicalCommunicator::HierarchicalCommunicator(std::shared_ptr<LocalGroup> local, int local_id,
                                                   Communicator* workers, std::size_t all_reduce_stream_bytes)
    : local_(std::move(local)),
      local_id_(local_id),
      local_size_(local_->size()),
      workers_(workers),
      local_comm_(local_, local_id, all_reduce_stream_bytes, kShareReduceBytes) {}

void HierarchicalCommunicator::pass_on_local_mismatch(const CollectiveCall& call) {
  if (leader()) {
    CollectiveCall tell = call;
    tell.signature_tag = call.signature_tag | 1;  // bit 0: can never agree
    run_cross([&] { workers_->barrier(tell); });
  }
  throw SignatureMismatch();
}

template <class Cross>
bool HierarchicalCommunicator::run_cross(Cross&& cross) {
  try {
    cross();
    return false;
  } catch (const SignatureMismatch&) {
    return true;
  } catch (const Error& e) {
    local_->abort(e.code(), e.message(), local_id_);
    throw;
  } catch (const std::exception& e) {
    local_->abort(ErrorCode::kInternal, e.what(), local_id_);
    throw;
  }
}

CollectiveCall HierarchicalCommunicator::fan_out_call(const CollectiveCall& call, bool mismatch) {
  CollectiveCall fan = call;
  fan.signature_tag = mismatch ? 1 : 0;
  fan.timeout_seconds = 0;
  fan.stall_warning_seconds = 0;
  return fan;
}

std::vector<std::string> HierarchicalCommunicator::exchange(std::string payload, const CollectiveCall& call) {
  std::vector<std::string> locals;
  if (local_size_ == 1) {
    locals.push_back(std::move(payload));
  } else {
    try {
      locals = local_comm_.exchange(std::move(payload), call);
    } catch (const SignatureMismatch&) {
      pass_on_local_mismatch(call);
    }
  }
  std::shared_ptr<std::vector<std::string>> all;
  bool mismatch = false;
  if (leader()) {
    mismatch = run_cross([&] {
      // Every worker sends a list (one entry per local replica), so workers
      // with different numbers of entries still understand each other.
      std::vector<std::string> per_worker = workers_->exchange(encode_payload_list(locals), call);
      all = std::make_shared<std::vector<std::string>>();
      for (const std::string& w : per_worker) {
        for (std::string& p : decode_payload_list(w)) all->push_back(std::move(p));
      }
    });
  }
  if (local_size_ == 1) {
    if (mismatch) throw SignatureMismatch();
    return std::move(*all);
  }
  const auto& entries =
      local_->arrive(local_id_, {.object = all, .tag = mismatch ? 1u : 0u}, fan_out_call(call, false));
  return *std::static_pointer_cast<std::vector<std::string>>(entries[0].object);
}

void HierarchicalCommunicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                          const CollectiveCall& call, std::int64_t mean_divisor) {
  const std::int64_t divisor = mean_divisor > 0 ? mean_divisor : size();
  if (local_size_ == 1) {
    workers_->all_reduce(send, recv, count, dtype, op, call, divisor);
    return;
  }
  if (op == ReduceOp::kMean && !is_floating(dtype)) {
    // An exact integer (or bool) MEAN cannot be split into sums: the local
    // sums would wrap in the dtype (and bool's "sum" is OR). Every replica's
    // input is gathered instead and reduced once, in replica order, as one
    // process would.
    const std::size_t bytes = count * size_of(dtype);
    std::shared_ptr<std::byte> all = allocate_storage(bytes * static_cast<std::size_t>(size()));
    const std::vector<std::size_t> counts(static_cast<std::size_t>(size()), count);
    all_gather_v(send, all.get(), counts, 1, dtype, call);
    std::vector<const void*> srcs(static_cast<std::size_t>(size()));
    for (std::size_t q = 0; q < srcs.size(); ++q) srcs[q] = all.get() + q * bytes;
    reduce_sources(recv, srcs, count, dtype, op, divisor);
    return;
  }
  // MEAN: the local step sums, the cross step sums the workers' sums and divides once.
  try {
    local_comm_.all_reduce(send, recv, count, dtype, op == ReduceOp::kMean ? ReduceOp::kSum : op, call);
  } catch (const SignatureMismatch&) {
    pass_on_local_mismatch(call);
  }
  bool mismatch = false;
  if (leader()) mismatch = run_cross([&] { workers_->all_reduce(recv, recv, count, dtype, op, call, divisor); });
  local_comm_.broadcast(recv, count, dtype, 0, fan_out_call(call, mismatch));
}

void HierarchicalCommunicator::all_gather_v(const void* send, void* recv, std::span<const std::size_t> counts,
                                            std::size_t outer, DType dtype, const CollectiveCall& call) {
  if (local_size_ == 1) {
    workers_->all_gather_v(send, recv, counts, outer, dtype, call);
    return;
  }
  const auto L = static_cast<std::size_t>(local_size_);
  const std::span<const std::size_t> local_counts = counts.subspan(static_cast<std::size_t>(workers_->rank()) * L, L);
  // This worker's block: `outer` rows, each its replicas' rows in order.
  const std::size_t block_elements = outer * std::accumulate(local_counts.begin(), local_counts.end(), std::size_t{0});
  std::shared_ptr<std::byte> block = allocate_storage(block_elements * size_of(dtype));
  try {
    local_comm_.all_gather_v(send, block.get(), local_counts, outer, dtype, call);
  } catch (const SignatureMismatch&) {
    pass_on_local_mismatch(call);
  }
  bool mismatch = false;
  if (leader()) {
    mismatch = run_cross([&] {
      const std::vector<std::size_t> per_worker = per_worker_counts(counts, L);
      workers_->all_gather_v(block.get(), recv, per_worker, outer, dtype, call);
    });
  }
  const std::size_t total = outer * std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  local_comm_.broadcast(recv, total, dtype, 0, fan_out_call(call, mismatch));
}

std::shared_ptr<std::byte> HierarchicalCommunicator::all_reduce_shared(std::span<const Segment> segments, DType dtype,
                                                                       ReduceOp op, const CollectiveCall& call,
                                                                       std::int64_t mean_divisor) {
  std::size_t total = 0;
  for (const Segment& s : segments) total += s.count;
  // As the local step decides (it was given kShareReduceBytes), on the
  // message's size, agreed by every replica.
  if (!local_comm_.shares_reduce(total * size_of(dtype)) || (op == ReduceOp::kMean && !is_floating(dtype))) {
    return Communicator::all_reduce_shared(segments, dtype, op, call, mean_divisor);
  }
  const std::int64_t divisor = mean_divisor > 0 ? mean_divisor : size();
  // MEAN: the local step sums, the cross step sums the workers' sums and divides once.
  std::shared_ptr<std::byte> block;
  try {
    block = local_comm_.all_reduce_shared(segments, dtype, op == ReduceOp::kMean ? ReduceOp::kSum : op, call);
  } catch (const SignatureMismatch&) {
    pass_on_local_mismatch(call);
  }
  bool mismatch = false;
  // The local replicas wait in the fan-out round below and do not read the
  // block before the leader's in-place cross step is done.
  if (leader())
    mismatch = run_cross([&] { workers_->all_reduce(block.get(), block.get(), total, dtype, op, call, divisor); });
  // Every local replica returns the leader's block (the one its cross step
  // reduced), whatever the local step handed each.
  const auto& entries = local_->arrive(local_id_, {.object = mismatch ? nullptr : block, .tag = mismatch ? 1u : 0u},
                                       fan_out_call(call, false));
  return std::static_pointer_cast<std::byte>(entries[0].object);
}

std::shared_ptr<std::byte> HierarchicalCommunicator::all_gather_v_shared(const void* send,
                                                                         std::span<const std::size_t> counts,
                                                                         std::size_t outer, DType dtype,
                                                                         const CollectiveCall& call) {
  // As the threads engine: shared from a contribution of over 4 KiB (below,
  // the small rounds and the thread's own storage cache are faster); every
  // member decides alike, the counts being agreed. One replica per worker:
  // an output of its own, as MPI gives.
  const std::size_t largest = outer * size_of(dtype) * *std::max_element(counts.begin(), counts.end());
  if (local_size_ == 1 || !SharedMemoryCommunicator::shares_gather(largest)) {
    return Communicator::all_gather_v_shared(send, counts, outer, dtype, call);
  }
  const auto L = static_cast<std::size_t>(local_size_);
  const std::span<const std::size_t> local_counts = counts.subspan(static_cast<std::size_t>(workers_->rank()) * L, L);
  // This worker's block, which only the leader reads: each replica copies its own rows in once.
  std::shared_ptr<std::byte> block;
  try {
    block = local_comm_.all_gather_v_shared(send, local_counts, outer, dtype, call);
  } catch (const SignatureMismatch&) {
    pass_on_local_mismatch(call);
  }
  std::shared_ptr<std::byte> out;
  bool mismatch = false;
  if (leader()) {
    mismatch = run_cross([&] {
      const std::vector<std::size_t> per_worker = per_worker_counts(counts, L);
      const std::size_t total = outer * std::accumulate(counts.begin(), counts.end(), std::size_t{0});
      out = allocate_shared_storage(total * size_of(dtype));
      workers_->all_gather_v(block.get(), out.get(), per_worker, outer, dtype, call);
    });
  }
  // The fan-out: the leader's output itself, with its verdict on the cross step as a tag.
  const auto& entries = local_->arrive(local_id_, {.object = mismatch ? nullptr : out, .tag = mismatch ? 1u : 0u},
                                       fan_out_call(call, false));
  return std::static_pointer_cast<std::byte>(entries[0].object);
}

void HierarchicalCommunicator::broadcast(void* buffer, std::size_t count, DType dtype, int root,
                                         const CollectiveCall& call) {
  if (local_size_ == 1) {
    workers_->broadcast(buffer, count, dtype, root, call);
    return;
  }
  const int root_worker = root / local_size_;
  try {
    if (workers_->rank() == root_worker) {
      local_comm_.broadcast(buffer, count, dtype, root % local_size_, call);  // the leader now holds it
    } else {
      local_comm_.barrier(call);  // only the agreement check
    }
  } catch (const SignatureMismatch&) {
    pass_on_local_mismatch(call);
  }
  bool mismatch = false;
  if (leader()) mismatch = run_cross([&] { workers_->broadcast(buffer, count, dtype, root_worker, call); });
  // On the root's worker every replica holds the bytes already: the fan-out
  // (which carries the leader's verdict) goes out from the root, so that the
  // root's buffer is only read, as every broadcast's is.
  const int fan_out_root = workers_->rank() == root_worker ? root % local_size_ : 0;
  local_comm_.broadcast(buffer, count, dtype, fan_out_root, fan_out_call(call, mismatch));
}

std::shared_ptr<std::byte> HierarchicalCommunicator::broadcast_shared(const void* send, std::size_t count, DType dtype,
                                                                      int root, const CollectiveCall& call) {
  const std::size_t bytes = count * size_of(dtype);
  if (local_size_ == 1 || !SharedMemoryCommunicator::shares_broadcast(bytes)) {
    return Communicator::broadcast_shared(send, count, dtype, root, call);
  }
  const int root_worker = root / local_size_;
  std::shared_ptr<std::byte> block;  // root's bytes, on root's worker after the local step
  try {
    if (workers_->rank() == root_worker) {
      block = local_comm_.broadcast_shared(send, count, dtype, root % local_size_, call);
    } else {
      local_comm_.barrier(call);  // only the agreement check
    }
  } catch (const SignatureMismatch&) {
    pass_on_local_mismatch(call);
  }
  bool mismatch = false;
  if (leader()) {
    mismatch = run_cross([&] {
      if (!block) block = allocate_shared_storage(bytes);
      workers_->broadcast(block.get(), count, dtype, root_worker, call);
    });
  }
  // The fan-out: the leader's block itself, with its verdict on the cross step as a tag.
  const auto& entries = local_->arrive(local_id_, {.object = mismatch ? nullptr : block, .tag = mismatch ? 1u : 0u},
                                       fan_out_call(call, false));
  return std::static_pointer_cast<std::byte>(entries[0].object);
}

void HierarchicalCommunicator::barrier(const CollectiveCall& call) {
  if (local_size_ == 1) {
    workers_->barrier(call);
    return;
  }
  try {
    local_comm_.barrier(call);
  } catch (const SignatureMismatch&) {
    pass_on_local_mismatch(call);
  }
  bool mismatch = false;
  if (leader()) mismatch = run_cross([&] { workers_->barrier(call); });
  local_comm_.barrier(fan_out_call(call, mismatch));
}

void HierarchicalCommunicator::abort(ErrorCode code, const std::string& message, int) noexcept {
  local_->abort(code, message, local_id_);
  workers_->abort(code, message, workers_->rank());
}

}  // namespace distribute::internal
