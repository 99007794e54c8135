// StrategyExtended (strategy.extended): Destinations, reduce_to,
// batch_reduce_to and broadcast_to, and the copies that place their results
// on the destination devices.
#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/backend.h"
#include "distribute/mirrored_strategy.h"
#include "distribute/strategy.h"
#include "runtime/mode.h"
#include "runtime/strategy_internal.h"

namespace distribute {

Destinations::Destinations(const char* device) : Destinations(std::string(device)) {}

Destinations::Destinations(const std::string& device) {
  if (device.empty()) throw InvalidArgumentError("destinations can not be empty");
  devices_.push_back(canonical_device_name(device));
}

Destinations Destinations::of_devices(const std::vector<std::string>& devices) {
  if (devices.empty()) throw InvalidArgumentError("destinations can not be empty");
  Destinations d;
  for (const auto& name : devices) d.devices_.push_back(canonical_device_name(name));
  return d;
}

namespace {
// Copies are shared with the replicas paused in merge_call from this many
// bytes per destination for each replica that helps. Below it the two
// rounds that takes cost more than they save; with more replicas the rounds
// cost more (measured: with 2 replicas sharing pays from 128 KiB and ties at
// 64 KiB; with 3 it pays from 256 KiB and loses at 128 KiB; with 4 it ties
// at 256-512 KiB; docs/history/benchmarks.md,
// "broadcast_to through merge_call").
constexpr std::size_t kShareCopiesBytesPerHelper = std::size_t{128} << 10;

bool worth_sharing(const Strategy& strategy, std::size_t bytes) {
  const auto helpers = static_cast<std::size_t>(strategy.num_local_replicas() - 1);
  return helpers > 0 && bytes >= kShareCopiesBytesPerHelper * helpers;
}

// The copies of one place_on, seen as one run of bytes (every destination
// after the other) that the members of the group split evenly. It holds the
// source and the destinations, so that a member still copying never writes
// into freed memory.
struct CopyJob final : internal::MergeTask {
  CopyJob(Tensor from, std::vector<Tensor> to) : source(std::move(from)), destinations(std::move(to)) {}
  Tensor source;
  std::vector<Tensor> destinations;

  void run(int member, int members) const noexcept override {
    const std::size_t bytes = source.nbytes();
    const std::size_t total = bytes * destinations.size();
    std::size_t at = total * static_cast<std::size_t>(member) / static_cast<std::size_t>(members);
    const std::size_t end = total * static_cast<std::size_t>(member + 1) / static_cast<std::size_t>(members);
    const auto* from = static_cast<const std::byte*>(source.raw_data());
    while (at < end) {
      const std::size_t k = at / bytes, offset = at % bytes;
      const std::size_t n = std::min(end - at, bytes - offset);
      internal::copy_broadcast_part(static_cast<std::byte*>(destinations[k].mutable_raw_data()) + offset, from + offset,
                                    n, bytes);
      at += n;
    }
  }
};

// One tensor of `value` per destination device. The destination on the
// value's own device gets the value itself, sharing its storage, as
// TensorFlow's identity on the same device does; a `fresh` value (a result
// nobody else holds) goes to the first destination when none is on its
// device. Every other destination gets a copy. Inside a merge_fn, large
// copies are shared with the paused replicas (each copies its part at once),
// as the engine's broadcast shares its copies.
Mirrored<Tensor> place_on(const Strategy& strategy, const Tensor& value, const std::vector<std::string>& devices,
                          bool fresh = false) {
  const auto own = std::find(devices.begin(), devices.end(), value.device());
  const std::size_t kept = own != devices.end() ? static_cast<std::size_t>(own - devices.begin())
                           : fresh              ? 0
                                                : devices.size();
  std::vector<Tensor> copies;
  copies.reserve(devices.size());
  std::vector<Tensor> to_fill;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (i == kept) {
      copies.push_back(value.with_device(devices[i]));
    } else {
      copies.push_back(Tensor::uninitialized(value.dtype(), value.shape(), devices[i]));
      to_fill.push_back(copies.back());
    }
  }
  if (to_fill.empty()) return Mirrored<Tensor>(std::move(copies));
  if (worth_sharing(strategy, value.nbytes())) {
    const auto job = std::make_shared<const CopyJob>(value, std::move(to_fill));
    if (!internal::share_with_paused_replicas(strategy, job)) job->run(0, 1);
  } else {
    CopyJob(value, std::move(to_fill)).run(0, 1);  // alone, no heap
  }
  return Mirrored<Tensor>(std::move(copies));
}
}  // namespace

Mirrored<Tensor> StrategyExtended::reduce_to(ReduceOp op, const PerReplica<Tensor>& value,
                                             const Destinations& destinations, const CommunicationOptions& options) {
  strategy_->require_cross_replica_or_default("reduce_to");
  const CommunicationOptions merged = strategy_->options_.merge(options);
  std::lock_guard<std::recursive_mutex> lock(strategy_->state_->worker_mutex);
  strategy_->check_and_agree(value.values(), "reduce_to", op, merged);
  return place_on(*strategy_, strategy_->reduce_components(op, value.values(), merged, 0), destinations.devices(),
                  /*fresh=*/true);
}

Mirrored<Tensor> StrategyExtended::reduce_to(ReduceOp op, const Mirrored<Tensor>& value,
                                             const Destinations& destinations, const CommunicationOptions& options) {
  strategy_->require_cross_replica_or_default("reduce_to");
  strategy_->options_.merge(options).validate();
  internal::check_components(value.size(), *strategy_, "reduce_to");
  internal::check_non_distributed(op, *strategy_, internal::short_text(value.primary()), /*mirrored=*/true);
  return place_on(*strategy_, value.primary(), destinations.devices());
}

Mirrored<Tensor> StrategyExtended::reduce_to(ReduceOp op, const Tensor& value, const Destinations& destinations,
                                             const CommunicationOptions& options) {
  strategy_->require_cross_replica_or_default("reduce_to");
  const CommunicationOptions merged = strategy_->options_.merge(options);
  if (strategy_->values_are_per_worker()) {
    return place_on(*strategy_, strategy_->reduce_per_worker(op, value, merged, "reduce_to"), destinations.devices(),
                    /*fresh=*/true);
  }
  merged.validate();
  internal::check_non_distributed(op, *strategy_, internal::short_text(value), /*mirrored=*/false);
  return place_on(*strategy_, value, destinations.devices());
}

namespace {
// batch_reduce_to of values that are not per-replica Tensors: one reduce_to
// each, in order (each its own agreement; no packing).
template <class Result, class Value, class ReduceOne>
std::vector<Result> reduce_each(const std::vector<std::pair<Value, Destinations>>& pairs, ReduceOne&& one) {
  std::vector<Result> out;
  out.reserve(pairs.size());
  for (const auto& [value, destinations] : pairs) out.push_back(one(value, destinations));
  return out;
}

// `slices` on every destination device: values and indices placed as a
// Tensor result is (its own copy for each destination past the first).
Mirrored<IndexedSlices> place_slices_on(const Strategy& strategy, const IndexedSlices& slices,
                                        const std::vector<std::string>& devices) {
  const Mirrored<Tensor> values = place_on(strategy, slices.values(), devices, /*fresh=*/true);
  const Mirrored<Tensor> indices = place_on(strategy, slices.indices(), devices, /*fresh=*/true);
  std::vector<IndexedSlices> out;
  out.reserve(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    out.emplace_back(values.component(i), indices.component(i), slices.dense_shape());
  }
  return Mirrored<IndexedSlices>(std::move(out));
}
}  // namespace

Mirrored<IndexedSlices> StrategyExtended::reduce_to(ReduceOp op, const PerReplica<IndexedSlices>& value,
                                                    const Destinations& destinations,
                                                    const CommunicationOptions& options) {
  strategy_->require_cross_replica_or_default("reduce_to");
  const CommunicationOptions merged = strategy_->options_.merge(options);
  return place_slices_on(*strategy_, strategy_->reduce_slices(op, value.values(), merged, "reduce_to"),
                         destinations.devices());
}

std::vector<Mirrored<Tensor>> StrategyExtended::batch_reduce_to(
    ReduceOp op, const std::vector<std::pair<Tensor, Destinations>>& value_destination_pairs,
    const CommunicationOptions& options) {
  strategy_->require_cross_replica_or_default("batch_reduce_to");
  if (value_destination_pairs.empty()) strategy_->options_.merge(options).validate();
  return reduce_each<Mirrored<Tensor>>(
      value_destination_pairs, [&](const Tensor& v, const Destinations& d) { return reduce_to(op, v, d, options); });
}

std::vector<Mirrored<IndexedSlices>> StrategyExtended::batch_reduce_to(
    ReduceOp op, const std::vector<std::pair<PerReplica<IndexedSlices>, Destinations>>& value_destination_pairs,
    const CommunicationOptions& options) {
  strategy_->require_cross_replica_or_default("batch_reduce_to");
  if (value_destination_pairs.empty()) strategy_->options_.merge(options).validate();
  return reduce_each<Mirrored<IndexedSlices>>(
      value_destination_pairs,
      [&](const PerReplica<IndexedSlices>& v, const Destinations& d) { return reduce_to(op, v, d, options); });
}

std::vector<Mirrored<Tensor>> StrategyExtended::batch_reduce_to(
    ReduceOp op, const std::vector<std::pair<PerReplica<Tensor>, Destinations>>& value_destination_pairs,
    const CommunicationOptions& options) {
  strategy_->require_cross_replica_or_default("batch_reduce_to");
  const CommunicationOptions merged = strategy_->options_.merge(options);
  std::vector<Mirrored<Tensor>> out;
  if (value_destination_pairs.empty()) {
    merged.validate();
    return out;
  }
  std::vector<const std::vector<Tensor>*> values;
  values.reserve(value_destination_pairs.size());
  for (const auto& pair : value_destination_pairs) values.push_back(&pair.first.values());
  // One agreement and one reduction per pack, for the whole batch.
  std::lock_guard<std::recursive_mutex> lock(strategy_->state_->worker_mutex);
  strategy_->check_and_agree_batch(values, "batch_reduce_to", op, merged);
  std::vector<Tensor> reduced = strategy_->reduce_components_batch(op, values, merged, 0);
  out.reserve(reduced.size());
  for (std::size_t k = 0; k < reduced.size(); ++k) {
    out.push_back(place_on(*strategy_, reduced[k], value_destination_pairs[k].second.devices(), /*fresh=*/true));
  }
  return out;
}

Mirrored<Tensor> StrategyExtended::broadcast_to(const Tensor& tensor, const std::optional<Destinations>& destinations) {
  strategy_->require_cross_replica_or_default("broadcast_to");
  // The strategy's devices are canonical names already.
  return place_on(*strategy_, tensor, destinations ? destinations->devices() : strategy_->devices());
}

const std::vector<std::string>& StrategyExtended::worker_devices() const {
  if (is_default_strategy(*strategy_)) {
    throw FailedPreconditionError("worker_devices() method unsupported by default tf.distribute.Strategy.");
  }
  return strategy_->devices();
}

void StrategyExtended::check_update_target(std::size_t components) const {
  internal::check_components(components, *strategy_, "update");
}

}  // namespace distribute
