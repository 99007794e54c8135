// MpiCommunicator's collectives (exchange, all_reduce, all_gather_v,
// broadcast, barrier): each call picks its path, through node shared memory
// (node_shared_collectives.cc) or through MPI's messages (mpi_messages.cc).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/mpi_communicator_internal.h"
#include "comm/mpi/node_shared_memory.h"
#include "core/reduce_kernels.h"
#include "core/storage.h"
#include "distribute/dtype.h"
#include "distribute/errors.h"

namespace distribute::internal {
namespace {

// All-reduces that receive at most this many bytes per rank in all gather
// every input and reduce locally (one round); larger ones scatter slices.
// Measured at 2 workers: from 2 MiB of input, halving each rank's reduction
// work beats saving a round (docs/history/benchmarks.md, multi-worker).
constexpr std::size_t kGatherAllBytes = 1 << 20;
// All-reduces of more than 64 KiB and at most this many bytes go through node
// shared memory when every rank is on one host. Measured at 2 workers
// (docs/history/benchmarks.md, multi-worker): 1.2 to 1.9x faster than MPI's single
// copy from 256 KiB to 4 MiB, but 1.5x slower at 8 MiB, where the lock-step
// chunks cost more than the kernel's copy.
constexpr std::size_t kSharedAllReduceBytes = std::size_t{4} << 20;
// On one host, all-reduces of at most this many bytes move every input
// through the shared buffers in one step and every rank reduces all of them
// (as the header round does between hosts); larger ones are reduced slice by
// slice (shared_all_reduce).
constexpr std::size_t kSharedReduceAllBytes = std::size_t{64} << 10;
static_assert(kSharedReduceAllBytes <= NodeSharedMemory::kChunkBytes);
// ... and while what each rank reads that way, ranks x bytes, is at most
// this: the one step makes every rank read every input, the sliced path
// about three times the message whatever the ranks. With 2 ranks this is
// the 64 KiB above; with 16 it is 8 KiB, where 16 workers reading every
// input were 1.2 to 1.8x slower than MPI_Allreduce from 4 to 64 KiB (issue
// #36, on the 16-core device machine). A count of bytes moved, not yet
// measured on many cores (scripts/many_cores_check.sh measures 16 x 1).
constexpr std::size_t kSharedReduceAllReadBytes = std::size_t{128} << 10;

bool shared_reduce_all(int ranks, std::size_t bytes) {
  return bytes <= kSharedReduceAllBytes && static_cast<std::size_t>(ranks) * bytes <= kSharedReduceAllReadBytes;
}

// FNV-1a of every rank's block size: ranks that agree on them all agree on
// this (never 0, which says "no layout").
std::uint64_t hash_layout(const std::vector<std::size_t>& bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t b : bytes) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((static_cast<std::uint64_t>(b) >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  }
  return h == 0 ? 1 : h;
}

}  // namespace

std::vector<std::string> MpiCommunicator::exchange(std::string payload, const CollectiveCall& call) {
  Token token(*this);
  begin_call(call);
  if (shared_ != nullptr) return shared_exchange(std::move(payload), call);
  // The header round carries the tag and the payload's size, and the payload itself if it fits.
  const std::size_t inline_bytes = payload.size() <= kInlineBytes ? payload.size() : 0;
  std::shared_ptr<std::byte> outgoing;
  // (Up to kCopiedInlineBytes, the header round copies the payload itself.)
  if (inline_bytes > kCopiedInlineBytes) outgoing = sendable(payload);
  const void* from = outgoing ? static_cast<const void*>(outgoing.get()) : payload.data();
  const std::vector<Received>& headers = header_round(call.signature_tag, payload.size(), from, inline_bytes, call);
  std::vector<std::size_t> sizes;
  bool all_inline = true;
  for (const Received& h : headers) {
    sizes.push_back(static_cast<std::size_t>(h.header.size));
    all_inline &= h.inline_bytes == h.header.size;
  }
  if (all_inline) {
    std::vector<std::string> out;
    out.reserve(headers.size());
    for (const Received& h : headers) out.emplace_back(reinterpret_cast<const char*>(h.data), h.inline_bytes);
    return out;
  }
  std::size_t total = 0;
  for (std::size_t s : sizes) total += s;
  // Tensor storage, not a string: a receive left after a failure quarantines it (release()).
  const std::shared_ptr<std::byte> all = allocate_storage(total);
  if (!outgoing) outgoing = sendable(payload);
  gather_bytes(outgoing.get(), payload.size(), all.get(), sizes, call);
  std::vector<std::string> out;
  std::size_t at = 0;
  for (std::size_t s : sizes) {
    out.emplace_back(reinterpret_cast<const char*>(all.get()) + at, s);
    at += s;
  }
  return out;
}

// Kept whole: one Token for a cascade of paths by size (node shared memory,
// inline in the header round, one rank, gather, scatter then gather), each of
// which must compare the call's tags exactly once: `agreed` carries the
// shared-memory agreement to MPI's paths below.
// NOLINTNEXTLINE(readability-function-size): each path compares the tags once, tracked by `agreed`.
void MpiCommunicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                 const CollectiveCall& call, std::int64_t mean_divisor) {
  Token token(*this);
  begin_call(call);
  const std::size_t esz = size_of(dtype);
  const std::size_t bytes = count * esz;
  const std::int64_t divisor = mean_divisor > 0 ? mean_divisor : size_;
  const auto n = static_cast<std::size_t>(size_);
  bool agreed = false;  // the tags compared already
  if (shared_ != nullptr) {
    const NodeSharedMemory::Call mine{.tag = call.signature_tag,
                                      .bytes = bytes,
                                      .kind = static_cast<std::uint32_t>(Kind::kAllReduce),
                                      .dtype = static_cast<std::uint32_t>(dtype),
                                      .op = static_cast<std::uint32_t>(op)};
    if (shared_reduce_all(size_, bytes)) {
      // Small: every rank's input through its buffer, one step; every rank
      // reduces all of them in rank order (the same bits everywhere).
      const std::uint64_t step = shared_->next_step();
      if (bytes) std::memcpy(shared_->buffer(rank_, step), send, bytes);
      shared_begin(step, mine, call);
      std::vector<const void*>& srcs = shared_->sources();
      for (int q = 0; q < size_; ++q) srcs[static_cast<std::size_t>(q)] = shared_->buffer(q, step);
      if (bytes) reduce_sources(recv, srcs, count, dtype, op, divisor);
      return;
    }
    if (bytes <= kSharedAllReduceBytes) {
      shared_all_reduce(send, recv, count, dtype, op, divisor, mine, call);
      return;
    }
    agree(mine, call);  // then MPI's path, below
    agreed = true;
  }
  if (bytes <= kInlineBytes && size_ > 1) {
    // Small: the inputs travel in the header round, the only round; every
    // rank reduces all of them in rank order (the same bits everywhere).
    const std::vector<Received>& headers = header_round(call.signature_tag, bytes, send, bytes, call);
    std::vector<const void*> srcs(n);
    for (std::size_t q = 0; q < n; ++q) srcs[q] = headers[q].data;
    if (bytes) reduce_sources(recv, srcs, count, dtype, op, divisor);
    return;
  }
  if (size_ == 1) {
    check_tags(call);
    const void* srcs[1] = {send};
    if (op == ReduceOp::kMean && divisor > 1) {
      reduce_sources(recv, srcs, count, dtype, op, divisor);
    } else if (send != recv && bytes > 0) {
      std::memcpy(recv, send, bytes);
    }
    return;
  }
  std::vector<const void*> srcs(n);
  if (bytes * (n - 1) <= kGatherAllBytes) {
    // Latency: every rank receives every input and reduces them all in rank
    // order (the same bits everywhere): one round, as recursive doubling for 2,
    // the tags compared alongside (posted_gather). The own input is read where
    // it is, not copied into place.
    std::byte* all = scratch(bytes * n);
    const std::vector<std::size_t> counts(n, bytes);
    if (!agreed && call.signature_tag != 0 && bytes <= largest_tagged_block()) {
      posted_gather(send, bytes, all, counts, call, /*place_own=*/false);
    } else {
      if (!agreed) check_tags(call);
      gather_bytes(send, bytes, all, counts, call, /*place_own=*/false);
    }
    for (std::size_t q = 0; q < n; ++q) srcs[q] = all + q * bytes;
    srcs[me()] = send;
    reduce_sources(recv, srcs, count, dtype, op, divisor);
    return;
  }
  // Bandwidth: rank r receives slice r of every input, reduces it in rank
  // order, and the reduced slices are all-gathered into place.
  if (!agreed) check_tags(call);
  std::vector<std::size_t> slice_bytes(n), slice_displs(n);
  for (std::size_t q = 0; q < n; ++q) {
    const std::size_t begin = count * q / n, end = count * (q + 1) / n;
    slice_bytes[q] = (end - begin) * esz;
    slice_displs[q] = begin * esz;
  }
  const auto me = static_cast<std::size_t>(rank_);
  const std::size_t my_bytes = slice_bytes[me];
  // The slices received from the other ranks; kept by the communicator, so
  // that a receive left pending by a failure never writes into freed memory.
  std::byte* pieces = scratch(my_bytes * n);
  // Scatter: slice q of this rank's input goes to rank q, point to point.
  Messages m({pieces, my_bytes * n}, {const_cast<void*>(send), bytes});
  m.requests.reserve(2 * n);
  for (std::size_t q = 0; q < n; ++q) {
    if (q != me) post_receive(m, pieces + q * my_bytes, my_bytes, static_cast<int>(q), kDataTag, call);
  }
  for (std::size_t q = 0; q < n; ++q) {
    if (q == me) continue;
    post_send(m, static_cast<const std::byte*>(send) + slice_displs[q], slice_bytes[q], static_cast<int>(q), kDataTag,
              call);
  }
  wait(m, call);
  for (std::size_t q = 0; q < n; ++q) srcs[q] = pieces + q * my_bytes;
  srcs[me] = static_cast<const std::byte*>(send) + slice_displs[me];  // our own slice, read in place
  auto* mine = static_cast<std::byte*>(recv) + slice_displs[me];
  reduce_sources(mine, srcs, my_bytes / esz, dtype, op, divisor);
  // Gather: the reduced slices, into place on every rank.
  gather_bytes(mine, my_bytes, recv, slice_bytes, call);
}

void MpiCommunicator::all_gather_v(const void* send, void* recv, std::span<const std::size_t> counts, std::size_t outer,
                                   DType dtype, const CollectiveCall& call) {
  Token token(*this);
  begin_call(call);
  const std::size_t esz = size_of(dtype);
  std::vector<std::size_t> bytes(counts.size());
  std::size_t total = 0, largest = 0;
  for (std::size_t q = 0; q < counts.size(); ++q) {
    bytes[q] = counts[q] * outer * esz;
    total += bytes[q];
    largest = std::max(largest, bytes[q]);
  }
  const std::size_t mine = bytes[me()];
  // Every rank's block, rank by rank (each rank's `outer` rows together).
  std::vector<const std::byte*> blocks(counts.size());
  std::shared_ptr<std::byte> staged;
  const NodeSharedMemory::Call my_call{.tag = call.signature_tag,
                                       .bytes = mine,
                                       .layout = hash_layout(bytes),
                                       .kind = static_cast<std::uint32_t>(Kind::kAllGather),
                                       .dtype = static_cast<std::uint32_t>(dtype)};
  if (shared_ != nullptr && largest <= kSharedGatherBytes) {
    // One host: every block through its rank's buffer, one step; laid out
    // below straight from the buffers.
    const std::uint64_t step = shared_->next_step();
    if (mine) std::memcpy(shared_->buffer(rank_, step), send, mine);
    shared_begin(step, my_call, call);
    for (int q = 0; q < size_; ++q) blocks[static_cast<std::size_t>(q)] = shared_->buffer(q, step);
  } else if (shared_ == nullptr && (largest <= kPostedGatherBytes || size_ == 1)) {
    // Small: the blocks travel in the header round, the only round.
    const std::vector<Received>& in = header_round(call.signature_tag, 0, send, mine, call);
    for (std::size_t q = 0; q < counts.size(); ++q) blocks[q] = in[q].data;
  } else {
    // Larger: one message per block, into place (rows: into a staging
    // buffer, laid out below); with a tag, its header round alongside.
    std::byte* into = static_cast<std::byte*>(recv);
    if (outer != 1) {
      try {
        staged = allocate_storage(total);
      } catch (const std::bad_alloc&) {
        // The others are about to wait for this rank: fail the group rather than leave them waiting.
        const std::string message = label(call) + ": rank " + std::to_string(rank_) + " could not allocate " +
                                    std::to_string(total) +
                                    " bytes to stage an all-gather; this communicator "
                                    "cannot be used any more";
        abort(ErrorCode::kUnavailable, message, rank_);
        throw UnavailableError(message);
      }
      into = staged.get();
    }
    // (A receive that a failure leaves pending quarantines `into`, the
    // staging buffer or the caller's output: release().)
    if (shared_ != nullptr && shared_->single_copy()) {
      single_copy_gather(send, mine, into, bytes, my_call, call);
    } else if (shared_ == nullptr && call.signature_tag != 0 && largest <= largest_tagged_block()) {
      posted_gather(send, mine, into, bytes, call);
    } else {
      agree(my_call, call);
      gather_bytes(send, mine, into, bytes, call);
    }
    if (outer == 1) return;
    std::size_t at = 0;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      blocks[q] = staged.get() + at;
      at += bytes[q];
    }
  }
  // Laid out row by row: row o is every rank's row o, in rank order (empty
  // rows, however many, need no loop).
  auto* dst = static_cast<std::byte*>(recv);
  const std::size_t rows = total == 0 ? 0 : outer;
  for (std::size_t o = 0; o < rows; ++o) {
    for (std::size_t q = 0; q < counts.size(); ++q) {
      const std::size_t row = counts[q] * esz;
      const std::byte* src = blocks[q] + o * row;
      if (row && src != dst) std::memcpy(dst, src, row);  // equal: one rank, in place
      dst += row;
    }
  }
}

void MpiCommunicator::broadcast(void* buffer, std::size_t count, DType dtype, int root, const CollectiveCall& call) {
  Token token(*this);
  begin_call(call);
  const std::size_t bytes = count * size_of(dtype);
  if (shared_ != nullptr) {
    shared_broadcast(buffer, bytes, dtype, root, call);
    return;
  }
  check_tags(call);
  if (size_ > 1 && bytes > 0) broadcast_bytes(buffer, bytes, root, call);
}

void MpiCommunicator::barrier(const CollectiveCall& call) {
  Token token(*this);
  begin_call(call);
  if (shared_ != nullptr) {
    shared_begin(shared_->next_step(), {.tag = call.signature_tag, .kind = static_cast<std::uint32_t>(Kind::kBarrier)},
                 call);
    return;
  }
  header_round(call.signature_tag, 0, nullptr, 0, call);  // a message from every rank to every rank
}

}  // namespace distribute::internal
