// ReplicaContext::all_reduce, of tensors, nests, lists and IndexedSlices: values
// of one dtype packed into buffers of about bytes_per_pack, one collective per pack.
#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/reduce_kernels.h"
#include "distribute/communicator.h"
#include "distribute/errors.h"
#include "distribute/indexed_slices.h"
#include "distribute/nest.h"
#include "distribute/options.h"
#include "distribute/reduce_op.h"
#include "distribute/replica_context.h"
#include "distribute/tensor.h"
#include "runtime/collective_pipeline.h"
#include "runtime/packing.h"
#include "runtime/replica_channel.h"
#include "runtime/signature.h"

namespace distribute {

using internal::add_field;
using internal::agree;
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

// Values of one dtype (a pack, or a lone value), reduced straight from the
// values into one output, with no staging copy; the replicas of this process
// may share it (all_reduce_shared), so results are read-only views into it.
std::shared_ptr<std::byte> reduce_segments(ReplicaChannel& ch, std::span<const Communicator::Segment> segments,
                                           DType dtype, ReduceOp op, const CollectiveCall& call) {
  std::size_t elements = 0;
  for (const Communicator::Segment& s : segments) elements += s.count;
  std::shared_ptr<std::byte> result =
      collective_output(call, dtype, elements, [&] { return ch.comm->all_reduce_shared(segments, dtype, op, call); });
  ++ch.data_calls;
  return result;
}

Communicator::Segment segment_of(const Tensor& value) {
  return {.send = value.raw_data(), .count = static_cast<std::size_t>(value.num_elements())};
}

// Reduces `leaves` (already agreed on) pack by pack.
// The first pack's collective carries call.signature_tag, so the agreement
// check rides on the first data round; later packs need none.
std::vector<Tensor> reduce_packed(ReplicaChannel& ch, const std::vector<Tensor>& leaves, ReduceOp op,
                                  std::int64_t bytes_per_pack, CollectiveCall call, const std::string& device) {
  std::vector<Tensor> out(leaves.size());
  const std::vector<internal::Pack> packs = internal::plan_packs(leaves, bytes_per_pack);
  if (packs.empty()) ch.comm->barrier(call);  // nothing to move, but the signature must still agree
  std::vector<Communicator::Segment> segments;
  for (const internal::Pack& pack : packs) {
    segments.clear();
    for (std::size_t i : pack.leaves) segments.push_back(segment_of(leaves[i]));
    std::shared_ptr<std::byte> result = reduce_segments(ch, segments, pack.dtype, op, call);
    call.signature_tag = 0;
    result = reference_for_views(std::move(result), pack.leaves.size());
    std::size_t offset = 0;
    for (std::size_t k = 0; k < pack.leaves.size(); ++k) {
      const std::size_t i = pack.leaves[k];
      out[i] = result_view(k + 1 < pack.leaves.size() ? result : std::move(result), offset, leaves[i], device);
      offset += leaves[i].nbytes();
    }
  }
  return out;
}

// The fields an all_reduce's replicas must agree on, as (key, value) pairs
// handed to `add`: a Signature's list, or a TagHasher on the fast path. One
// list for both, so that the two always hash alike.
template <class Add>
void all_reduce_fields(ReduceOp op, std::string_view structure, std::int64_t bytes_per_pack, Add&& add) {
  char pack_text[24];
  const auto printed = std::to_chars(pack_text, pack_text + sizeof pack_text, bytes_per_pack);
  add("reduce op", to_string(op));
  add("structure", structure);
  add("bytes_per_pack", std::string_view(pack_text, static_cast<std::size_t>(printed.ptr - pack_text)));
}

void describe_all_reduce(Signature& sig, ReduceOp op, const Nest<Tensor>& value, std::span<const Tensor> leaves,
                         std::int64_t bytes_per_pack) {
  all_reduce_fields(op, value.structure_string(), bytes_per_pack,
                    [&](std::string_view key, std::string_view text) { add_field(sig, key, text); });
  for (const Tensor& t : leaves) sig.leaves.push_back({t.dtype(), t.shape().dims()});
}

// The tag describe_all_reduce's Signature would have, hashed from the
// arguments in place (fields_and_leaves_hash). all_reduce_hash is all of it
// but the sequence (for a CallMemo).
internal::TagHasher all_reduce_hash(std::string_view op_name, ReduceOp op, std::string_view structure,
                                    std::span<const Tensor> leaves, std::int64_t bytes_per_pack) {
  return fields_and_leaves_hash(
      op_name, [&](auto&& add) { all_reduce_fields(op, structure, bytes_per_pack, add); }, leaves);
}

std::uint64_t all_reduce_tag(const Signature& sig, ReduceOp op, std::string_view structure,
                             std::span<const Tensor> leaves, std::int64_t bytes_per_pack) {
  return all_reduce_hash(sig.op, op, structure, leaves, bytes_per_pack)
      .finish(sig.sequence, sig.error_code.has_value());
}

// The rest of an all_reduce once it has begun: `leaves` are the value
// flattened, of structure `structure`; `as_nest` makes the value as a Nest,
// only to explain a mismatch.
template <class AsNest>
std::vector<Tensor> reduce_leaves(ReplicaContext& ctx, ReduceOp op, const std::vector<Tensor>& leaves,
                                  std::string_view structure, CollectiveStart& start, const AsNest& as_nest) {
  ReplicaChannel& ch = internal::Access::channel(ctx);
  const std::int64_t bytes_per_pack = start.options.bytes_per_pack;
  // The hash travels with the first data round. Only if the hashes differ do
  // the replicas exchange full signatures, to explain.
  start.call.signature_tag = all_reduce_tag(start.sig, op, structure, leaves, bytes_per_pack);
  const std::string device;  // empty: the replica thread's device scope (this replica's device), no copy
  try {
    return reduce_packed(ch, leaves, op, std::max<std::int64_t>(0, bytes_per_pack), start.call, device);
  } catch (const SignatureMismatch&) {
    const Nest<Tensor> nest = as_nest();
    describe_all_reduce(start.sig, op, nest, leaves, bytes_per_pack);
    const std::vector<std::string> paths = nest.flatten_paths();
    explain_mismatch(ch, start.sig, start.call, first_replica_of_group(ctx), internal::ShapeRule::kEqual, 0,
                     namer_for(paths));
  }
}
}  // namespace

Nest<Tensor> ReplicaContext::all_reduce(ReduceOp op, const Nest<Tensor>& value, const CommunicationOptions& options) {
  CollectiveStart start = begin_collective(*this, "all_reduce", options);
  const std::vector<Tensor> leaves = value.flatten();
  return Nest<Tensor>::pack_sequence_as(
      value, reduce_leaves(*this, op, leaves, value.structure_string(), start, [&] { return value; }));
}

// One value, the most common call: the same collective as a one-leaf nest
// (one pack, reduced straight into the output).
Tensor ReplicaContext::all_reduce(ReduceOp op, const Tensor& value, const CommunicationOptions& options) {
  auto [opts, call, sig] = begin_collective(*this, "all_reduce", options);
  ReplicaChannel& ch = *channel_;
  const std::int64_t bytes_per_pack = opts.bytes_per_pack;  // (a lambda captures no structured binding: clang 14)
  const std::string_view op_name = sig.op;
  const auto& memo = ch.all_reduce_memo.get(
      {static_cast<std::int64_t>(op), bytes_per_pack}, value.dtype(), value.shape().dims_span(), [&] {
        return internal::CallMemo<>::Entry{
            .state = all_reduce_hash(op_name, op, leaf_structure(), {&value, 1}, bytes_per_pack).state()};
      });
  call.signature_tag = internal::TagHasher::resume(memo.state).finish(sig.sequence, sig.error_code.has_value());
  try {
    const Communicator::Segment whole = segment_of(value);
    return result_view(reduce_segments(ch, {&whole, 1}, value.dtype(), op, call), 0, value, /*device=*/{});
  } catch (const SignatureMismatch&) {
    const Nest<Tensor> nest(value);
    describe_all_reduce(sig, op, nest, {&value, 1}, opts.bytes_per_pack);
    explain_mismatch(ch, sig, call, first_replica_of_group(*this), internal::ShapeRule::kEqual, 0,
                     namer_for(nest.flatten_paths()));
  }
}

// A list of tensors (a model's gradients): the same collective as the list
// as a Nest, without building one.
std::vector<Tensor> ReplicaContext::all_reduce(ReduceOp op, const std::vector<Tensor>& value,
                                               const CommunicationOptions& options) {
  CollectiveStart start = begin_collective(*this, "all_reduce", options);
  return reduce_leaves(*this, op, value, Nest<Tensor>::list_of_leaves_structure(value.size()), start,
                       [&] { return Nest<Tensor>::list(std::vector<Nest<Tensor>>(value.begin(), value.end())); });
}

namespace {
// What every replica must agree on for an IndexedSlices leaf besides its
// values' dtype and shape (which the leaf carries: rows may differ).
std::string slices_field(const IndexedSlices& value) {
  return "IndexedSlices, dense_shape " + value.dense_shape().to_string() + ", indices " +
         std::string(to_string(value.indices().dtype()));
}

void refuse_slices_op(ReduceOp op, Signature& sig) {
  if (op != ReduceOp::kSum && op != ReduceOp::kMean) {
    sig.set_error(InvalidArgumentError("all_reduce of IndexedSlices supports SUM and MEAN only, not " +
                                       std::string(to_string(op))));
  }
}

// The all_reduce of IndexedSlices leaf `leaf` of an agreed call: every
// replica's values and indices gathered along dimension 0 (ragged, each
// replica's rows from its signature), in replica order; MEAN divides the
// values by `replicas`. Read-only, as every all_reduce result, though each
// replica's own here.
IndexedSlices gather_slices(ReplicaChannel& ch, const IndexedSlices& value, const std::vector<Signature>& sigs,
                            std::size_t leaf, ReduceOp op, int replicas, const CollectiveCall& call) {
  std::int64_t row = 1;  // elements per slice
  for (int d = 1; d < value.values().rank(); ++d) row *= value.values().shape()[d];
  std::vector<std::size_t> value_counts, index_counts;
  std::int64_t total_rows = 0;
  for (const auto& s : sigs) {
    const std::int64_t rows = s.leaves[leaf].dims[0];
    value_counts.push_back(static_cast<std::size_t>(rows * row));
    index_counts.push_back(static_cast<std::size_t>(rows));
    total_rows += rows;
  }
  const std::string device;  // empty: the replica thread's device scope (this replica's device), no copy
  std::vector<std::int64_t> dims = value.values().shape().dims();
  dims[0] = total_rows;
  Tensor values = Tensor::uninitialized(value.dtype(), Shape(dims), device);
  Tensor indices = Tensor::uninitialized(value.indices().dtype(), Shape{total_rows}, device);
  ch.comm->all_gather_v(value.values().raw_data(), values.mutable_raw_data(), value_counts, 1, value.dtype(), call);
  ch.comm->all_gather_v(value.indices().raw_data(), indices.mutable_raw_data(), index_counts, 1,
                        value.indices().dtype(), call);
  ch.data_calls += 2;
  if (op == ReduceOp::kMean) {
    const void* src[1] = {values.raw_data()};
    internal::reduce_sources(values.mutable_raw_data(), src, static_cast<std::size_t>(values.num_elements()),
                             values.dtype(), ReduceOp::kMean, replicas);
  }
  return IndexedSlices(std::move(values).as_read_only(), std::move(indices).as_read_only(), value.dense_shape());
}
}  // namespace

IndexedSlices ReplicaContext::all_reduce(ReduceOp op, const IndexedSlices& value, const CommunicationOptions& options) {
  auto [opts, call, sig] = begin_collective(*this, "all_reduce", options);
  ReplicaChannel& ch = *channel_;
  sig.fields = {{"reduce op", std::string(to_string(op))},
                {"structure", "IndexedSlices"},
                {"dense_shape", value.dense_shape().to_string()},
                {"indices dtype", std::string(to_string(value.indices().dtype()))}};
  sig.leaves.push_back({value.values().dtype(), value.values().shape().dims()});
  refuse_slices_op(op, sig);
  const std::vector<Signature> sigs =
      agree(ch, sig, call, first_replica_of_group(*this), internal::ShapeRule::kAllButFirst, 0, nullptr);
  return gather_slices(ch, value, sigs, 0, op, num_replicas_in_sync(), call);
}

Nest<TensorOrSlices> ReplicaContext::all_reduce(ReduceOp op, const Nest<TensorOrSlices>& value,
                                                const CommunicationOptions& options) {
  const std::vector<TensorOrSlices> leaves = value.flatten();
  // Dense leaves only: the Nest<Tensor> collective, as it is.
  const bool any_sparse = std::any_of(leaves.begin(), leaves.end(),
                                      [](const TensorOrSlices& l) { return std::holds_alternative<IndexedSlices>(l); });
  if (!any_sparse) {
    const Nest<Tensor> dense = value.map([](const TensorOrSlices& l) { return std::get<Tensor>(l); });
    return all_reduce(op, dense, options).map([](const Tensor& t) { return TensorOrSlices(t); });
  }
  CollectiveStart start = begin_collective(*this, "all_reduce", options);
  ReplicaChannel& ch = *channel_;
  Signature& sig = start.sig;
  // One signature for every leaf: the structure, which leaves are sparse
  // (with their dense shapes and index dtypes), then each leaf's dtype and
  // shape, compared as its kind needs (a sparse leaf's rows may differ).
  std::string kinds;
  for (const TensorOrSlices& leaf : leaves) kinds += std::holds_alternative<IndexedSlices>(leaf) ? 'S' : 'T';
  std::vector<internal::ShapeRule> rules;
  std::vector<Tensor> dense;
  std::vector<std::size_t> dense_at;
  all_reduce_fields(op, value.structure_string(), start.options.bytes_per_pack,
                    [&](std::string_view key, std::string_view text) { add_field(sig, key, text); });
  // (Before the fields of each sparse leaf: the fields are compared in order.)
  add_field(sig, "leaf kinds (T: Tensor, S: IndexedSlices)", kinds);
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    if (const auto* slices = std::get_if<IndexedSlices>(&leaves[i])) {
      rules.push_back(internal::ShapeRule::kAllButFirst);
      add_field(sig, "leaf " + std::to_string(i), slices_field(*slices));
      sig.leaves.push_back({slices->values().dtype(), slices->values().shape().dims()});
    } else {
      const Tensor& t = std::get<Tensor>(leaves[i]);
      rules.push_back(internal::ShapeRule::kEqual);
      dense.push_back(t);
      dense_at.push_back(i);
      sig.leaves.push_back({t.dtype(), t.shape().dims()});
    }
  }
  refuse_slices_op(op, sig);
  const std::vector<std::string> paths = value.flatten_paths();
  const std::vector<Signature> sigs = agree(ch, sig, start.call, first_replica_of_group(*this),
                                            internal::ShapeRule::kEqual, 0, namer_for(paths), &rules);
  // Agreed: the dense leaves packed as a Nest<Tensor>'s, then each sparse one.
  std::vector<TensorOrSlices> out(leaves.size());
  CollectiveCall data = start.call;
  data.signature_tag = 0;
  if (!dense.empty()) {
    const std::vector<Tensor> reduced =
        reduce_packed(ch, dense, op, std::max<std::int64_t>(0, start.options.bytes_per_pack), data, /*device=*/{});
    for (std::size_t k = 0; k < dense.size(); ++k) out[dense_at[k]] = reduced[k];
  }
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    if (const auto* slices = std::get_if<IndexedSlices>(&leaves[i])) {
      out[i] = gather_slices(ch, *slices, sigs, i, op, num_replicas_in_sync(), data);
    }
  }
  return Nest<TensorOrSlices>::pack_sequence_as(value, std::move(out));
}

}  // namespace distribute
