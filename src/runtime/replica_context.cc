// ReplicaContext's collectives. Each one follows the same pipeline:
//   1. validate locally (the verdict travels, it is not thrown yet);
//   2. exchange signatures and check them: any problem raises the same error on
//      every replica, before any data moves;
//   3. move the data through the communicator: all_reduce packs values of one
//      dtype into buffers of about bytes_per_pack (one collective per pack);
//      all_gather moves each value with one all_gather_v.
#include "distribute/replica_context.h"

#include <atomic>
#include <charconv>
#include <cstring>
#include <new>
#include <numeric>
#include <optional>
#include <span>
#include <thread>

#include "core/reduce_kernels.h"
#include "core/storage.h"
#include "distribute/strategy.h"
#include "runtime/mode.h"
#include "runtime/packing.h"
#include "runtime/replica_channel.h"
#include "runtime/runtime_util.h"
#include "runtime/signature.h"

namespace distribute {


using internal::ReplicaChannel;
using internal::Signature;

ReplicaContext::ReplicaContext(Strategy& strategy, int replica_id, int local_id, internal::ReplicaChannel* channel)
    : strategy_(&strategy), replica_id_(replica_id), local_id_(local_id), channel_(channel) {}

int ReplicaContext::num_replicas_in_sync() const { return strategy_->num_replicas_in_sync(); }

std::vector<std::string> ReplicaContext::devices() const {
  internal::require_replica_context(*this, "devices");
  return {strategy_->devices()[static_cast<std::size_t>(local_id_)]};
}

namespace {

// The slow path after a SignatureMismatch: every replica exchanges its full
// signature and the same check raises the same detailed error everywhere.
// Checks signatures that every replica of the group has; an error it raises is
// raised by every replica alike (ReplicaChannel::agreed_failure).
void check_agreed(ReplicaChannel& ch, const std::vector<Signature>& sigs, int first_replica, internal::ShapeRule rule,
                  int axis, const internal::LeafNamer& namer, const std::vector<internal::ShapeRule>* rules = nullptr) {
  try {
    internal::check_signatures(sigs, first_replica, rule, axis, namer, "replica", rules);
  } catch (const Error&) {
    ch.agreed_failure = true;
    throw;
  }
}

[[noreturn]] void explain_mismatch(ReplicaChannel& ch, const Signature& sig, CollectiveCall call, int first_replica,
                                   internal::ShapeRule rule, int axis, const internal::LeafNamer& namer,
                                   const std::vector<internal::ShapeRule>* rules = nullptr) {
  call.signature_tag = 0;
  std::vector<std::string> payloads = ch.comm->exchange(sig.encode(), call);
  std::vector<Signature> sigs;
  for (const auto& p : payloads) sigs.push_back(Signature::decode(p));
  check_agreed(ch, sigs, first_replica, rule, axis, namer, rules);
  throw InternalError(std::string(sig.op) + " #" + std::to_string(sig.sequence) +
                      ": signature tags differ but the signatures agree (a hash collision)");
}

// Exchanges full signatures (the first round, tagged by op, sequence and
// fields) and checks them; returns all signatures (all_gather needs the
// other replicas' shapes).
std::vector<Signature> agree(ReplicaChannel& ch, const Signature& sig, CollectiveCall call, int first_replica,
                             internal::ShapeRule rule, int axis, const internal::LeafNamer& namer,
                             const std::vector<internal::ShapeRule>* rules = nullptr) {
  call.signature_tag = sig.tag(/*with_leaves=*/false);
  std::vector<std::string> payloads;
  try {
    payloads = ch.comm->exchange(sig.encode(), call);
  } catch (const internal::SignatureMismatch&) {
    explain_mismatch(ch, sig, call, first_replica, rule, axis, namer, rules);
  }
  std::vector<Signature> sigs;
  sigs.reserve(payloads.size());
  for (const auto& p : payloads) sigs.push_back(Signature::decode(p));
  check_agreed(ch, sigs, first_replica, rule, axis, namer, rules);
  return sigs;
}

// The common start of every collective: check the context, merge the options,
// take the next sequence number and begin the signature (with the local
// verdict on the options).
struct CollectiveStart {
  CommunicationOptions options;
  CollectiveCall call;
  Signature sig;
};

CollectiveStart begin_collective(ReplicaContext& ctx, const char* op, const CommunicationOptions& options) {
  internal::require_replica_context(ctx, op);
  CollectiveStart start;
  start.options = ctx.strategy().communication_options().merge(options);
  internal::note_implementation(start.options);
  start.call = internal::next_call(ctx.channel(), op, start.options);
  start.sig.op = op;
  start.sig.sequence = start.call.sequence;
  try {
    start.options.validate();
  } catch (const Error& e) {
    start.sig.set_error(e);
  }
  return start;
}

internal::LeafNamer namer_for(const std::vector<std::string>& paths) {
  return [&paths](std::size_t i) { return i < paths.size() ? paths[i] : std::string(); };
}

int first_replica_of_group(const ReplicaContext& ctx) {
  return ctx.replica_id_in_sync_group() - ctx.channel().comm->rank();
}

// A collective's output, which the communicator allocates: out of memory
// there is raised as ResourceExhaustedError naming the collective and the
// size, not a bare std::bad_alloc. The in-process and hierarchical
// backends raise it on every replica alike, before any input is read; the
// defaults of Communicator allocate on each rank alone, and a rank that
// raises it alone aborts the others (the run's abort).
template <class Make>
std::shared_ptr<std::byte> collective_output(const CollectiveCall& call, DType dtype, std::size_t elements,
                                             Make&& make) {
  try {
    return make();
  } catch (const std::bad_alloc&) {
    throw ResourceExhaustedError(std::string(call.op) + " #" + std::to_string(call.sequence) +
                                 ": out of memory allocating its result, " +
                                 internal::bytes_text(elements * size_of(dtype)) + " of " +
                                 std::string(to_string(dtype)));
  }
}

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

// The result for `value`, `offset` bytes into a reduced output. Takes its
// reference by value: the replicas share the output's control block, so each
// reference count change is a cache line bounced between cores, and a moved-in
// reference (the lone value's, a pack's last) changes none.
Tensor result_view(std::shared_ptr<std::byte> result, std::size_t offset, const Tensor& value,
                   const std::string& device) {
  std::byte* const at = result.get() + offset;
  std::shared_ptr<std::byte> view = value.nbytes() ? std::shared_ptr<std::byte>(std::move(result), at) : nullptr;
  return Tensor::from_shared(std::move(view), value.dtype(), value.shape(), device).as_read_only();
}

// The reference the `views` views of a pack's output copy. If other
// replicas hold the output too (the engine shared it: a count above 1), one
// whose count is this replica's own: the views (a model's gradients:
// hundreds) copy it, and the output's own count, on a line every replica of
// the process writes, changes once. An output of this replica's own needs
// no second count.
std::shared_ptr<std::byte> reference_for_views(std::shared_ptr<std::byte> result, std::size_t views) {
  if (views < 2 || result.use_count() < 2) return result;
  auto holder = std::make_shared<std::shared_ptr<std::byte>>(std::move(result));
  std::byte* const data = holder->get();
  return {std::move(holder), data};
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

}  // namespace

// ---- all_reduce ----------------------------------------------------------------

namespace {
// The structure string of a lone Tensor (a one-leaf nest).
const std::string& leaf_structure() {
  static const std::string structure = Nest<Tensor>(Tensor()).structure_string();
  return structure;
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

void add_field(Signature& sig, std::string_view key, std::string_view value) {
  sig.fields.emplace_back(std::string(key), std::string(value));
}

void describe_all_reduce(Signature& sig, ReduceOp op, const Nest<Tensor>& value, std::span<const Tensor> leaves,
                         std::int64_t bytes_per_pack) {
  all_reduce_fields(op, value.structure_string(), bytes_per_pack,
                    [&](std::string_view key, std::string_view text) { add_field(sig, key, text); });
  for (const Tensor& t : leaves) sig.leaves.push_back({t.dtype(), t.shape().dims()});
}

// The tag describe_all_reduce's Signature would have, hashed from the
// arguments in place: a Signature costs heap allocations per leaf (hundreds
// for a model's gradients), and is built only to explain a mismatch.
// all_reduce_hash is all of it but the sequence (for a CallMemo).
// `fields(add)` hands the collective's fields to `add`, as all_reduce_fields.
template <class Fields>
internal::TagHasher fields_and_leaves_hash(std::string_view op_name, const Fields& fields,
                                           std::span<const Tensor> leaves) {
  internal::TagHasher tag(op_name);
  fields([&](std::string_view key, std::string_view text) { tag.field(key, text); });
  tag.leaf_count(leaves.size());
  for (const Tensor& t : leaves) tag.leaf(t.dtype(), t.shape().dims_span());
  return tag;
}

internal::TagHasher all_reduce_hash(std::string_view op_name, ReduceOp op, std::string_view structure,
                                    std::span<const Tensor> leaves, std::int64_t bytes_per_pack) {
  return fields_and_leaves_hash(
      op_name, [&](auto&& add) { all_reduce_fields(op, structure, bytes_per_pack, add); }, leaves);
}

std::uint64_t all_reduce_tag(const Signature& sig, ReduceOp op, std::string_view structure,
                             std::span<const Tensor> leaves, std::int64_t bytes_per_pack) {
  return all_reduce_hash(sig.op, op, structure, leaves, bytes_per_pack).finish(sig.sequence, sig.error_code.has_value());
}

// The rest of an all_reduce once it has begun: `leaves` are the value
// flattened, of structure `structure`; `as_nest` makes the value as a Nest,
// only to explain a mismatch.
template <class AsNest>
std::vector<Tensor> reduce_leaves(ReplicaContext& ctx, ReduceOp op, const std::vector<Tensor>& leaves,
                                  std::string_view structure, CollectiveStart& start, const AsNest& as_nest) {
  ReplicaChannel& ch = ctx.channel();
  const std::int64_t bytes_per_pack = start.options.bytes_per_pack;
  // The hash travels with the first data round. Only if the hashes differ do
  // the replicas exchange full signatures, to explain.
  start.call.signature_tag = all_reduce_tag(start.sig, op, structure, leaves, bytes_per_pack);
  const std::string device;  // empty: the replica thread's device scope (this replica's device), no copy
  try {
    return reduce_packed(ch, leaves, op, std::max<std::int64_t>(0, bytes_per_pack), start.call, device);
  } catch (const internal::SignatureMismatch&) {
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
  } catch (const internal::SignatureMismatch&) {
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
  return reduce_leaves(*this, op, value, Nest<Tensor>::list_of_leaves_structure(value.size()), start, [&] {
    return Nest<Tensor>::list(std::vector<Nest<Tensor>>(value.begin(), value.end()));
  });
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

IndexedSlices ReplicaContext::all_reduce(ReduceOp op, const IndexedSlices& value,
                                         const CommunicationOptions& options) {
  auto [opts, call, sig] = begin_collective(*this, "all_reduce", options);
  ReplicaChannel& ch = *channel_;
  sig.fields = {{"reduce op", std::string(to_string(op))},
                {"structure", "IndexedSlices"},
                {"dense_shape", value.dense_shape().to_string()},
                {"indices dtype", std::string(to_string(value.indices().dtype()))}};
  sig.leaves.push_back({value.values().dtype(), value.values().shape().dims()});
  refuse_slices_op(op, sig);
  const std::vector<Signature> sigs = agree(ch, sig, call, first_replica_of_group(*this),
                                            internal::ShapeRule::kAllButFirst, 0, nullptr);
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
  const std::vector<Signature> sigs =
      agree(ch, sig, start.call, first_replica_of_group(*this), internal::ShapeRule::kEqual, 0, namer_for(paths), &rules);
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

// ---- all_gather ----------------------------------------------------------------

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

// Gathers every leaf; `sigs` gives every member's shapes (nullptr: all are this replica's).
std::vector<Tensor> gather_values(ReplicaChannel& ch, const std::vector<Tensor>& leaves, int axis,
                                  const std::vector<Signature>* sigs, CollectiveCall data_call) {
  const auto members = static_cast<std::size_t>(ch.comm->size());
  std::vector<Tensor> out;
  out.reserve(leaves.size());
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const Tensor& leaf = leaves[i];
    const auto a = static_cast<std::size_t>(axis < 0 ? axis + leaf.rank() : axis);
    out.push_back(gather_leaf(ch, leaf,
                              sigs ? internal::gather_layout(leaf, axis, members,
                                                             [&](std::size_t q) { return (*sigs)[q].leaves[i].dims[a]; })
                                   : same_shapes_layout(ch, leaf, axis),
                              data_call));
    data_call.signature_tag = 0;
  }
  return out;
}

// The first round of an all_gather assumes the same shapes on every replica
// (the common case); the hash of the signature, shapes included, rides on it.
// Every replica takes the same rounds: a replica with nothing to gather, or
// an invalid value, offers its hash in a barrier. Returns nothing if the
// hashes differ (ragged values, a mismatch, a local error).
std::optional<std::vector<Tensor>> gather_same_shapes(ReplicaChannel& ch, const std::vector<Tensor>& leaves, int axis,
                                                      bool local_error, const CollectiveCall& first) {
  try {
    if (leaves.empty() || local_error) {
      ch.comm->barrier(first);
      if (leaves.empty()) return std::vector<Tensor>{};
    } else {
      return gather_values(ch, leaves, axis, nullptr, first);
    }
  } catch (const internal::SignatureMismatch&) {
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
  return gather_values(ch, leaves, axis, &sigs, call);
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
    all_gather_fields(axis, leaf_structure(), [&](std::string_view key, std::string_view text) { tag.field(key, text); });
    tag.leaf_count(1);
    tag.leaf(value.dtype(), value.shape().dims_span());
    decltype(ch.all_gather_memo)::Entry entry{.state = tag.state()};
    Signature verdict;  // on the value alone (sig's may be on the options)
    internal::validate_gather_leaf(value, axis, verdict);
    try {
      if (!verdict.error_code) entry.extra = same_shapes_layout(ch, value, axis);
    } catch (const Error&) {
      // Sizes past int64: raised below where a layout is needed, so that
      // an invalid option elsewhere still gives every replica its error.
    }
    return entry;
  });
  CollectiveCall first = call;
  first.signature_tag = internal::TagHasher::resume(memo.state).finish(sig.sequence, sig.error_code.has_value());
  // gather_same_shapes for one value, without its vectors.
  try {
    if (sig.error_code) {
      ch.comm->barrier(first);  // the tag says this replica's value is invalid: every replica throws
    } else {
      if (!memo.extra) return gather_leaf(ch, value, same_shapes_layout(ch, value, axis), first);  // raises
      return gather_leaf(ch, value, *memo.extra, first);
    }
  } catch (const internal::SignatureMismatch&) {
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

// ---- broadcast -----------------------------------------------------------------

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
    std::shared_ptr<std::byte> result = collective_output(
        call, pack.dtype, pack.count, [&] { return ch.comm->broadcast_shared(send, pack.count, pack.dtype, root, call); });
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
  ReplicaChannel& ch = ctx.channel();
  try {
    if (!sig.error_code) return move();
    ch.comm->barrier(call);  // the tag says this replica's call is invalid: every replica throws
  } catch (const internal::SignatureMismatch&) {
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
        return broadcast_packed(ctx.channel(), leaves, root_replica - first_replica_of_group(ctx),
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
  const auto& memo = ch.broadcast_memo.get({root_replica, bytes_per_pack}, value.dtype(), value.shape().dims_span(),
                                           [&] {
                                             return internal::CallMemo<>::Entry{
                                                 .state = broadcast_hash(op_name, root_replica, leaf_structure(),
                                                                         {&value, 1}, bytes_per_pack)
                                                              .state()};
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

// ---- merge_call ----------------------------------------------------------------

namespace {
constexpr const char* kMergeTypesField = "merge_fn and argument types";
}  // namespace

std::shared_ptr<void> ReplicaContext::merge_call_impl(const internal::MergeTypes& types, const void* args,
                                                      const MergeBody& body) {
  internal::require_replica_context(*this, "merge_call");
  ReplicaChannel& ch = *channel_;
  const CommunicationOptions& opts = strategy_->communication_options();
  CollectiveCall call = internal::next_call(ch, "merge_call", opts);
  call.count_mismatch = "Some replicas made a different number of replica_context().merge_call() calls";
  Signature sig;
  sig.op = "merge_call";
  sig.sequence = call.sequence;

  // Across workers, merge_fn runs once per worker and need not cross workers
  // at all, so a worker whose replicas called another collective here would
  // be found only at the next collective that crosses workers (or by the
  // timeout). One tagged barrier of every replica of every worker finds it
  // here, with the same error everywhere. It checks the call and its place
  // in the program only: workers may run merge_fns of other types (as in
  // TensorFlow); the local round below checks the types among this worker's
  // replicas.
  if (ch.comm->size() > ch.local->size()) {
    Signature across;
    across.op = sig.op;
    across.sequence = sig.sequence;
    CollectiveCall check = call;
    check.signature_tag = across.tag(false);
    try {
      ch.comm->barrier(check);
    } catch (const internal::SignatureMismatch&) {
      explain_mismatch(ch, across, call, first_replica_of_group(*this), internal::ShapeRule::kEqual, 0, nullptr);
    }
  }

  // Round 1: every local replica arrives with its arguments and a hash of the
  // call and the types' digest (the readable names are hashed once per
  // instantiation, not per call); if the hashes differ, a second round
  // exchanges full signatures, with the names, to explain.
  internal::TagHasher tag(sig.op);
  tag.field(kMergeTypesField, std::string_view(reinterpret_cast<const char*>(&types.digest), sizeof types.digest));
  std::vector<const void*> all_args;
  try {
    const auto& entries = ch.local->arrive(local_id_, {.send = args, .tag = tag.finish(sig.sequence, false)}, call);
    for (const auto& e : entries) all_args.push_back(e.send);
  } catch (const internal::SignatureMismatch&) {
    sig.fields = {{kMergeTypesField, types.names}};
    CollectiveCall explain = call;
    explain.signature_tag = 0;
    std::vector<Signature> sigs;
    for (const auto& e : ch.local->arrive(local_id_, {.payload = sig.encode()}, explain)) {
      sigs.push_back(Signature::decode(e.payload));
    }
    internal::check_signatures(sigs, replica_id_ - local_id_, internal::ShapeRule::kEqual, 0, nullptr);
    throw InternalError("merge_call #" + std::to_string(call.sequence) + ": signature hashes differ but agree");
  }

  // Round 2: replica 0 runs merge_fn in the cross-replica context and hands the
  // result to all. Waiting for merge_fn has no deadline: it may run whole steps.
  CollectiveCall wait_result = call;
  wait_result.timeout_seconds = 0;
  wait_result.stall_warning_seconds = 0;
  std::shared_ptr<void> result;
  if (local_id_ == 0) {
    // Said once the arguments are copied, or when the body fails before.
    struct Taken final : ArgsTaken {
      std::atomic<std::uint64_t>* flag;
      std::uint64_t sequence;
      Taken(std::atomic<std::uint64_t>* f, std::uint64_t s) : flag(f), sequence(s) {}
      Taken(const Taken&) = delete;
      Taken& operator=(const Taken&) = delete;
      ~Taken() { (*this)(); }
      void operator()() const noexcept override {
        if (flag != nullptr && flag->load(std::memory_order_relaxed) < sequence) {
          flag->store(sequence, std::memory_order_release);
        }
      }
    } const taken(ch.merge_args_taken, call.sequence);
    try {
      internal::ModeEntry entry{strategy_, strategy_, nullptr, 1, ch.depth};
      if (ch.local->size() > 1) {
        entry.merge_helpers = ch.local;  // the others, paused below, can share its copies
        entry.merge_rounds = &wait_result;
      }
      internal::ModeGuard mode(entry);
      internal::forget_agreed_worker_error();  // only an agreement inside this merge_fn counts
      result = body(all_args, taken);
    } catch (...) {
      const std::exception_ptr error = std::current_exception();
      const std::string msg = "merge_fn of replica " + std::to_string(replica_id_) + " (merge_call #" +
                              std::to_string(call.sequence) + ") failed with " +
                              internal::describe_exception(error) + "; the other replicas were aborted.";
      // An error every worker's merge_fn raised alike (a reduce_to, gather, ...
      // inside it found a mismatch between workers) leaves nothing in flight
      // between workers: their link stays usable, as for the same call outside
      // merge_call. Anything else may leave other workers waiting: abort them.
      // (The default replica context has no run, hence no shared flag.)
      const bool agreed = internal::take_agreed_worker_error(error) && ch.merge_failure_agreed != nullptr;
      if (agreed) {
        ch.agreed_failure = true;
        ch.merge_failure_agreed->store(true);
      }
      // Release the others (a group of one has nobody waiting, and the default
      // replica context's group is never reset, so it is left alone).
      if (ch.local->size() > 1) ch.local->abort(ErrorCode::kAborted, msg, local_id_);
      if (!agreed && ch.comm->size() > 1) ch.comm->abort(ErrorCode::kAborted, msg, local_id_);
      throw;
    }
    ch.local->arrive(local_id_, {.object = result}, wait_result);
    return result;
  }
  // This replica's arguments live on its stack, and replica 0 reads them in
  // place until it has copied them: an abort arriving before that (from
  // another worker, or a merge_fn that aborts) must not unwind them. Replica 0
  // reaches its copy once the first round is complete, and its copying is
  // bounded, so this wait ends.
  struct WaitForArgsTaken {
    const std::atomic<std::uint64_t>* flag;
    std::uint64_t sequence;
    ~WaitForArgsTaken() {
      while (flag != nullptr && flag->load(std::memory_order_acquire) < sequence) std::this_thread::yield();
    }
  } const wait_for_args{ch.merge_args_taken, call.sequence};
  try {
    // Until the result comes, run the shares of the work merge_fn hands out
    // (internal::share_with_paused_replicas): a round with a task, then a
    // round to say it is done.
    for (;;) {
      const auto& entries = ch.local->arrive(local_id_, {}, wait_result);
      if (entries[0].send != &internal::kMergeTaskMark) return entries[0].object;
      const auto task = std::static_pointer_cast<const internal::MergeTask>(entries[0].object);
      task->run(local_id_, ch.local->size());
      ch.local->release(local_id_, wait_result);
    }
  } catch (const Error&) {
    // Released by replica 0's failed merge_fn: an agreed failure is agreed here too.
    if (ch.merge_failure_agreed != nullptr && ch.merge_failure_agreed->load()) ch.agreed_failure = true;
    throw;
  }
}

}  // namespace distribute
