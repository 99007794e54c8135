// MpiCommunicator's messages: waiting for requests and releasing them after a
// failure, the header round, point-to-point pieces, and the all-gathers and
// broadcast of bytes that the collectives build on.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/mpi_communicator_internal.h"
#include "core/storage.h"
#include "distribute/errors.h"

namespace distribute::internal {

void MpiCommunicator::wait_all(MPI_Request* requests, int count, int receives, const CollectiveCall& call, Area area,
                               Area sent, MPI_Status* statuses) {
  try {
    poll_all(requests, count, call, statuses);
  } catch (...) {
    release(requests, count, receives, area, sent);
    throw;
  }
}

void MpiCommunicator::release(MPI_Request* requests, int count, int receives, Area area, Area sent) noexcept {
  // Receives still posted would write into buffers that are about to be
  // freed: cancel them (local for a receive not yet matched). One that a
  // message is already filling cannot be cancelled; it is given a moment,
  // then left, and its area quarantined: on a transport that moves a message
  // in pieces (TCP between hosts) the rest may still arrive, and the area may
  // be the caller's output tensor. Sends get the same moment; one still
  // pending after it may read its buffer later, and a late peer would take
  // what it reads as this rank's data, so that buffer is quarantined too.
  for (int i = 0; i < receives; ++i) {
    if (requests[i] != MPI_REQUEST_NULL) MPI_Cancel(&requests[i]);
  }
  const Clock::time_point give_up = Clock::now() + std::chrono::milliseconds(100);
  bool receive_left = false, send_left = false;
  for (int i = 0; i < count; ++i) {
    // Each request is tested at least once, even after the grace is spent:
    // one that has finished (MPI_Testall leaves finished requests in place
    // while others are pending) must not have its area kept for nothing.
    int done = 0;
    while (requests[i] != MPI_REQUEST_NULL) {
      MPI_Test(&requests[i], &done, MPI_STATUS_IGNORE);
      if (done || Clock::now() >= give_up) break;
    }
    (i < receives ? receive_left : send_left) |= requests[i] != MPI_REQUEST_NULL && !done;
  }
  for (const Area& a : {receive_left ? area : Area{}, send_left ? sent : Area{}}) {
    if (a.bytes == 0) continue;
    try {
      quarantine_storage(a.data, a.bytes);
    } catch (const std::bad_alloc&) {
      // Out of memory, after a failure: nothing better to do than go on.
    }
  }
  for (int i = 0; i < count; ++i) {
    if (requests[i] != MPI_REQUEST_NULL) MPI_Request_free(&requests[i]);
  }
}

void MpiCommunicator::poll_all(MPI_Request* requests, int count, const CollectiveCall& call, MPI_Status* statuses) {
  poll(call, [&] {
    int done = 0;
    check(MPI_Testall(count, requests, &done, statuses != nullptr ? statuses : MPI_STATUSES_IGNORE), "MPI_Testall",
          call);
    return done != 0;
  });
}

const std::vector<MpiCommunicator::Received>& MpiCommunicator::header_round(std::uint64_t tag, std::uint64_t size,
                                                                            const void* data, std::size_t inline_bytes,
                                                                            const CollectiveCall& call) {
  post_header_round(tag, size, data, inline_bytes, call);
  return finish_header_round(call, nullptr);
}

void MpiCommunicator::post_header_round(std::uint64_t tag, std::uint64_t size, const void* data,
                                        std::size_t inline_bytes, const CollectiveCall& call) {
  constexpr std::size_t kSlot = sizeof(Header) + kInlineBytes;
  const auto n = static_cast<std::size_t>(size_);
  ++header_rounds_;
  Header& header_out = out_->header;
  header_out = Header{tag, size};
  header_in_.resize(kSlot * n);
  received_.assign(n, Received{});
  received_[me()] = Received{header_out, static_cast<const std::byte*>(data), inline_bytes};
  std::vector<MPI_Request>& requests = header_requests_;
  requests.clear();
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    requests.emplace_back(MPI_REQUEST_NULL);
    check(MPI_Irecv(header_in_.data() + kSlot * static_cast<std::size_t>(q), static_cast<int>(kSlot), MPI_BYTE, q,
                    kHeaderTag, comm_, &requests.back()),
          "MPI_Irecv", call);
  }
  // One message: the header and the data; a little data is copied behind the
  // header, more is sent straight from where it is.
  MPI_Datatype message = MPI_DATATYPE_NULL;
  const bool copy = inline_bytes <= kCopiedInlineBytes;
  header_sent_ = copy ? Area{} : Area{const_cast<void*>(data), inline_bytes};
  if (copy) {
    std::memcpy(out_->small.data(), &header_out, sizeof(Header));
    if (inline_bytes) std::memcpy(out_->small.data() + sizeof(Header), data, inline_bytes);
  } else if (size_ > 1) {
    MPI_Aint where[2];
    MPI_Get_address(&header_out, &where[0]);
    MPI_Get_address(inline_bytes ? data : &header_out, &where[1]);
    const int lengths[2] = {static_cast<int>(sizeof(Header)), static_cast<int>(inline_bytes)};
    check(MPI_Type_create_hindexed(2, lengths, where, MPI_BYTE, &message), "MPI_Type_create_hindexed", call);
    check(MPI_Type_commit(&message), "MPI_Type_commit", call);
  }
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    requests.emplace_back(MPI_REQUEST_NULL);
    check(copy ? MPI_Isend(out_->small.data(), static_cast<int>(sizeof(Header) + inline_bytes), MPI_BYTE, q, kHeaderTag,
                           comm_, &requests.back())
               : MPI_Isend(MPI_BOTTOM, 1, message, q, kHeaderTag, comm_, &requests.back()),
          "MPI_Isend", call);
  }
  if (message != MPI_DATATYPE_NULL) MPI_Type_free(&message);  // freed by MPI when the sends are done
}

const std::vector<MpiCommunicator::Received>& MpiCommunicator::finish_header_round(
    const CollectiveCall& call, const std::vector<std::size_t>* sizes_posted) {
  constexpr std::size_t kSlot = sizeof(Header) + kInlineBytes;
  std::vector<MPI_Request>& requests = header_requests_;
  std::vector<MPI_Status>& statuses = header_statuses_;
  statuses.resize(requests.size());
  wait_all(requests.data(), static_cast<int>(requests.size()), size_ - 1, call, {}, header_sent_, statuses.data());
  std::size_t r = 0;
  for (std::size_t q = 0; q < received_.size(); ++q) {
    if (q == me()) continue;
    Received& in = received_[q];
    int bytes = 0;
    MPI_Get_count(&statuses[r++], MPI_BYTE, &bytes);
    const std::byte* slot = header_in_.data() + kSlot * q;
    std::memcpy(&in.header, slot, sizeof(Header));
    in.data = slot + sizeof(Header);
    in.inline_bytes = static_cast<std::size_t>(bytes) - sizeof(Header);
  }
  bool mismatch = false;
  for (const Received& in : received_) {
    mismatch |= in.header.tag != received_[0].header.tag || (in.header.tag & 1) != 0;
  }
  if (!mismatch) return received_;
  // Peers in a posted all-gather sent their blocks behind their headers:
  // receive and drop those that no receive of this rank matches, so that no
  // later call finds them; one at a time, into a buffer of the largest,
  // freed after.
  std::size_t largest = 0;
  for (std::size_t q = 0; q < received_.size(); ++q) {
    const std::optional<std::size_t> bytes = announced_block(q);
    if (!bytes || (sizes_posted != nullptr && (*sizes_posted)[q] == *bytes)) continue;
    if (*bytes > largest) {
      try {
        drain_ = allocate_storage(*bytes);
      } catch (const std::bad_alloc&) {
        // Peers wait for this rank to take their blocks: fail the group rather than leave them waiting.
        const std::string message = label(call) + ": rank " + std::to_string(rank_) + " could not allocate " +
                                    std::to_string(*bytes) + " bytes to receive and drop rank " + std::to_string(q) +
                                    "'s block after a mismatch; this communicator cannot be used any more";
        abort(ErrorCode::kUnavailable, message, rank_);
        throw UnavailableError(message);
      }
      largest = *bytes;
    }
    MPI_Request drain = MPI_REQUEST_NULL;  // one message: at most largest_tagged_block()
    check(MPI_Irecv(drain_.get(), static_cast<int>(*bytes), MPI_BYTE, static_cast<int>(q),
                    block_tag(*bytes, header_rounds_ - 1), comm_, &drain),
          "MPI_Irecv", call);
    wait_all(&drain, 1, 1, call, {drain_.get(), *bytes});
  }
  drain_.reset();
  throw SignatureMismatch();
}

void MpiCommunicator::post_receive(Messages& m, void* into, std::size_t bytes, int peer, int tag,
                                   const CollectiveCall& call) {
  if (m.receives != static_cast<int>(m.requests.size())) {
    throw InternalError(label(call) + ": a receive posted after a send");  // release() counts receives first
  }
  auto* at = static_cast<std::byte*>(into);
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t piece = std::min(bytes - done, max_message_bytes_);
    m.requests.emplace_back(MPI_REQUEST_NULL);
    const int result = MPI_Irecv(at + done, static_cast<int>(piece), MPI_BYTE, peer, tag, comm_, &m.requests.back());
    if (result != MPI_SUCCESS) post_failed(m, result, "MPI_Irecv", call);
    ++m.receives;
    done += piece;
  }
}

void MpiCommunicator::post_send(Messages& m, const void* from, std::size_t bytes, int peer, int tag,
                                const CollectiveCall& call) {
  const auto* at = static_cast<const std::byte*>(from);
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t piece = std::min(bytes - done, max_message_bytes_);
    m.requests.emplace_back(MPI_REQUEST_NULL);
    const int result = MPI_Isend(at + done, static_cast<int>(piece), MPI_BYTE, peer, tag, comm_, &m.requests.back());
    if (result != MPI_SUCCESS) post_failed(m, result, "MPI_Isend", call);
    done += piece;
  }
}

void MpiCommunicator::post_failed(Messages& m, int mpi_result, const char* what, const CollectiveCall& call) {
  m.requests.pop_back();  // the one MPI refused
  release(m.requests.data(), static_cast<int>(m.requests.size()), m.receives, m.area, m.sent);
  check(mpi_result, what, call);  // throws
}

void MpiCommunicator::check_tags(const CollectiveCall& call) {
  if (call.signature_tag == 0) return;
  header_round(call.signature_tag, 0, nullptr, 0, call);
}

void MpiCommunicator::gather_bytes(const void* send, std::size_t send_bytes, void* recv,
                                   const std::vector<std::size_t>& counts, const CollectiveCall& call, bool place_own) {
  // Point to point: every rank sends its block to every other (messages
  // between two ranks are matched in order, so one tag serves every call).
  auto* out = static_cast<std::byte*>(recv);
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  Messages m({out, total}, {const_cast<void*>(send), send_bytes});
  m.requests.reserve(2 * counts.size());
  std::size_t at = 0;
  std::byte* own = nullptr;
  for (std::size_t q = 0; q < counts.size(); ++q) {
    const int peer = static_cast<int>(q);
    if (peer == rank_) {
      own = out + at;
    } else {
      post_receive(m, out + at, counts[q], peer, kDataTag, call);
    }
    at += counts[q];
  }
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) post_send(m, send, send_bytes, q, kDataTag, call);
  }
  if (place_own && own != nullptr && own != send && send_bytes > 0) std::memcpy(own, send, send_bytes);
  wait(m, call);
}

void MpiCommunicator::posted_gather(const void* send, std::size_t send_bytes, std::byte* recv,
                                    const std::vector<std::size_t>& counts, const CollectiveCall& call,
                                    bool place_own) {
  // Every block is one message: callers come here only with blocks of at
  // most largest_tagged_block().
  const int bytes = static_cast<int>(send_bytes);
  std::vector<MPI_Request>& blocks = block_requests_;
  blocks.clear();
  const std::uint64_t round = header_rounds_;  // the header round posted below
  // Every peer's block is received straight into place, the receive posted
  // before any header leaves: a block that arrives is never held back for its
  // header's round. Zero-byte blocks are sent too, so every peer's header is
  // followed by exactly one block.
  std::size_t at = 0;
  for (std::size_t c : counts) at += c;
  std::byte* own = nullptr;
  int receives = 0;
  const Area sent{const_cast<void*>(send), send_bytes};
  try {
    std::size_t offset = 0;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      if (q == me()) {
        own = recv + offset;
      } else {
        blocks.emplace_back(MPI_REQUEST_NULL);
        check(MPI_Irecv(recv + offset, static_cast<int>(counts[q]), MPI_BYTE, static_cast<int>(q),
                        block_tag(counts[q], round), comm_, &blocks.back()),
              "MPI_Irecv", call);
        ++receives;
      }
      offset += counts[q];
    }
    post_header_round(call.signature_tag, kBlockFollows | static_cast<std::uint64_t>(bytes), nullptr, 0, call);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      blocks.emplace_back(MPI_REQUEST_NULL);
      check(MPI_Isend(send, bytes, MPI_BYTE, q, block_tag(send_bytes, round), comm_, &blocks.back()), "MPI_Isend",
            call);
    }
    finish_header_round(call, &counts);
  } catch (const SignatureMismatch&) {
    // finish_header_round has received the blocks of another size. A peer
    // whose header announced a block of the size expected has sent it into
    // its receive here. Any other peer sent none under that tag in this
    // round, and cannot before this rank's next header (its next call's
    // block has the other parity, block_tag), so its receive is cancelled
    // unmatched.
    std::size_t r = 0;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      if (q == me()) continue;
      if (announced_block(q) != counts[q]) MPI_Cancel(&blocks[r]);
      ++r;
    }
    wait_all(blocks.data(), static_cast<int>(blocks.size()), receives, call, {recv, at}, sent);
    throw;
  } catch (...) {
    release(blocks.data(), static_cast<int>(blocks.size()), receives, {recv, at}, sent);
    throw;
  }
  if (place_own && own != nullptr && own != send && bytes > 0) std::memcpy(own, send, send_bytes);
  wait_all(blocks.data(), static_cast<int>(blocks.size()), receives, call, {recv, at}, sent);
}

std::shared_ptr<std::byte> MpiCommunicator::sendable(const std::string& payload) {
  std::shared_ptr<std::byte> copy = allocate_storage(payload.size());
  if (copy) std::memcpy(copy.get(), payload.data(), payload.size());
  return copy;
}

void MpiCommunicator::broadcast_bytes(void* buffer, std::size_t bytes, int root, const CollectiveCall& call) {
  // The root sends to every other rank, point to point.
  const bool sends = rank_ == root;
  Messages m(sends ? Area{} : Area{buffer, bytes}, sends ? Area{buffer, bytes} : Area{});
  for (int q = 0; q < size_ && sends; ++q) {
    if (q != root) post_send(m, buffer, bytes, q, kDataTag, call);
  }
  if (!sends) post_receive(m, buffer, bytes, root, kDataTag, call);
  wait(m, call);
}

}  // namespace distribute::internal
