// ReplicaContext::all_gather: a first round that assumes the same shapes on every
// replica, and a slow path (full signatures, ragged values) when the hashes differ.
#include <charconv>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "distribute/communicator.h"
#include "distribute/errors.h"
#include "distribute/indexed_slices.h"
#include "distribute/nest.h"
#include "distribute/options.h"
#include "distribute/replica_context.h"
#include "distribute/tensor.h"
#include "runtime/collective_pipeline.h"
#include "runtime/gather_layout.h"
#include "runtime/replica_channel.h"
#include "runtime/runtime_util.h"
#include "runtime/signature.h"

namespace distribute {

using internal::add_field;
using internal::agree;
using internal::begin_collective;
using internal::check_agreed;
using internal::collective_output;
using internal::first_replica_of_group;
using internal::leaf_structure;
using internal::namer_for;
using internal::ReplicaChannel;
using internal::Signature;

namespace {
// What an all_gather's replicas must agree on (one list of fields for the
// Signature and the fast path's TagHasher), and this replica's verdict on
// its values.
template <class Add>
void all_gather_fields(int axis, std::string_view structure, Add&& add) {
  char axis_text[16];
  const auto printed = std::to_chars(axis_text, axis_text + sizeof axis_text, axis);
  add("axis", std::string_view(axis_text, static_cast<std::size_t>(printed.ptr - axis_text)));
  add("structure", structure);
}

void describe_all_gather(Signature& sig, const Nest<Tensor>& value, const std::vector<Tensor>& leaves,
                         const std::vector<std::string>& paths, int axis) {
  all_gather_fields(axis, value.structure_string(),
                    [&](std::string_view key, std::string_view text) { add_field(sig, key, text); });
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    sig.leaves.push_back({leaves[i].dtype(), leaves[i].shape().dims()});
    const bool had_error = sig.error_code.has_value();
    internal::validate_gather_leaf(leaves[i], axis, sig);
    if (!had_error && sig.error_code && !paths[i].empty()) sig.error = "value " + paths[i] + ": " + sig.error;
  }
}

// One leaf's data round, laid out as `layout` says. The result is read-only:
// the replicas of one process may share its storage (all_gather_v_shared).
Tensor gather_leaf(ReplicaChannel& ch, const Tensor& leaf, const internal::GatherLayout& layout,
                   const CollectiveCall& call) {
  const auto elements = static_cast<std::size_t>(layout.shape.num_elements());
  std::shared_ptr<std::byte> storage = collective_output(call, leaf.dtype(), elements, [&] {
    return ch.comm->all_gather_v_shared(leaf.raw_data(), layout.counts, layout.outer, leaf.dtype(), call);
  });
  ++ch.data_calls;
  // No device name: the replica thread's device scope (this replica's device).
  return Tensor::from_shared(std::move(storage), leaf.dtype(), layout.shape).as_read_only();
}

// The layout if every member's value has the shape of `leaf`.
internal::GatherLayout same_shapes_layout(const ReplicaChannel& ch, const Tensor& leaf, int axis) {
  const auto along = leaf.shape().dims_span()[static_cast<std::size_t>(axis < 0 ? axis + leaf.rank() : axis)];
  return internal::gather_layout(leaf, axis, static_cast<std::size_t>(ch.comm->size()),
                                 [along](std::size_t) { return along; });
}

// Every leaf's layout; `sigs` gives every member's shapes (nullptr: all are
// this replica's). Worked out before the first data round, so that a size
// past int64 is found before any data moves.
std::vector<internal::GatherLayout> gather_layouts(const ReplicaChannel& ch, const std::vector<Tensor>& leaves,
                                                   int axis, const std::vector<Signature>* sigs) {
  const auto members = static_cast<std::size_t>(ch.comm->size());
  std::vector<internal::GatherLayout> layouts;
  layouts.reserve(leaves.size());
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const Tensor& leaf = leaves[i];
    const auto a = static_cast<std::size_t>(axis < 0 ? axis + leaf.rank() : axis);
    layouts.push_back(
        sigs ? internal::gather_layout(leaf, axis, members, [&](std::size_t q) { return (*sigs)[q].leaves[i].dims[a]; })
             : same_shapes_layout(ch, leaf, axis));
  }
  return layouts;
}

// Gathers every leaf, as laid out.
std::vector<Tensor> gather_values(ReplicaChannel& ch, const std::vector<Tensor>& leaves,
                                  const std::vector<internal::GatherLayout>& layouts, CollectiveCall data_call) {
  std::vector<Tensor> out;
  out.reserve(leaves.size());
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    out.push_back(gather_leaf(ch, leaves[i], layouts[i], data_call));
    data_call.signature_tag = 0;
  }
  return out;
}

// The first round of an all_gather assumes the same shapes on every replica
// (the common case); the hash of the signature, shapes included, rides on it.
// Every replica takes the same rounds: a replica with nothing to gather, or
// an invalid value, offers its hash in a barrier. Returns nothing if the
// hashes differ (ragged values, a mismatch, a local error).
//
// A replica whose own size along the axis, taken once per replica, passes
// int64 cannot lay the result out this way, though the values may be ragged
// with a total that fits (one huge empty value among small ones): it offers
// its hash with bit 0 set, which sends every replica to the slow path, where
// the sizes of all decide, alike on every replica. (Raising here would raise
// on this replica alone, and leave the others waiting for it.)
std::optional<std::vector<Tensor>> gather_same_shapes(ReplicaChannel& ch, const std::vector<Tensor>& leaves, int axis,
                                                      bool local_error, CollectiveCall first) {
  std::vector<internal::GatherLayout> layouts;
  if (!local_error) {
    try {
      layouts = gather_layouts(ch, leaves, axis, nullptr);
    } catch (const Error&) {
      first.signature_tag |= 1;
      local_error = true;
    }
  }
  try {
    if (leaves.empty() || local_error) {
      ch.comm->barrier(first);
      if (leaves.empty()) return std::vector<Tensor>{};
    } else {
      return gather_values(ch, leaves, layouts, first);
    }
  } catch (const SignatureMismatch&) {
  }
  return std::nullopt;
}

// Every replica is here after the same SignatureMismatch (as a replica of
// another collective is in explain_mismatch): exchange full signatures, check
// them, and gather the (ragged) values.
std::vector<Tensor> gather_after_mismatch(const ReplicaContext& ctx, ReplicaChannel& ch, const Signature& sig,
                                          const CollectiveCall& call, const std::vector<Tensor>& leaves,
                                          const std::vector<std::string>& paths, int axis) {
  CollectiveCall untagged = call;
  untagged.signature_tag = 0;
  std::vector<Signature> sigs;
  for (const auto& p : ch.comm->exchange(sig.encode(), untagged)) sigs.push_back(Signature::decode(p));
  check_agreed(ch, sigs, first_replica_of_group(ctx), internal::ShapeRule::kAllButAxis, axis, namer_for(paths));
  std::vector<internal::GatherLayout> layouts;
  try {
    layouts = gather_layouts(ch, leaves, axis, &sigs);
  } catch (const Error&) {
    ch.agreed_failure = true;  // worked out from every replica's sizes: every replica raises it
    throw;
  }
  return gather_values(ch, leaves, layouts, call);
}
}  // namespace

Nest<Tensor> ReplicaContext::all_gather(const Nest<Tensor>& value, int axis, const CommunicationOptions& options) {
  auto [opts, call, sig] = begin_collective(*this, "all_gather", options);
  ReplicaChannel& ch = *channel_;
  const std::vector<Tensor> leaves = value.flatten();
  const std::vector<std::string> paths = value.flatten_paths();
  describe_all_gather(sig, value, leaves, paths, axis);
  CollectiveCall first = call;
  first.signature_tag = sig.tag(/*with_leaves=*/true);
  if (auto out = gather_same_shapes(ch, leaves, axis, sig.error_code.has_value(), first)) {
    return Nest<Tensor>::pack_sequence_as(value, std::move(*out));
  }
  return Nest<Tensor>::pack_sequence_as(value, gather_after_mismatch(*this, ch, sig, call, leaves, paths, axis));
}

// One value: the same rounds as a one-leaf nest, with the tag hashed from the
// arguments in place (as the one-Tensor all_reduce); the Signature is built
// only if the hashes differ.
Tensor ReplicaContext::all_gather(const Tensor& value, int axis, const CommunicationOptions& options) {
  auto [opts, call, sig] = begin_collective(*this, "all_gather", options);
  ReplicaChannel& ch = *channel_;
  internal::validate_gather_leaf(value, axis, sig);
  const std::string_view op_name = sig.op;  // (a lambda captures no structured binding: clang 14)
  const auto& memo = ch.all_gather_memo.get({axis, 0}, value.dtype(), value.shape().dims_span(), [&] {
    internal::TagHasher tag(op_name);
    all_gather_fields(axis, leaf_structure(),
                      [&](std::string_view key, std::string_view text) { tag.field(key, text); });
    tag.leaf_count(1);
    tag.leaf(value.dtype(), value.shape().dims_span());
    decltype(ch.all_gather_memo)::Entry entry{.state = tag.state()};
    Signature verdict;  // on the value alone (sig's may be on the options)
    internal::validate_gather_leaf(value, axis, verdict);
    try {
      if (!verdict.error_code) entry.extra = same_shapes_layout(ch, value, axis);
    } catch (const Error&) {
      // Sizes past int64: no layout; the slow path decides, below.
    }
    return entry;
  });
  CollectiveCall first = call;
  first.signature_tag = internal::TagHasher::resume(memo.state).finish(sig.sequence, sig.error_code.has_value());
  // gather_same_shapes for one value, without its vectors.
  try {
    if (sig.error_code) {
      ch.comm->barrier(first);  // the tag says this replica's value is invalid: every replica throws
    } else if (!memo.extra) {
      // Its size along the axis, once per replica, passes int64: every
      // replica to the slow path (as gather_same_shapes says).
      first.signature_tag |= 1;
      ch.comm->barrier(first);
    } else {
      return gather_leaf(ch, value, *memo.extra, first);
    }
  } catch (const SignatureMismatch&) {
  }
  const std::vector<Tensor> leaves{value};
  const Nest<Tensor> nest(value);
  const std::vector<std::string> paths = nest.flatten_paths();
  describe_all_gather(sig, nest, leaves, paths, axis);
  return std::move(gather_after_mismatch(*this, ch, sig, call, leaves, paths, axis)[0]);
}

std::vector<Tensor> ReplicaContext::all_gather(const std::vector<Tensor>& value, int axis,
                                               const CommunicationOptions& options) {
  std::vector<Nest<Tensor>> items(value.begin(), value.end());
  return all_gather(Nest<Tensor>::list(std::move(items)), axis, options).flatten();
}

IndexedSlices ReplicaContext::all_gather(const IndexedSlices&, int axis, const CommunicationOptions& options) {
  auto [opts, call, sig] = begin_collective(*this, "all_gather", options);
  ReplicaChannel& ch = *channel_;
  sig.fields = {{"axis", std::to_string(axis)}, {"structure", "IndexedSlices"}};
  sig.set_error(UnimplementedError("all_gather does not support IndexedSlices"));
  agree(ch, sig, call, first_replica_of_group(*this), internal::ShapeRule::kAllButAxis, axis, nullptr);
  throw InternalError("all_gather of IndexedSlices passed the signature check");  // unreachable
}

}  // namespace distribute
