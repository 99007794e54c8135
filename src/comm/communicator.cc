#include "distribute/communicator.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/storage.h"

namespace distribute {

std::string to_string(const BufferPlace& place) {
  switch (place.kind) {
    case MemoryKind::kHost: return "host";
    case MemoryKind::kCuda: return "CUDA device " + std::to_string(place.device_index);
  }
  return "memory of kind " + std::to_string(static_cast<int>(place.kind));
}

void Communicator::all_reduce_segments(std::span<const Segment> segments, DType dtype, ReduceOp op,
                                       const CollectiveCall& call, std::int64_t mean_divisor) {
  const std::size_t esz = size_of(dtype);
  std::size_t total = 0;
  for (const Segment& s : segments) total += s.count;
  // From the storage cache: a large pack reuses its staging block each step.
  std::shared_ptr<std::byte> block = internal::allocate_storage(total * esz);
  std::byte* staged = block.get();
  std::size_t at = 0;
  for (const Segment& s : segments) {
    if (s.count) std::memcpy(staged + at, s.send, s.count * esz);
    at += s.count * esz;
  }
  all_reduce(staged, staged, total, dtype, op, call, mean_divisor);
  at = 0;
  for (const Segment& s : segments) {
    if (s.count) std::memcpy(s.recv, staged + at, s.count * esz);
    at += s.count * esz;
  }
}

void Communicator::reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                                  ReduceOp op, const CollectiveCall& call, std::int64_t mean_divisor) {
  const std::size_t esz = size_of(dtype);
  std::size_t total = 0;
  std::size_t offset = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    if (static_cast<int>(r) == rank()) offset = total;
    total += counts[r];
  }
  std::shared_ptr<std::byte> block = internal::allocate_storage(total * esz);
  all_reduce(send, block.get(), total, dtype, op, call, mean_divisor);
  const std::size_t mine = counts[static_cast<std::size_t>(rank())] * esz;
  if (mine) std::memcpy(recv, block.get() + offset * esz, mine);
}

std::shared_ptr<std::byte> Communicator::all_reduce_shared(std::span<const Segment> segments, DType dtype, ReduceOp op,
                                                           const CollectiveCall& call, std::int64_t mean_divisor) {
  const std::size_t esz = size_of(dtype);
  std::size_t total = 0;
  for (const Segment& s : segments) total += s.count;
  std::shared_ptr<std::byte> out = internal::allocate_storage(total * esz);
  if (segments.size() == 1) {
    all_reduce(segments[0].send, out.get(), total, dtype, op, call, mean_divisor);
    return out;
  }
  std::vector<Segment> into(segments.begin(), segments.end());
  std::size_t at = 0;
  for (Segment& s : into) {
    s.recv = out.get() + at;
    at += s.count * esz;
  }
  all_reduce_segments(into, dtype, op, call, mean_divisor);
  return out;
}

std::shared_ptr<std::byte> Communicator::all_gather_v_shared(const void* send, std::span<const std::size_t> counts,
                                                             std::size_t outer, DType dtype,
                                                             const CollectiveCall& call) {
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  std::shared_ptr<std::byte> out = internal::allocate_storage(total * outer * size_of(dtype));
  all_gather_v(send, out.get(), counts, outer, dtype, call);
  return out;
}

std::shared_ptr<std::byte> Communicator::broadcast_shared(const void* send, std::size_t count, DType dtype, int root,
                                                          const CollectiveCall& call) {
  const std::size_t bytes = count * size_of(dtype);
  std::shared_ptr<std::byte> out = bytes ? internal::allocate_storage(bytes) : nullptr;
  std::byte none{};  // a buffer for no elements: the rounds are taken all the same
  broadcast_out_of_place(bytes ? send : &none, out ? out.get() : &none, count, dtype, root, call);
  return out;
}

void Communicator::broadcast_out_of_place(const void* send, void* recv, std::size_t count, DType dtype, int root,
                                          const CollectiveCall& call) {
  if (rank() != root) {
    broadcast(recv, count, dtype, root, call);
    return;
  }
  // The root sends from `send` (every backend's broadcast only reads the
  // root's buffer) and copies it into recv once the others have it.
  broadcast(const_cast<void*>(send), count, dtype, root, call);
  const std::size_t bytes = count * size_of(dtype);
  if (bytes && recv != send) std::memcpy(recv, send, bytes);
}

}  // namespace distribute
