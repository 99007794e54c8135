// ReplicaContext::broadcast, of tensors, nests and lists: values packed as
// all_reduce packs them, a pack of several staged by the root into one buffer.
#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/storage.h"
#include "distribute/communicator.h"
#include "distribute/errors.h"
#include "distribute/nest.h"
#include "distribute/options.h"
#include "distribute/replica_context.h"
#include "distribute/tensor.h"
#include "runtime/collective_pipeline.h"
#include "runtime/packing.h"
#include "runtime/replica_channel.h"
#include "runtime/signature.h"

namespace distribute {

using internal::add_field;
using internal::begin_collective;
using internal::collective_output;
using internal::CollectiveStart;
using internal::explain_mismatch;
using internal::fields_and_leaves_hash;
using internal::first_replica_of_group;
using internal::leaf_structure;
using internal::namer_for;
using internal::reference_for_views;
using internal::ReplicaChannel;
using internal::result_view;
using internal::Signature;

namespace {
// What a broadcast's replicas must agree on (the Signature's and the fast
// path's list, as all_reduce_fields).
template <class Add>
void broadcast_fields(int root_replica, std::string_view structure, std::int64_t bytes_per_pack, Add&& add) {
  char root_text[16];
  const auto root_end = std::to_chars(root_text, root_text + sizeof root_text, root_replica).ptr;
  char pack_text[24];
  const auto pack_end = std::to_chars(pack_text, pack_text + sizeof pack_text, bytes_per_pack).ptr;
  add("root replica", std::string_view(root_text, static_cast<std::size_t>(root_end - root_text)));
  add("structure", structure);
  add("bytes_per_pack", std::string_view(pack_text, static_cast<std::size_t>(pack_end - pack_text)));
}

internal::TagHasher broadcast_hash(std::string_view op_name, int root_replica, std::string_view structure,
                                   std::span<const Tensor> leaves, std::int64_t bytes_per_pack) {
  return fields_and_leaves_hash(
      op_name, [&](auto&& add) { broadcast_fields(root_replica, structure, bytes_per_pack, add); }, leaves);
}

// This replica's verdict on the root it names (every replica names one).
void validate_root(const ReplicaContext& ctx, int root_replica, Signature& sig) {
  const int n = ctx.num_replicas_in_sync();
  if (root_replica < 0 || root_replica >= n) {
    sig.set_error(InvalidArgumentError("broadcast: root_replica " + std::to_string(root_replica) +
                                       " is not a replica of this sync group (" + std::to_string(n) +
                                       " replicas: 0 to " + std::to_string(n - 1) + ")"));
  }
}

// Broadcasts `leaves` (agreed on) pack by pack from member `root`: a pack of
// one value straight from it, a pack of several staged by the root into one
// buffer first. The first pack's collective carries call.signature_tag.
std::vector<Tensor> broadcast_packed(ReplicaChannel& ch, const std::vector<Tensor>& leaves, int root,
                                     std::int64_t bytes_per_pack, CollectiveCall call) {
  std::vector<Tensor> out(leaves.size());
  const std::vector<internal::Pack> packs = internal::plan_packs(leaves, bytes_per_pack);
  if (packs.empty()) ch.comm->barrier(call);  // nothing to move, but the signature must still agree
  const bool is_root = ch.comm->rank() == root;
  for (const internal::Pack& pack : packs) {
    const std::size_t esz = size_of(pack.dtype);
    std::shared_ptr<std::byte> staged;
    const void* send = nullptr;
    if (pack.leaves.size() == 1) {
      send = leaves[pack.leaves[0]].raw_data();
    } else if (is_root && pack.count > 0) {
      staged = internal::allocate_storage(pack.count * esz);
      std::size_t at = 0;
      for (std::size_t i : pack.leaves) {
        if (leaves[i].nbytes()) std::memcpy(staged.get() + at, leaves[i].raw_data(), leaves[i].nbytes());
        at += leaves[i].nbytes();
      }
      send = staged.get();
    }
    std::shared_ptr<std::byte> result = collective_output(call, pack.dtype, pack.count, [&] {
      return ch.comm->broadcast_shared(send, pack.count, pack.dtype, root, call);
    });
    ++ch.data_calls;
    call.signature_tag = 0;
    staged.reset();
    result = reference_for_views(std::move(result), pack.leaves.size());
    std::size_t offset = 0;
    for (std::size_t k = 0; k < pack.leaves.size(); ++k) {
      const std::size_t i = pack.leaves[k];
      out[i] = result_view(k + 1 < pack.leaves.size() ? result : std::move(result), offset, leaves[i], {});
      offset += leaves[i].nbytes();
    }
  }
  return out;
}

// The data rounds (`move`) unless this replica's call is invalid; if the
// tags differ (or any replica's call is invalid), every replica exchanges
// full signatures and throws the same error. `as_nest` makes the value as a
// Nest, only to explain.
template <class Move, class AsNest>
auto broadcast_or_explain(ReplicaContext& ctx, int root_replica, std::int64_t bytes_per_pack, Signature& sig,
                          const CollectiveCall& call, std::span<const Tensor> leaves, const Move& move,
                          const AsNest& as_nest) -> decltype(move()) {
  ReplicaChannel& ch = internal::Access::channel(ctx);
  try {
    if (!sig.error_code) return move();
    ch.comm->barrier(call);  // the tag says this replica's call is invalid: every replica throws
  } catch (const SignatureMismatch&) {
  }
  const Nest<Tensor> nest = as_nest();
  broadcast_fields(root_replica, nest.structure_string(), bytes_per_pack,
                   [&](std::string_view key, std::string_view text) { add_field(sig, key, text); });
  for (const Tensor& t : leaves) sig.leaves.push_back({t.dtype(), t.shape().dims()});
  explain_mismatch(ch, sig, call, first_replica_of_group(ctx), internal::ShapeRule::kEqual, 0,
                   namer_for(nest.flatten_paths()));
}

// The rest of a broadcast of a nest or a list once it has begun.
template <class AsNest>
std::vector<Tensor> broadcast_leaves(ReplicaContext& ctx, int root_replica, const std::vector<Tensor>& leaves,
                                     std::string_view structure, CollectiveStart& start, const AsNest& as_nest) {
  const std::int64_t bytes_per_pack = start.options.bytes_per_pack;
  validate_root(ctx, root_replica, start.sig);
  start.call.signature_tag = broadcast_hash(start.sig.op, root_replica, structure, leaves, bytes_per_pack)
                                 .finish(start.sig.sequence, start.sig.error_code.has_value());
  return broadcast_or_explain(
      ctx, root_replica, bytes_per_pack, start.sig, start.call, leaves,
      [&] {
        return broadcast_packed(internal::Access::channel(ctx), leaves, root_replica - first_replica_of_group(ctx),
                                std::max<std::int64_t>(0, bytes_per_pack), start.call);
      },
      as_nest);
}
}  // namespace

Nest<Tensor> ReplicaContext::broadcast(const Nest<Tensor>& value, int root_replica,
                                       const CommunicationOptions& options) {
  CollectiveStart start = begin_collective(*this, "broadcast", options);
  const std::vector<Tensor> leaves = value.flatten();
  return Nest<Tensor>::pack_sequence_as(
      value, broadcast_leaves(*this, root_replica, leaves, value.structure_string(), start, [&] { return value; }));
}

std::vector<Tensor> ReplicaContext::broadcast(const std::vector<Tensor>& value, int root_replica,
                                              const CommunicationOptions& options) {
  CollectiveStart start = begin_collective(*this, "broadcast", options);
  return broadcast_leaves(*this, root_replica, value, Nest<Tensor>::list_of_leaves_structure(value.size()), start,
                          [&] { return Nest<Tensor>::list(std::vector<Nest<Tensor>>(value.begin(), value.end())); });
}

// One value: the same collective as a one-leaf nest, its hash kept between
// calls (as the one-Tensor all_reduce's) and no vectors.
Tensor ReplicaContext::broadcast(const Tensor& value, int root_replica, const CommunicationOptions& options) {
  auto [opts, call, sig] = begin_collective(*this, "broadcast", options);
  ReplicaChannel& ch = *channel_;
  validate_root(*this, root_replica, sig);
  const std::int64_t bytes_per_pack = opts.bytes_per_pack;  // (a lambda captures no structured binding: clang 14)
  const std::string_view op_name = sig.op;
  const auto& memo =
      ch.broadcast_memo.get({root_replica, bytes_per_pack}, value.dtype(), value.shape().dims_span(), [&] {
        return internal::CallMemo<>::Entry{
            .state = broadcast_hash(op_name, root_replica, leaf_structure(), {&value, 1}, bytes_per_pack).state()};
      });
  CollectiveCall first = call;
  first.signature_tag = internal::TagHasher::resume(memo.state).finish(sig.sequence, sig.error_code.has_value());
  const int root = root_replica - first_replica_of_group(*this);
  return broadcast_or_explain(
      *this, root_replica, bytes_per_pack, sig, first, {&value, 1},
      [&] {
        const auto elements = static_cast<std::size_t>(value.num_elements());
        std::shared_ptr<std::byte> result = collective_output(first, value.dtype(), elements, [&] {
          return ch.comm->broadcast_shared(value.raw_data(), elements, value.dtype(), root, first);
        });
        ++ch.data_calls;
        return result_view(std::move(result), 0, value, /*device=*/{});
      },
      [&] { return Nest<Tensor>(value); });
}

}  // namespace distribute
