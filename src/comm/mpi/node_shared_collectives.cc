// MpiCommunicator's calls on one host, through the memory its ranks share
// (NodeSharedMemory): the first step that compares the ranks' calls, and the
// all-reduce, all-gather, exchange and broadcast that move data there.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/mpi_communicator_internal.h"
#include "comm/mpi/node_shared_memory.h"
#include "core/reduce_kernels.h"
#include "core/storage.h"
#include "distribute/dtype.h"
#include "distribute/errors.h"
#include "distribute/reduce_op.h"

namespace distribute::internal {

void MpiCommunicator::shared_step(std::uint64_t step, const CollectiveCall& call) {
  shared_->publish(rank_, step);
  poll(call, [&] { return shared_->all_reached(step); });
}

namespace {

// What a rank's call is, for the error that says two ranks' calls differ.
std::string describe(const NodeSharedMemory::Call& c) {
  const std::string bytes =
      std::to_string(c.bytes) + " bytes of " + std::string(to_string(static_cast<DType>(c.dtype)));
  switch (c.kind) {
    case 1: return "an exchange";
    case 2: return "an all-reduce of " + bytes + " (" + std::string(to_string(static_cast<ReduceOp>(c.op))) + ")";
    case 3: return "an all-gather sending " + bytes;
    case 4: return "a broadcast of " + bytes + " from rank " + std::to_string(c.root);
    case 5: return "a barrier";
    default: return "a call of unknown kind " + std::to_string(c.kind);
  }
}

}  // namespace

void MpiCommunicator::shared_begin(std::uint64_t step, const NodeSharedMemory::Call& mine, const CollectiveCall& call) {
  shared_->call(rank_, step) = mine;
  shared_step(step, call);
  // Every rank reads the same slots, so every rank decides alike.
  bool tags_differ = (mine.tag & 1) != 0;  // bit 0: a tag that can never agree
  for (int q = 0; q < size_; ++q) tags_differ |= shared_->call(q, step).tag != mine.tag;
  const auto peer_failed_first = [&] {
    // A rank that published this step and then failed (a timeout, say) is
    // in another call by now: its failure notice, if sent, is the error.
    // (A message that has arrived may take OpenMPI a progress call or two
    // to match: a few probes, on this error path only.)
    for (int probe = 0; probe < 16 && !failed_.load(std::memory_order_acquire); ++probe) receive_notices();
    throw_if_failed();
    if (!departures_.empty()) check_departures(call);
  };
  if (tags_differ) {
    peer_failed_first();
    throw SignatureMismatch();
  }
  for (int q = 0; q < size_; ++q) {
    const NodeSharedMemory::Call theirs = shared_->call(q, step);
    const bool exchange = mine.kind == static_cast<std::uint32_t>(Kind::kExchange);
    if (theirs.kind == mine.kind && theirs.dtype == mine.dtype && theirs.op == mine.op && theirs.root == mine.root &&
        theirs.layout == mine.layout && (exchange || theirs.bytes == mine.bytes || mine.layout != 0)) {
      continue;
    }
    peer_failed_first();
    std::string message = label(call) + ": rank " + std::to_string(q) + " makes " + describe(theirs) + " where rank " +
                          std::to_string(rank_) + " makes " + describe(mine);
    if (theirs.kind == mine.kind && theirs.layout != mine.layout) message += ", with other sizes of the ranks' blocks";
    message += mine.tag == 0 ? "; the call had no signature tag to compare first, and this communicator cannot be "
                               "used any more"
                             : "; this communicator cannot be used any more";
    abort(ErrorCode::kInvalidArgument, message, rank_);
    throw InvalidArgumentError(message);
  }
}

void MpiCommunicator::agree(const NodeSharedMemory::Call& mine, const CollectiveCall& call) {
  if (shared_ != nullptr) {
    shared_begin(shared_->next_step(), mine, call);
  } else {
    check_tags(call);
  }
}

void MpiCommunicator::shared_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                        std::int64_t divisor, const NodeSharedMemory::Call& mine,
                                        const CollectiveCall& call) {
  // Per chunk: every rank copies into its buffer the slices of its input
  // that the others reduce; rank r reduces slice r of every rank's input in
  // rank order (its own read where it is) into its next buffer and copies it
  // out; then every rank copies the others' reduced slices out. In place
  // (send == recv) is safe: a slice is read before it is written.
  const std::size_t esz = size_of(dtype);
  const std::size_t chunk = NodeSharedMemory::kChunkBytes / esz;
  const auto n = static_cast<std::size_t>(size_);
  std::vector<const void*>& srcs = shared_->sources();
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  for (std::size_t at = 0; at < count; at += chunk) {
    const std::size_t len = std::min(chunk, count - at);
    const std::size_t begin = len * me() / n, end = len * (me() + 1) / n;
    const std::uint64_t inputs = shared_->next_step();
    std::byte* mine_in = shared_->buffer(rank_, inputs);
    if (begin > 0) std::memcpy(mine_in, in + at * esz, begin * esz);
    if (len > end) std::memcpy(mine_in + end * esz, in + (at + end) * esz, (len - end) * esz);
    if (at == 0) {
      shared_begin(inputs, mine, call);
    } else {
      shared_step(inputs, call);
    }
    for (std::size_t q = 0; q < n; ++q) srcs[q] = shared_->buffer(static_cast<int>(q), inputs) + begin * esz;
    srcs[me()] = in + (at + begin) * esz;
    const std::uint64_t outputs = shared_->next_step();
    std::byte* reduced = shared_->buffer(rank_, outputs) + begin * esz;
    if (end > begin) {
      reduce_sources(reduced, srcs, end - begin, dtype, op, divisor);
      std::memcpy(out + (at + begin) * esz, reduced, (end - begin) * esz);
    }
    shared_step(outputs, call);
    for (std::size_t q = 0; q < n; ++q) {
      const std::size_t b = len * q / n, e = len * (q + 1) / n;
      if (q != me() && e > b) {
        std::memcpy(out + (at + b) * esz, shared_->buffer(static_cast<int>(q), outputs) + b * esz, (e - b) * esz);
      }
    }
  }
}

void MpiCommunicator::single_copy_gather(const void* send, std::size_t send_bytes, std::byte* recv,
                                         const std::vector<std::size_t>& counts, NodeSharedMemory::Call mine,
                                         const CollectiveCall& call) {
  // Every rank says where its block is at the first step and reads the
  // others' from there; the second step keeps every block in place until
  // every rank has read it.
  const std::uint64_t step = shared_->next_step();
  mine.address = reinterpret_cast<std::uint64_t>(send);
  shared_begin(step, mine, call);
  std::size_t at = 0;
  for (int q = 0; q < size_; ++q) {
    const std::size_t bytes = counts[static_cast<std::size_t>(q)];
    if (q == rank_) {
      if (bytes > 0 && recv + at != send) std::memcpy(recv + at, send, send_bytes);
    } else if (bytes > 0 && !shared_->read(q, shared_->call(q, step).address, recv + at, bytes)) {
      const int error = errno;
      const std::string message = label(call) + ": rank " + std::to_string(rank_) + " could not read rank " +
                                  std::to_string(q) + "'s block of " + std::to_string(bytes) +
                                  " bytes (process_vm_readv: " + std::strerror(error) +
                                  "); this communicator cannot be used any more";
      abort(ErrorCode::kUnavailable, message, rank_);
      throw UnavailableError(message);
    }
    at += bytes;
  }
  const std::uint64_t read = shared_->next_step();
  try {
    shared_step(read, call);
  } catch (...) {
    // Failing here (a timeout, an abort, a peer's notice), this rank must
    // not hand `send` back while peers may still be reading it: they would
    // finish this step (this rank took it) with a torn block. A moment for
    // them, as release() gives pending receives; then `send` is quarantined.
    const Clock::time_point give_up = Clock::now() + std::chrono::milliseconds(100);
    while (!shared_->all_reached(read) && Clock::now() < give_up) std::this_thread::yield();
    if (!shared_->all_reached(read) && send_bytes > 0) {
      try {
        quarantine_storage(send, send_bytes);
      } catch (const std::bad_alloc&) {
      }
    }
    throw;
  }
}

std::vector<std::string> MpiCommunicator::shared_exchange(std::string payload, const CollectiveCall& call) {
  // Payloads up to a buffer through the buffers; larger ones through MPI,
  // their sizes known from the first step.
  const std::uint64_t step = shared_->next_step();
  const bool through_buffer = payload.size() <= NodeSharedMemory::kChunkBytes;
  if (through_buffer && !payload.empty()) std::memcpy(shared_->buffer(rank_, step), payload.data(), payload.size());
  shared_begin(
      step, {.tag = call.signature_tag, .bytes = payload.size(), .kind = static_cast<std::uint32_t>(Kind::kExchange)},
      call);
  std::vector<std::size_t> by_mpi(static_cast<std::size_t>(size_), 0);
  std::size_t mpi_total = 0;
  for (int q = 0; q < size_; ++q) {
    const auto bytes = static_cast<std::size_t>(shared_->call(q, step).bytes);
    if (q != rank_ && bytes > NodeSharedMemory::kChunkBytes) {
      by_mpi[static_cast<std::size_t>(q)] = bytes;
      mpi_total += bytes;
    }
  }
  std::shared_ptr<std::byte> received;
  if (mpi_total > 0 || !through_buffer) {
    // Tensor storage, not a string: a receive left after a failure quarantines it (release()).
    received = allocate_storage(mpi_total);
    const std::shared_ptr<std::byte> outgoing = through_buffer ? nullptr : sendable(payload);
    gather_bytes(outgoing.get(), through_buffer ? 0 : payload.size(), received.get(), by_mpi, call,
                 /*place_own=*/false);
  }
  std::vector<std::string> out(static_cast<std::size_t>(size_));
  std::size_t at = 0;
  for (int q = 0; q < size_; ++q) {
    const auto bytes = static_cast<std::size_t>(shared_->call(q, step).bytes);
    auto& o = out[static_cast<std::size_t>(q)];
    if (q == rank_) {
      o = std::move(payload);
    } else if (by_mpi[static_cast<std::size_t>(q)] > 0) {
      o.assign(reinterpret_cast<const char*>(received.get()) + at, bytes);
      at += bytes;
    } else {
      o.assign(reinterpret_cast<const char*>(shared_->buffer(q, step)), bytes);
    }
  }
  return out;
}

void MpiCommunicator::shared_broadcast(void* buffer, std::size_t bytes, DType dtype, int root,
                                       const CollectiveCall& call) {
  const std::uint64_t step = shared_->next_step();
  const bool through_buffer = bytes <= NodeSharedMemory::kChunkBytes;
  if (rank_ == root && through_buffer && bytes > 0) std::memcpy(shared_->buffer(rank_, step), buffer, bytes);
  shared_begin(step,
               {.tag = call.signature_tag,
                .bytes = bytes,
                .kind = static_cast<std::uint32_t>(Kind::kBroadcast),
                .dtype = static_cast<std::uint32_t>(dtype),
                .root = root},
               call);
  if (root < 0 || root >= size_) {  // the same root on every rank: every rank throws
    throw InvalidArgumentError(label(call) + ": broadcast from rank " + std::to_string(root) + " of " +
                               std::to_string(size_));
  }
  if (bytes == 0) return;
  if (!through_buffer) {
    broadcast_bytes(buffer, bytes, root, call);
  } else if (rank_ != root) {
    std::memcpy(buffer, shared_->buffer(root, step), bytes);
  }
}

}  // namespace distribute::internal
