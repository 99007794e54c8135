#include "comm/threads/shared_memory_communicator.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/reduce_kernels.h"
#include "core/storage.h"
#include "core/whole_number.h"
#include "distribute/errors.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace distribute::internal {

namespace {
// The most members a communicator reduces from without a heap allocation.
constexpr int kStackSources = 64;
// all_reduce's and reduce_scatter's latency paths are one small round.
static_assert(SharedMemoryCommunicator::kLatencyPathBytes <= LocalGroup::kSmallBytes);

// memcpy with non-temporal stores where the destination allows it.
void stream_copy(std::byte* dst, const std::byte* src, std::size_t n) {
#if defined(__SSE2__)
  std::size_t head = (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16;
  head = std::min(head, n);
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  const std::size_t vec = n / 64 * 64;
  for (std::size_t i = 0; i < vec; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + vec, src + vec, n - vec);
#else
  std::memcpy(dst, src, n);
#endif
}

// The per-member source pointers of one reduction: on the stack up to
// kStackSources members, on the heap beyond.
class SourceList {
 public:
  explicit SourceList(int n) : heap_(n > kStackSources ? static_cast<std::size_t>(n) : 0) {}
  const void** data() { return heap_.empty() ? stack_ : heap_.data(); }

 private:
  const void* stack_[kStackSources];
  std::vector<const void*> heap_;
};

// Streaming stores are weakly ordered: fence them before the round that
// tells the other members the data is there.
void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Where a streaming all_reduce reduces a chunk before streaming it to every
// output: one chunk per thread, allocated on first use.
std::byte* stream_scratch() {
  thread_local std::unique_ptr<std::byte[]> scratch;
  if (!scratch) scratch = std::make_unique<std::byte[]>(SharedMemoryCommunicator::kStreamChunkBytes);
  return scratch.get();
}

// One chunk of all_reduce's bandwidth path, reduced from `srcs` (len
// elements each): into this member's output `own`, then copied from there,
// still in cache, to every other member's output (`out_of(q)`); or, with a
// `scratch` buffer (streaming), into it and streamed to every output, this
// member's too (the caller fences).
template <class OutOf>
void reduce_chunk(std::span<const void* const> srcs, std::size_t len, DType dtype, ReduceOp op, std::int64_t divisor,
                  std::byte* own, std::byte* scratch, int rank, OutOf out_of) {
  const std::size_t bytes = len * size_of(dtype);
  reduce_sources(scratch != nullptr ? scratch : own, srcs, len, dtype, op, divisor);
  for (int q = 0; q < static_cast<int>(srcs.size()); ++q) {
    if (scratch != nullptr) {
      stream_copy(out_of(q), scratch, bytes);
    } else if (q != rank) {
      std::memcpy(out_of(q), own, bytes);
    }
  }
}

// Elements per chunk of the bandwidth path, streaming (from `scratch`) or not.
std::size_t chunk_elements(const std::byte* scratch, std::size_t esz) {
  return std::max<std::size_t>(
      1,
      (scratch != nullptr ? SharedMemoryCommunicator::kStreamChunkBytes : SharedMemoryCommunicator::kChunkBytes) / esz);
}

// Calls f(segment, at, len, off) for each chunk of at most `chunk` elements
// of elements [begin, end) of the segments' concatenation, walked segment by
// segment: `at` is the chunk's first element in the concatenation, `off` its
// byte offset in its segment.
template <class F>
void for_each_owned_chunk(std::span<const Communicator::Segment> segments, std::size_t begin, std::size_t end,
                          std::size_t chunk, std::size_t esz, F&& f) {
  std::size_t seg_start = 0;
  for (std::size_t s = 0; s < segments.size() && seg_start < end; seg_start += segments[s].count, ++s) {
    const std::size_t lo = std::max(begin, seg_start);
    const std::size_t hi = std::min(end, seg_start + segments[s].count);
    for (std::size_t at = lo; at < hi; at += chunk) f(s, at, std::min(chunk, hi - at), (at - seg_start) * esz);
  }
}

// A LocalGroup::Maker: `*size` bytes from the storage cache every thread
// shares (the output of a shared collective goes back from whichever
// replica lets go of it last), null if that fails.
std::shared_ptr<void> allocate_shared_output(const void* size) noexcept {
  try {
    return allocate_shared_storage(*static_cast<const std::size_t*>(size));
  } catch (...) {
    return nullptr;
  }
}

bool intel_cpu() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool intel = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") != 0;
  }();
  return intel;
#else
  return false;
#endif
}
}  // namespace

std::size_t SharedMemoryCommunicator::default_all_reduce_stream_bytes() {
  const std::optional<std::size_t> bytes =
      env_whole_number("DISTRIBUTE_STREAM_ALL_REDUCE_BYTES", "a whole number of bytes (0: never stream)");
  if (!bytes) return intel_cpu() ? kAllReduceStreamBytesIntel : kNeverStream;
  return *bytes == 0 ? kNeverStream : *bytes;
}

std::size_t SharedMemoryCommunicator::default_one_round_read_bytes() {
  const std::optional<std::size_t> bytes =
      env_whole_number("DISTRIBUTE_ONE_ROUND_READ_BYTES", "a whole number of bytes");
  return bytes ? *bytes : kOneRoundReadBytes;
}

void SharedMemoryCommunicator::copy_broadcast_part(void* dst, const void* src, std::size_t n,
                                                   std::size_t message_bytes) {
  if (message_bytes >= kStreamBytes) {
    stream_copy(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), n);
    stream_fence();
  } else {
    std::memcpy(dst, src, n);
  }
}

SharedMemoryCommunicator::SharedMemoryCommunicator(std::shared_ptr<LocalGroup> group, int rank,
                                                   std::size_t all_reduce_stream_bytes, std::size_t share_reduce_above)
    : group_(std::move(group)),
      rank_(rank),
      all_reduce_stream_bytes_(all_reduce_stream_bytes),
      share_reduce_above_(share_reduce_above),
      one_round_read_bytes_(
          parse_whole_number(std::getenv("DISTRIBUTE_ONE_ROUND_READ_BYTES")).value_or(kOneRoundReadBytes)) {}

std::vector<std::string> SharedMemoryCommunicator::exchange(std::string payload, const CollectiveCall& call) {
  const auto& entries =
      group_->arrive(rank_, LocalGroup::Entry{.payload = std::move(payload), .tag = call.signature_tag}, call);
  std::vector<std::string> all;
  all.reserve(entries.size());
  for (const auto& e : entries) all.push_back(e.payload);
  return all;
}

void SharedMemoryCommunicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                          const CollectiveCall& call, std::int64_t mean_divisor) {
  const int n = size();
  const std::size_t esz = size_of(dtype);
  const std::size_t bytes = count * esz;
  const std::int64_t divisor = mean_divisor > 0 ? mean_divisor : n;
  SourceList source_list(n);
  const void** srcs = source_list.data();

  if (two_small_rounds(bytes)) {
    all_reduce_two_rounds(send, recv, count, dtype, op, divisor, call, srcs);
    return;
  }
  if (bytes <= kLatencyPathBytes) {
    // Latency path: one small round; every member reduces every member's
    // copy, straight from the lines that announce its arrival.
    const auto data = group_->arrive_small(rank_, send, bytes, call);
    for (int q = 0; q < n; ++q) srcs[q] = data[static_cast<std::size_t>(q)];
    if (n == 1 && !(op == ReduceOp::kMean && divisor > 1)) {
      if (bytes) std::memcpy(recv, srcs[0], bytes);
    } else {
      reduce_sources(recv, {srcs, static_cast<std::size_t>(n)}, count, dtype, op, divisor);
    }
    return;
  }

  // Bandwidth path: each member owns one slice, reduced chunk by chunk. The
  // scratch buffer comes first: nothing may throw between the data round
  // and the release round.
  std::byte* scratch = streams(bytes) ? stream_scratch() : nullptr;
  const std::size_t chunk = chunk_elements(scratch, esz);
  const auto& entries = group_->arrive(rank_, {.send = send, .recv = recv, .tag = call.signature_tag}, call);
  const std::size_t begin = owned_begin(count);
  const std::size_t end = owned_end(count);
  for (std::size_t at = begin; at < end; at += chunk) {
    const std::size_t len = std::min(chunk, end - at);
    for (int q = 0; q < n; ++q) {
      srcs[q] = static_cast<const std::byte*>(entries[static_cast<std::size_t>(q)].send) + at * esz;
    }
    auto* out = static_cast<std::byte*>(recv) + at * esz;
    if (n == 1 && !(op == ReduceOp::kMean && divisor > 1)) {
      if (out != srcs[0]) std::memcpy(out, srcs[0], len * esz);
      continue;
    }
    reduce_chunk({srcs, static_cast<std::size_t>(n)}, len, dtype, op, divisor, out, scratch, rank_,
                 [&](int q) { return static_cast<std::byte*>(entries[static_cast<std::size_t>(q)].recv) + at * esz; });
  }
  if (scratch != nullptr) stream_fence();
  if (n > 1) group_->release(rank_, call);  // nobody leaves while others still use its buffers
}

void SharedMemoryCommunicator::all_reduce_two_rounds(const void* send, void* recv, std::size_t count, DType dtype,
                                                     ReduceOp op, std::int64_t divisor, const CollectiveCall& call,
                                                     const void** srcs) {
  const int n = size();
  const std::size_t esz = size_of(dtype);
  auto* out = static_cast<std::byte*>(recv);
  const std::size_t begin = owned_begin(count);
  const std::size_t end = owned_end(count);
  // Round one carries every member's input; this member reduces its slice
  // of all of them, in member order (the bits of the one-round path).
  const auto inputs = group_->arrive_small(rank_, send, count * esz, call);
  for (int q = 0; q < n; ++q) srcs[q] = inputs[static_cast<std::size_t>(q)] + begin * esz;
  if (end > begin)
    reduce_sources(out + begin * esz, {srcs, static_cast<std::size_t>(n)}, end - begin, dtype, op, divisor);
  // Round two carries every member's reduced slice to every other member.
  const auto slices = group_->arrive_small(rank_, out + begin * esz, (end - begin) * esz, call);
  for (int q = 0; q < n; ++q) {
    const std::size_t q_begin = slice_begin(count, q, n);
    const std::size_t q_end = slice_begin(count, q + 1, n);
    if (q != rank_ && q_end > q_begin) {
      std::memcpy(out + q_begin * esz, slices[static_cast<std::size_t>(q)], (q_end - q_begin) * esz);
    }
  }
}

void SharedMemoryCommunicator::all_reduce_segments(std::span<const Segment> segments, DType dtype, ReduceOp op,
                                                   const CollectiveCall& call, std::int64_t mean_divisor) {
  const int n = size();
  const std::size_t esz = size_of(dtype);
  std::size_t total = 0;
  for (const Segment& seg : segments) total += seg.count;
  if (n == 1 || total * esz <= kLatencyPathBytes) {
    Communicator::all_reduce_segments(segments, dtype, op, call, mean_divisor);  // small: stage, one round
    return;
  }
  const std::int64_t divisor = mean_divisor > 0 ? mean_divisor : n;
  SourceList source_list(n);  // allocations before the data round, as all_reduce's
  const void** srcs = source_list.data();
  std::byte* scratch = streams(total * esz) ? stream_scratch() : nullptr;
  const std::size_t chunk = chunk_elements(scratch, esz);
  // Every member publishes its segment table; all tables have the same counts.
  const auto& entries = group_->arrive(rank_, {.send = segments.data(), .tag = call.signature_tag}, call);
  auto table = [&](int q) { return static_cast<const Segment*>(entries[static_cast<std::size_t>(q)].send); };
  for_each_owned_chunk(segments, owned_begin(total), owned_end(total), chunk, esz,
                       [&](std::size_t s, std::size_t, std::size_t len, std::size_t off) {
                         for (int q = 0; q < n; ++q) srcs[q] = static_cast<const std::byte*>(table(q)[s].send) + off;
                         reduce_chunk({srcs, static_cast<std::size_t>(n)}, len, dtype, op, divisor,
                                      static_cast<std::byte*>(segments[s].recv) + off, scratch, rank_,
                                      [&](int q) { return static_cast<std::byte*>(table(q)[s].recv) + off; });
                       });
  if (scratch != nullptr) stream_fence();
  group_->release(rank_, call);  // nobody leaves while others still use its buffers
}

std::shared_ptr<std::byte> SharedMemoryCommunicator::all_reduce_shared(std::span<const Segment> segments, DType dtype,
                                                                       ReduceOp op, const CollectiveCall& call,
                                                                       std::int64_t mean_divisor) {
  const int n = size();
  const std::size_t esz = size_of(dtype);
  std::size_t total = 0;
  for (const Segment& seg : segments) total += seg.count;
  const std::size_t bytes = total * esz;
  // The latency path keeps its one round; up to share_reduce_above each
  // member's own output is cheaper than the shared one (no allocation
  // inside the round, no shared count); above, the bandwidth path takes two
  // rounds anyway, so one output for all costs no round.
  if (!shares_reduce(bytes)) return Communicator::all_reduce_shared(segments, dtype, op, call, mean_divisor);
  const std::int64_t divisor = mean_divisor > 0 ? mean_divisor : n;
  SourceList source_list(n);  // allocations before the data round, as all_reduce's
  const void** srcs = source_list.data();
  std::byte* scratch = streams(bytes) ? stream_scratch() : nullptr;
  const std::size_t chunk = chunk_elements(scratch, esz);
  std::shared_ptr<void> made;
  const auto& entries = group_->arrive_making(rank_, {.send = segments.data(), .tag = call.signature_tag}, call,
                                              allocate_shared_output, &bytes, made);
  auto out = std::static_pointer_cast<std::byte>(std::move(made));
  if (!out) {
    group_->release(rank_, call);  // as every member does: the group stays in step
    throw std::bad_alloc();
  }
  auto table = [&](int q) { return static_cast<const Segment*>(entries[static_cast<std::size_t>(q)].send); };
  // This member's slice, reduced once from every member's input into the
  // one output (through the thread's chunk, and streamed, when streaming).
  for_each_owned_chunk(segments, owned_begin(total), owned_end(total), chunk, esz,
                       [&](std::size_t s, std::size_t at, std::size_t len, std::size_t off) {
                         for (int q = 0; q < n; ++q) srcs[q] = static_cast<const std::byte*>(table(q)[s].send) + off;
                         std::byte* dst = out.get() + at * esz;
                         reduce_sources(scratch != nullptr ? scratch : dst, {srcs, static_cast<std::size_t>(n)}, len,
                                        dtype, op, divisor);
                         if (scratch != nullptr) stream_copy(dst, scratch, len * esz);
                       });
  if (scratch != nullptr) stream_fence();
  group_->release(rank_, call);  // nobody reads the output before every slice is in
  return out;
}

void SharedMemoryCommunicator::reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts,
                                              DType dtype, ReduceOp op, const CollectiveCall& call,
                                              std::int64_t mean_divisor) {
  const int n = size();
  const std::size_t esz = size_of(dtype);
  std::size_t total = 0;
  std::size_t offset = 0;  // of this member's block
  for (int q = 0; q < n; ++q) {
    if (q == rank_) offset = total;
    total += counts[static_cast<std::size_t>(q)];
  }
  const std::size_t mine = counts[static_cast<std::size_t>(rank_)];
  const std::int64_t divisor = mean_divisor > 0 ? mean_divisor : n;
  const bool identity = n == 1 && !(op == ReduceOp::kMean && divisor > 1);
  SourceList source_list(n);
  const void** srcs = source_list.data();
  // Reduces elements [at, at + len) of this member's block into recv, from
  // every member's input (`input_of(q)`).
  auto reduce_block = [&](const auto& input_of, std::size_t at, std::size_t len) {
    for (int q = 0; q < n; ++q) srcs[q] = static_cast<const std::byte*>(input_of(q)) + (offset + at) * esz;
    auto* out = static_cast<std::byte*>(recv) + at * esz;
    if (identity) {
      std::memcpy(out, srcs[0], len * esz);
    } else {
      reduce_sources(out, {srcs, static_cast<std::size_t>(n)}, len, dtype, op, divisor);
    }
  };

  if (total * esz <= kLatencyPathBytes) {
    // Latency path: one small round, as all_reduce's.
    const auto data = group_->arrive_small(rank_, send, total * esz, call);
    if (mine) reduce_block([&](int q) { return data[static_cast<std::size_t>(q)]; }, 0, mine);
    return;
  }
  // Bandwidth path: this member's block only, chunk by chunk from every input.
  const auto& entries = group_->arrive(rank_, {.send = send, .tag = call.signature_tag}, call);
  const auto input_of = [&](int q) { return entries[static_cast<std::size_t>(q)].send; };
  const std::size_t chunk = std::max<std::size_t>(1, kChunkBytes / esz);
  for (std::size_t at = 0; at < mine; at += chunk) reduce_block(input_of, at, std::min(chunk, mine - at));
  if (n > 1) group_->release(rank_, call);  // nobody leaves while others still read its input
}

void SharedMemoryCommunicator::all_gather_v(const void* send, void* recv, std::span<const std::size_t> counts,
                                            std::size_t outer, DType dtype, const CollectiveCall& call) {
  const int n = size();
  const std::size_t esz = size_of(dtype);
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  total *= outer * esz;
  const std::size_t mine = counts[static_cast<std::size_t>(rank_)] * outer * esz;
  // Small contributions travel in the lines of a small round (up to
  // LocalGroup::kSmallBytes) or through the inline areas: one round.
  const std::size_t largest = *std::max_element(counts.begin(), counts.end()) * outer * esz;
  const bool inline_path = largest <= LocalGroup::kInlineBytes;
  // Every member's rows, in member order, into this member's output.
  const bool streaming = total >= kStreamBytes;
  const auto gather = [&](auto&& source_of) {
    auto* dst = static_cast<std::byte*>(recv);
    const std::size_t rows = total == 0 ? 0 : outer;  // empty rows, however many, need no loop
    for (std::size_t o = 0; o < rows; ++o) {
      for (int q = 0; q < n; ++q) {
        const std::size_t bytes = counts[static_cast<std::size_t>(q)] * esz;
        if (bytes == 0) continue;
        const auto* src = static_cast<const std::byte*>(source_of(q)) + o * bytes;
        streaming ? stream_copy(dst, src, bytes) : static_cast<void>(std::memcpy(dst, src, bytes));
        dst += bytes;
      }
    }
    if (streaming) stream_fence();
  };
  if (largest <= LocalGroup::kSmallBytes) {
    const auto data = group_->arrive_small(rank_, send, mine, call);
    gather([&](int q) { return data[static_cast<std::size_t>(q)]; });
    return;
  }
  const void* published = send;
  if (inline_path) {
    std::byte* area = group_->inline_area(rank_);
    if (mine) std::memcpy(area, send, mine);
    published = area;
  }
  const auto& entries = group_->arrive(rank_, {.send = published, .recv = recv, .tag = call.signature_tag}, call);
  gather([&](int q) { return entries[static_cast<std::size_t>(q)].send; });
  if (!inline_path && n > 1) group_->release(rank_, call);
}

std::shared_ptr<std::byte> SharedMemoryCommunicator::all_gather_v_shared(const void* send,
                                                                         std::span<const std::size_t> counts,
                                                                         std::size_t outer, DType dtype,
                                                                         const CollectiveCall& call) {
  const int n = size();
  const std::size_t esz = size_of(dtype);
  const std::size_t largest = *std::max_element(counts.begin(), counts.end()) * outer * esz;
  // Small contributions keep the one-round path: a shared output needs a
  // second round (nobody reads it before every block is in), which the
  // copying path takes anyway.
  if (n == 1 || !shares_gather(largest)) return Communicator::all_gather_v_shared(send, counts, outer, dtype, call);
  std::size_t row = 0;     // bytes of one output row
  std::size_t before = 0;  // bytes of a row ahead of this member's block
  for (std::size_t q = 0; q < counts.size(); ++q) {
    if (static_cast<int>(q) == rank_) before = row;
    row += counts[q] * esz;
  }
  const std::size_t mine = counts[static_cast<std::size_t>(rank_)] * esz;
  // The member that completes the data round allocates the output: by then
  // every member has let go of what it let go before the call, so a loop
  // that drops its last result first gets the same block back every time.
  const std::size_t bytes = row * outer;
  std::shared_ptr<void> made;
  group_->arrive_making(rank_, {.tag = call.signature_tag}, call, allocate_shared_output, &bytes, made);
  auto out = std::static_pointer_cast<std::byte>(std::move(made));
  if (!out) {
    group_->release(rank_, call);  // as every member does: the group stays in step
    throw std::bad_alloc();
  }
  // This member's rows, and only those, into the one output.
  const bool streaming = bytes >= kStreamBytes;
  const auto* src = static_cast<const std::byte*>(send);
  for (std::size_t o = 0; mine > 0 && o < outer; ++o) {
    std::byte* dst = out.get() + o * row + before;
    streaming ? stream_copy(dst, src + o * mine, mine) : static_cast<void>(std::memcpy(dst, src + o * mine, mine));
  }
  if (streaming) stream_fence();
  group_->release(rank_, call);  // nobody reads the output before every block is in
  return out;
}

void SharedMemoryCommunicator::broadcast(void* buffer, std::size_t count, DType dtype, int root,
                                         const CollectiveCall& call) {
  broadcast_out_of_place(buffer, buffer, count, dtype, root, call);
}

void SharedMemoryCommunicator::check_root(int root, const CollectiveCall& call) const {
  // Every member passes the same root: every member throws, before any round.
  if (root < 0 || root >= size()) {
    throw InvalidArgumentError(std::string(call.op) + " #" + std::to_string(call.sequence) +
                               ": broadcast from member " + std::to_string(root) + " of a group of " +
                               std::to_string(size()));
  }
}

void SharedMemoryCommunicator::broadcast_out_of_place(const void* send, void* recv, std::size_t count, DType dtype,
                                                      int root, const CollectiveCall& call) {
  check_root(root, call);
  const std::size_t bytes = count * size_of(dtype);
  const bool is_root = rank_ == root;
  // The root's own copy comes after the round: the others need not wait for it.
  const auto copy_to_root = [&] {
    if (is_root && bytes && recv != send) copy_broadcast_part(recv, send, bytes, bytes);
  };
  if (bytes <= LocalGroup::kSmallBytes) {
    // The root's bytes in the lines of a small round; the others bring none.
    const auto data = group_->arrive_small(rank_, is_root ? send : nullptr, is_root ? bytes : 0, call);
    if (!is_root && bytes) std::memcpy(recv, data[static_cast<std::size_t>(root)], bytes);
    copy_to_root();
    return;
  }
  const bool inline_path = bytes <= LocalGroup::kInlineBytes;
  const void* published = is_root ? send : nullptr;
  if (inline_path && is_root) {
    std::byte* area = group_->inline_area(rank_);
    std::memcpy(area, send, bytes);
    published = area;
  }
  const auto& entries = group_->arrive(rank_, {.send = published, .recv = recv, .tag = call.signature_tag}, call);
  const int n = size();
  const auto* src = static_cast<const std::byte*>(entries[static_cast<std::size_t>(root)].send);
  if (n == 1 || inline_path) {
    if (!is_root) std::memcpy(recv, src, bytes);
    copy_to_root();
    return;
  }
  // Every member, the root too, copies its slice of the root's send into
  // every member's recv: the copying is shared N ways.
  const auto [begin, end] = line_slice(bytes);
  const bool streaming = bytes >= kStreamBytes;
  for (int q = 0; q < n && end > begin; ++q) {
    auto* dst = static_cast<std::byte*>(entries[static_cast<std::size_t>(q)].recv);
    if (q == root && dst == src) continue;  // in place
    streaming ? stream_copy(dst + begin, src + begin, end - begin)
              : static_cast<void>(std::memcpy(dst + begin, src + begin, end - begin));
  }
  if (streaming) stream_fence();
  group_->release(rank_, call);  // nobody leaves while others still write into its recv or read the root's send
}

std::shared_ptr<std::byte> SharedMemoryCommunicator::broadcast_shared(const void* send, std::size_t count, DType dtype,
                                                                      int root, const CollectiveCall& call) {
  check_root(root, call);
  const std::size_t bytes = count * size_of(dtype);
  // Up to 4 KiB, broadcast's one round into the thread's own storage is
  // faster than a shared output's two (nobody reads it before it is whole).
  if (size() == 1 || !shares_broadcast(bytes)) return Communicator::broadcast_shared(send, count, dtype, root, call);
  // Allocated by the member that completes the round, as all_gather_v_shared's.
  std::shared_ptr<void> made;
  const auto& entries =
      group_->arrive_making(rank_, {.send = rank_ == root ? send : nullptr, .tag = call.signature_tag}, call,
                            allocate_shared_output, &bytes, made);
  auto out = std::static_pointer_cast<std::byte>(std::move(made));
  if (!out) {
    group_->release(rank_, call);  // as every member does: the group stays in step
    throw std::bad_alloc();
  }
  // Each member copies its slice of the root's buffer into the one output:
  // the root's bytes are written once, the copying shared N ways.
  const auto* src = static_cast<const std::byte*>(entries[static_cast<std::size_t>(root)].send);
  const auto [begin, end] = line_slice(bytes);
  if (end > begin) copy_broadcast_part(out.get() + begin, src + begin, end - begin, bytes);
  group_->release(rank_, call);  // nobody reads the output, nor lets the root's go, before every slice is in
  return out;
}

void SharedMemoryCommunicator::barrier(const CollectiveCall& call) { group_->arrive_small(rank_, nullptr, 0, call); }

void SharedMemoryCommunicator::abort(ErrorCode code, const std::string& message, int origin_rank) noexcept {
  group_->abort(code, message, origin_rank);
}

}  // namespace distribute::internal
