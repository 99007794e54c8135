// The cross-replica reductions and gathers of Strategy (reduce, gather and the
// reduce_components / check_and_agree they and StrategyExtended build on).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/axis_reduce.h"
#include "core/reduce_kernels.h"
#include "distribute/strategy.h"
#include "runtime/gather_layout.h"
#include "runtime/packing.h"
#include "runtime/runtime_util.h"
#include "runtime/signature.h"
#include "runtime/strategy_internal.h"

namespace distribute {
namespace internal {

void check_components(std::size_t given, const Strategy& s, std::string_view what) {
  if (given != static_cast<std::size_t>(s.num_local_replicas())) {
    throw InvalidArgumentError(std::string(what) + ": a distributed value has " + std::to_string(given) +
                               " components but " + s.describe() + " has " + std::to_string(s.num_local_replicas()) +
                               " local replicas");
  }
}

void check_non_distributed(ReduceOp op, const Strategy& s, const std::string& value_text, bool mirrored) {
  if (op == ReduceOp::kMean || op == ReduceOp::kMin || op == ReduceOp::kMax || s.num_replicas_in_sync() == 1) {
    return;
  }
  if (mirrored) {
    throw InvalidArgumentError("A Mirrored value " + value_text + " cannot be reduced with " +
                               std::string(to_string(op)) + ": its components are already identical");
  }
  throw InvalidArgumentError("A non-DistributedValues value " + value_text +
                             " cannot be reduced with the given reduce op " + std::string(to_string(op)) + ".");
}

std::string short_text(const Tensor& t) {
  return t.num_elements() <= 16 ? t.to_list_string() : "of shape " + t.shape().to_string();
}

}  // namespace internal

namespace {
void check_same_dtype_and_shape(const std::vector<Tensor>& components, std::string_view api, int first_replica_id_) {
  for (std::size_t i = 1; i < components.size(); ++i) {
    const Tensor& a = components[0];
    const Tensor& b = components[i];
    if (a.dtype() != b.dtype() || a.shape() != b.shape()) {
      throw InvalidArgumentError(std::string(api) + ": the components must have the same dtype and shape: replica " +
                                 std::to_string(first_replica_id_) + " has " + std::string(to_string(a.dtype())) +
                                 a.shape().to_string() + ", replica " +
                                 std::to_string(first_replica_id_ + static_cast<int>(i)) + " has " +
                                 std::string(to_string(b.dtype())) + b.shape().to_string());
    }
  }
}
}  // namespace

void Strategy::check_and_agree(const std::vector<Tensor>& components, std::string_view api, ReduceOp op,
                               const CommunicationOptions& options) {
  check_and_agree_batch({&components}, api, op, options);
}

void Strategy::check_and_agree_batch(const std::vector<const std::vector<Tensor>*>& values, std::string_view api,
                                     ReduceOp op, const CommunicationOptions& options) {
  internal::Signature sig;
  sig.op = std::string(api);
  sig.fields = {{"reduce op", std::string(to_string(op))}, {"values", std::to_string(values.size())}};
  try {
    options.validate();
  } catch (const Error& e) {
    sig.set_error(e);
  }
  for (std::size_t k = 0; k < values.size() && !sig.error_code; ++k) {
    const std::vector<Tensor>& components = *values[k];
    try {
      internal::check_components(components.size(), *this, api);
      check_same_dtype_and_shape(components, api, first_replica_id_);
      sig.leaves.push_back({components[0].dtype(), components[0].shape().dims()});
    } catch (const Error& e) {
      sig.set_error(values.size() == 1 ? e : Error(e.code(), "value " + std::to_string(k) + ": " + e.message()));
      break;
    }
  }
  std::lock_guard<std::recursive_mutex> lock(state_->worker_mutex);
  internal::agree_workers(*state_, options, sig, internal::ShapeRule::kEqual, 0);
}

Tensor Strategy::reduce_components(ReduceOp op, const std::vector<Tensor>& components,
                                   const CommunicationOptions& options, std::int64_t mean_divisor) {
  return reduce_components_batch(op, {&components}, options, mean_divisor)[0];
}

std::vector<Tensor> Strategy::reduce_components_batch(ReduceOp op,
                                                      const std::vector<const std::vector<Tensor>*>& values,
                                                      const CommunicationOptions& options, std::int64_t mean_divisor) {
  const std::int64_t divisor = mean_divisor > 0 ? mean_divisor : num_replicas_in_sync_;
  Communicator* workers = state_->workers;
  const bool across = workers != nullptr && workers->size() > 1;
  // Several workers: the local replicas first (MEAN as a SUM), then the workers, dividing once.
  const ReduceOp local_op = across && op == ReduceOp::kMean ? ReduceOp::kSum : op;
  std::vector<Tensor> firsts;
  firsts.reserve(values.size());
  for (const auto* v : values) firsts.push_back(v->front());
  std::vector<Tensor> out(values.size());
  for (const internal::Pack& pack : internal::plan_packs(firsts, options.bytes_per_pack)) {
    const std::size_t elem = size_of(pack.dtype);
    if (across && op == ReduceOp::kMean && !is_floating(pack.dtype)) {
      // An exact integer (or bool) MEAN cannot be split into per-worker sums
      // (they would wrap, and bool's "sum" is OR): gather every replica's
      // values of the pack and reduce them once, in replica order.
      reduce_exact_mean(pack, values, divisor, options, out);
      continue;
    }
    Tensor buffer = Tensor::uninitialized(pack.dtype, Shape{static_cast<std::int64_t>(pack.count)}, kHostDevice);
    auto* base = static_cast<std::byte*>(buffer.mutable_raw_data());
    std::size_t offset = 0;
    std::vector<const void*> srcs;
    for (std::size_t leaf : pack.leaves) {
      const std::vector<Tensor>& components = *values[leaf];
      const auto count = static_cast<std::size_t>(components.front().num_elements());
      srcs.clear();
      for (const Tensor& t : components) srcs.push_back(t.raw_data());
      internal::reduce_sources(base + offset * elem, srcs, count, pack.dtype, local_op, divisor);
      // A view of the pack: no copy out.
      out[leaf] = Tensor::from_shared(std::shared_ptr<std::byte>(buffer.storage(), base + offset * elem), pack.dtype,
                                      components.front().shape(), kHostDevice);
      offset += count;
    }
    if (across) {
      std::lock_guard<std::recursive_mutex> lock(state_->worker_mutex);
      const CollectiveCall call = internal::worker_call(*state_, options, "reduce");
      workers->all_reduce(base, base, pack.count, pack.dtype, op, call, divisor);
    }
  }
  return out;
}

void Strategy::reduce_exact_mean(const internal::Pack& pack, const std::vector<const std::vector<Tensor>*>& values,
                                 std::int64_t divisor, const CommunicationOptions& options, std::vector<Tensor>& out) {
  const std::size_t elem = size_of(pack.dtype);
  const auto local = static_cast<std::size_t>(num_local_replicas());
  const auto workers = static_cast<std::size_t>(state_->workers->size());
  // This worker's block: replica i's values of the pack, one replica after another.
  Tensor block = Tensor::uninitialized(pack.dtype, Shape{static_cast<std::int64_t>(pack.count * local)}, kHostDevice);
  auto* at = static_cast<std::byte*>(block.mutable_raw_data());
  for (std::size_t i = 0; i < local; ++i) {
    for (std::size_t leaf : pack.leaves) {
      const Tensor& t = (*values[leaf])[i];
      std::memcpy(at, t.raw_data(), t.nbytes());
      at += t.nbytes();
    }
  }
  Tensor all =
      Tensor::uninitialized(pack.dtype, Shape{static_cast<std::int64_t>(pack.count * local * workers)}, kHostDevice);
  {
    std::lock_guard<std::recursive_mutex> lock(state_->worker_mutex);
    const std::vector<std::size_t> counts(workers, pack.count * local);
    state_->workers->all_gather_v(block.raw_data(), all.mutable_raw_data(), counts, 1, pack.dtype,
                                  internal::worker_call(*state_, options, "reduce"));
  }
  Tensor buffer = Tensor::uninitialized(pack.dtype, Shape{static_cast<std::int64_t>(pack.count)}, kHostDevice);
  auto* base = static_cast<std::byte*>(buffer.mutable_raw_data());
  const auto* gathered = static_cast<const std::byte*>(all.raw_data());
  std::vector<const void*> srcs(local * workers);
  std::size_t offset = 0;
  for (std::size_t leaf : pack.leaves) {
    const Tensor& first = values[leaf]->front();
    const auto count = static_cast<std::size_t>(first.num_elements());
    for (std::size_t r = 0; r < srcs.size(); ++r) srcs[r] = gathered + (r * pack.count + offset) * elem;
    internal::reduce_sources(base + offset * elem, srcs, count, pack.dtype, ReduceOp::kMean, divisor);
    out[leaf] = Tensor::from_shared(std::shared_ptr<std::byte>(buffer.storage(), base + offset * elem), pack.dtype,
                                    first.shape(), kHostDevice);
    offset += count;
  }
}

Tensor Strategy::reduce_along_axes(ReduceOp op, const std::vector<Tensor>& components, const std::vector<int>& axes) {
  const ReduceOp partial = op == ReduceOp::kMean ? ReduceOp::kSum : op;
  std::vector<Tensor> partials;
  std::vector<Tensor> counts;
  internal::Signature sig;
  sig.op = "reduce";
  std::string axes_text;
  for (int a : axes) axes_text += (axes_text.empty() ? "" : ", ") + std::to_string(a);
  sig.fields = {{"reduce op", std::string(to_string(op))}, {"axes", "[" + axes_text + "]"}};
  try {
    internal::check_components(components.size(), *this, "reduce");
    for (std::size_t i = 0; i < components.size(); ++i) {
      const Tensor& c = components[i];
      if (c.dtype() != components[0].dtype()) {
        throw InvalidArgumentError("reduce: replica " + std::to_string(first_replica_id_ + static_cast<int>(i)) +
                                   " has dtype " + std::string(to_string(c.dtype())) + ", replica " +
                                   std::to_string(first_replica_id_) + " has " +
                                   std::string(to_string(components[0].dtype())));
      }
      const std::vector<int> norm = internal::normalize_axes(axes, c.rank());
      std::int64_t count = 1;
      for (int a : norm) count *= c.shape()[a];
      partials.push_back(internal::reduce_axes(c, norm, partial));  // identity of c's dtype on empty axes
      counts.push_back(scalar(DType::kInt64, static_cast<double>(count)));
    }
    check_same_dtype_and_shape(partials, "reduce (after reducing along the axis)", first_replica_id_);
    sig.leaves.push_back({partials[0].dtype(), partials[0].shape().dims()});
  } catch (const Error& e) {
    sig.set_error(e);
  }
  std::lock_guard<std::recursive_mutex> lock(state_->worker_mutex);
  internal::agree_workers(*state_, options_, sig, internal::ShapeRule::kEqual, 0);
  Tensor total = reduce_components(partial, partials, options_, 0);
  if (op == ReduceOp::kMean) {
    const std::int64_t n = reduce_components(ReduceOp::kSum, counts, options_, 0).scalar<std::int64_t>();
    if (n == 0 && !is_floating(components[0].dtype())) {
      throw InvalidArgumentError("reduce: the MEAN of zero elements of dtype " +
                                 std::string(to_string(components[0].dtype())) + " is undefined");
    }
    if (n == 0) {
      total = fill(total.dtype(), total.shape(), std::nan(""));
    } else {
      const void* src[1] = {total.raw_data()};
      internal::reduce_sources(total.mutable_raw_data(), src, static_cast<std::size_t>(total.num_elements()),
                               total.dtype(), ReduceOp::kMean, n);
    }
  }
  return cast(total, components[0].dtype()).with_device(kHostDevice);
}

Tensor Strategy::reduce(ReduceOp op, const PerReplica<Tensor>& value, std::optional<int> axis) {
  require_cross_replica_or_default("reduce");
  if (axis) return reduce_along_axes(op, value.values(), {*axis});
  std::lock_guard<std::recursive_mutex> lock(state_->worker_mutex);
  check_and_agree(value.values(), "reduce", op, options_);
  return reduce_components(op, value.values(), options_, 0);
}

Tensor Strategy::reduce(ReduceOp op, const PerReplica<Tensor>& value, const std::vector<int>& axes) {
  require_cross_replica_or_default("reduce");
  return reduce_along_axes(op, value.values(), axes);
}

Tensor Strategy::reduce(ReduceOp op, const Mirrored<Tensor>& value, std::optional<int> axis) {
  require_cross_replica_or_default("reduce");
  internal::check_components(value.size(), *this, "reduce");
  internal::check_non_distributed(op, *this, internal::short_text(value.primary()), /*mirrored=*/true);
  if (!axis) return value.primary().clone().with_device(kHostDevice);
  // Every component is the same: reducing N copies gives the right MEAN (and MIN, MAX).
  return reduce_along_axes(op, value.values(), {*axis});
}

Tensor Strategy::reduce(ReduceOp op, const Tensor& value, std::optional<int> axis) {
  require_cross_replica_or_default("reduce");
  if (!axis && values_are_per_worker()) return reduce_per_worker(op, value, options_, "reduce");
  internal::check_non_distributed(op, *this, internal::short_text(value), /*mirrored=*/false);
  if (!axis) return value;
  return reduce_along_axes(op, std::vector<Tensor>(static_cast<std::size_t>(num_local_replicas()), value), {*axis});
}

bool Strategy::values_are_per_worker() const { return state_->workers != nullptr && state_->workers->size() > 1; }

Tensor Strategy::reduce_per_worker(ReduceOp op, const Tensor& value, const CommunicationOptions& options,
                                   std::string_view api) {
  internal::Signature sig;
  sig.op = std::string(api);
  sig.fields = {{"reduce op", std::string(to_string(op))}, {"value", "one per worker (not distributed)"}};
  sig.leaves.push_back({value.dtype(), value.shape().dims()});
  try {
    options.validate();
  } catch (const Error& e) {
    sig.set_error(e);
  }
  std::lock_guard<std::recursive_mutex> lock(state_->worker_mutex);
  internal::agree_workers(*state_, options, sig, internal::ShapeRule::kEqual, 0);
  Tensor out = value.clone().with_device(kHostDevice);
  const CollectiveCall call = internal::worker_call(*state_, options, api);
  // MEAN over the workers: each element is reduced from every worker's at
  // once (integers exactly, truncated toward zero).
  state_->workers->all_reduce(out.raw_data(), out.mutable_raw_data(), static_cast<std::size_t>(out.num_elements()),
                              out.dtype(), op, call, state_->workers->size());
  return out;
}

namespace {
std::string slices_text(const IndexedSlices& s) {
  return "dense_shape " + s.dense_shape().to_string() + ", indices " + std::string(to_string(s.indices().dtype()));
}

// The rows of values of `s`, as a shape with its first dimension dropped: "(?, 4)".
std::string row_shape(const Tensor& values) {
  std::string text = "(?";
  for (int d = 1; d < values.rank(); ++d) text += ", " + std::to_string(values.shape()[d]);
  return text + (values.rank() == 1 ? ",)" : ")");
}
}  // namespace

IndexedSlices Strategy::reduce_slices(ReduceOp op, const std::vector<IndexedSlices>& components,
                                      const CommunicationOptions& options, std::string_view api) {
  internal::Signature sig;
  sig.op = std::string(api);
  sig.fields = {{"reduce op", std::string(to_string(op))}};
  Tensor values, indices;
  try {
    options.validate();
    internal::check_components(components.size(), *this, api);
    if (op != ReduceOp::kSum && op != ReduceOp::kMean) {
      throw InvalidArgumentError(std::string(api) + " of IndexedSlices supports SUM and MEAN only, not " +
                                 std::string(to_string(op)));
    }
    const IndexedSlices& first = components.front();
    for (std::size_t i = 1; i < components.size(); ++i) {
      const IndexedSlices& c = components[i];
      if (slices_text(c) != slices_text(first) || c.dtype() != first.dtype() ||
          row_shape(c.values()) != row_shape(first.values())) {
        throw InvalidArgumentError(std::string(api) + ": the IndexedSlices of the replicas differ: replica " +
                                   std::to_string(first_replica_id_) + " has " + std::string(to_string(first.dtype())) +
                                   row_shape(first.values()) + ", " + slices_text(first) + "; replica " +
                                   std::to_string(first_replica_id_ + static_cast<int>(i)) + " has " +
                                   std::string(to_string(c.dtype())) + row_shape(c.values()) + ", " + slices_text(c));
      }
    }
    std::vector<Tensor> local_values, local_indices;
    for (const IndexedSlices& c : components) {
      local_values.push_back(c.values());
      local_indices.push_back(c.indices());
    }
    values = concat(local_values, 0).with_device(kHostDevice);
    indices = concat(local_indices, 0).with_device(kHostDevice);
    sig.fields.emplace_back("IndexedSlices", slices_text(first));
    sig.leaves.push_back({values.dtype(), values.shape().dims()});
  } catch (const Error& e) {
    sig.set_error(e);
  }
  std::lock_guard<std::recursive_mutex> lock(state_->worker_mutex);
  const std::vector<internal::Signature> blocks =
      internal::agree_workers(*state_, options, sig, internal::ShapeRule::kAllButFirst, 0);
  const IndexedSlices& first = components.front();
  if (blocks.size() > 1) {
    // Every worker's rows, in worker order: replica order.
    std::int64_t row = 1;
    for (int d = 1; d < values.rank(); ++d) row *= values.shape()[d];
    std::vector<std::size_t> value_counts, index_counts;
    std::int64_t rows = 0;
    for (const internal::Signature& b : blocks) {
      value_counts.push_back(static_cast<std::size_t>(b.leaves[0].dims[0] * row));
      index_counts.push_back(static_cast<std::size_t>(b.leaves[0].dims[0]));
      rows += b.leaves[0].dims[0];
    }
    std::vector<std::int64_t> dims = values.shape().dims();
    dims[0] = rows;
    Tensor all_values = Tensor::uninitialized(values.dtype(), Shape(dims), kHostDevice);
    Tensor all_indices = Tensor::uninitialized(indices.dtype(), Shape{rows}, kHostDevice);
    state_->workers->all_gather_v(values.raw_data(), all_values.mutable_raw_data(), value_counts, 1, values.dtype(),
                                  internal::worker_call(*state_, options, api));
    state_->workers->all_gather_v(indices.raw_data(), all_indices.mutable_raw_data(), index_counts, 1, indices.dtype(),
                                  internal::worker_call(*state_, options, api));
    values = all_values;
    indices = all_indices;
  }
  if (op == ReduceOp::kMean) {
    values = values.clone();
    const void* src[1] = {values.raw_data()};
    internal::reduce_sources(values.mutable_raw_data(), src, static_cast<std::size_t>(values.num_elements()),
                             values.dtype(), ReduceOp::kMean, num_replicas_in_sync_);
  }
  return IndexedSlices(values, indices, first.dense_shape());
}

IndexedSlices Strategy::reduce(ReduceOp op, const PerReplica<IndexedSlices>& value) {
  require_cross_replica_or_default("reduce");
  return reduce_slices(op, value.values(), options_, "reduce");
}

Tensor Strategy::gather(const PerReplica<Tensor>& value, int axis) {
  require_cross_replica_or_default("gather");
  const auto& comps = value.values();
  // This worker's replicas, concatenated; then (several workers) the workers' blocks.
  Tensor block;
  internal::Signature sig;
  sig.op = "gather";
  sig.fields = {{"axis", std::to_string(axis)}};
  try {
    internal::check_components(comps.size(), *this, "gather");
    std::vector<internal::Signature> sigs(comps.size());
    for (std::size_t i = 0; i < comps.size(); ++i) {
      sigs[i].op = "gather";
      sigs[i].sequence = 0;
      sigs[i].leaves.push_back({comps[i].dtype(), comps[i].shape().dims()});
      internal::validate_gather_leaf(comps[i], axis, sigs[i]);
    }
    internal::check_signatures(sigs, first_replica_id_, internal::ShapeRule::kAllButAxis, axis, nullptr);
    block = concat(comps, axis).with_device(kHostDevice);
    sig.leaves.push_back({block.dtype(), block.shape().dims()});
  } catch (const Error& e) {
    sig.set_error(e);
  }
  std::lock_guard<std::recursive_mutex> lock(state_->worker_mutex);
  const std::vector<internal::Signature> blocks =
      internal::agree_workers(*state_, options_, sig, internal::ShapeRule::kAllButAxis, axis);
  if (blocks.size() == 1) return block;
  const auto a = static_cast<std::size_t>(axis < 0 ? axis + block.rank() : axis);
  const internal::GatherLayout layout =
      internal::gather_layout(block, axis, blocks.size(), [&](std::size_t w) { return blocks[w].leaves[0].dims[a]; });
  Tensor out = Tensor::uninitialized(block.dtype(), layout.shape, kHostDevice);
  const CollectiveCall call = internal::worker_call(*state_, options_, "gather");
  state_->workers->all_gather_v(block.raw_data(), out.mutable_raw_data(), layout.counts, layout.outer, block.dtype(),
                                call);
  return out;
}

Tensor Strategy::gather(const Tensor& value, int) {
  require_cross_replica_or_default("gather");
  return value;
}

Tensor Strategy::gather(const IndexedSlices&, int) {
  require_cross_replica_or_default("gather");
  throw UnimplementedError("gather does not support IndexedSlices");
}

}  // namespace distribute
