// File: input.h
//
// Distributed input, as tf.distribute's: per-replica values from a function
// (Strategy::experimental_distribute_values_from_function with a
// ValueContext, context.h), and datasets whose batches are split across the replicas
// of every worker (Strategy::experimental_distribute_dataset), or made per
// input pipeline (Strategy::distribute_datasets_from_function with an
// InputContext).
//
//   // A source of global batches: {images, labels}, batch dimension first.
//   BatchFn batches = [&]() -> std::optional<Nest<Tensor>> { ... return std::nullopt at the end; };
//   DistributedDataset dataset = strategy.experimental_distribute_dataset(batches, /*global_batch_size=*/256);
//   for (const PerReplica<Nest<Tensor>>& batch : dataset) {
//     strategy.run([&](ReplicaContext& ctx, const Nest<Tensor>& mine) { ... }, batch);
//   }
//
// A BatchFn is one pass over the data. To iterate once per epoch, as a
// tf.data.Dataset is, pass a DatasetFn instead: each range-for (each
// begin()) calls it for a new pass.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distribute/context.h"
#include "distribute/distributed_values.h"
#include "distribute/internal/access.h"
#include "distribute/nest.h"
#include "distribute/tensor.h"

namespace distribute {

class Strategy;

// tf.distribute.InputContext: what an input function knows of its pipeline
// (one pipeline per worker).
class InputContext {
 public:
  // Counts must be >= 1 and the id in [0, num_input_pipelines).
  explicit InputContext(int num_input_pipelines = 1, int input_pipeline_id = 0, int num_replicas_in_sync = 1);
  int num_input_pipelines() const { return num_input_pipelines_; }
  int input_pipeline_id() const { return input_pipeline_id_; }
  int num_replicas_in_sync() const { return num_replicas_in_sync_; }
  // global_batch_size / num_replicas_in_sync; InvalidArgumentError if it does
  // not divide ("The `global_batch_size` 10 is not divisible by
  // `num_replicas_in_sync` 4 ").
  std::int64_t get_per_replica_batch_size(std::int64_t global_batch_size) const;
  // "tf.distribute.InputContext(input pipeline id 0, total: 2)".
  std::string to_string() const;

 private:
  int num_input_pipelines_;
  int input_pipeline_id_;
  int num_replicas_in_sync_;
};

// A dataset: each call returns the next batch (a nest of tensors whose
// leaves share their first dimension, the batch dimension), or nullopt once
// the data is exhausted.
using BatchFn = std::function<std::optional<Nest<Tensor>>()>;

// A dataset that can be iterated again: each call starts a new pass over
// the data (an epoch) and returns its BatchFn.
using DatasetFn = std::function<BatchFn()>;

// What Strategy::experimental_distribute_dataset and
// distribute_datasets_from_function return: each get_next() gives every
// local replica its batch for one step. Under several workers get_next() is
// a collective (every worker calls it once per step): the workers agree
// that data remains, so the last step ends on every worker together rather
// than leaving one waiting in a collective. Not thread-safe. The strategy
// must outlive it: get_next() after the strategy is destroyed raises
// FailedPreconditionError.
//
// Passes, as TensorFlow's `for x in dist_dataset`: each begin() starts a new
// pass over a source that can be iterated again (a DatasetFn, or the
// dataset_fn of distribute_datasets_from_function, called again). A
// one-shot source (a BatchFn) continues where it stopped, and begin() after
// it was exhausted raises FailedPreconditionError rather than giving an
// empty epoch. Under several workers, every worker starts its passes alike.
//
// A train::Checkpoint keeps its position (which pass, how many steps into
// it), as TF's checkpointable iterators: restored into a dataset made
// alike and not yet read from, it draws again and drops the batches taken
// before, so a source that gives the same batches again (the same data,
// seeds fixed per pass) resumes exactly. The first begin() after such a
// restore continues the restored pass rather than starting another.
class DistributedDataset {
 public:
  // The next step's batches of the current pass (the first pass, if none
  // was started), one per local replica, or nullopt once no worker has data
  // left. A replica with no rows left in a partial last batch gets an empty
  // batch (first dimension 0) of the same structure.
  std::optional<PerReplica<Nest<Tensor>>> get_next();

  // A range-for over a pass: begin() starts one, as said above.
  class iterator {
   public:
    using value_type = PerReplica<Nest<Tensor>>;
    const value_type& operator*() const { return *current_; }
    iterator& operator++();
    bool operator==(const iterator& other) const { return !current_ && !other.current_; }

   private:
    friend class DistributedDataset;
    explicit iterator(DistributedDataset* dataset);
    DistributedDataset* dataset_ = nullptr;
    std::optional<value_type> current_;
  };
  iterator begin();
  iterator end() { return iterator(nullptr); }

 private:
  friend struct internal::Access;
  using MakePass = std::function<std::shared_ptr<internal::DatasetSource>()>;
  // `first` is the first pass; `again` makes each later one (null: one-shot).
  DistributedDataset(std::shared_ptr<internal::DatasetSource> first, MakePass again, std::string api)
      : source_(std::move(first)), again_(std::move(again)), api_(std::move(api)) {}
  std::shared_ptr<internal::DatasetSource> source_;  // the current pass
  MakePass again_;
  std::string api_;          // the call that made it, for errors
  bool begun_ = false;       // the current pass has been read from
  bool ended_ = false;       // the current pass has returned nullopt
  std::int64_t passes_ = 0;  // passes begun before the current one
  std::int64_t steps_ = 0;   // get_next() calls of the current pass that gave batches
  bool resumed_ = false;     // a restore left the current pass part read: begin() continues it
};

namespace internal {
inline DistributedDataset Access::make_dataset(std::shared_ptr<DatasetSource> first,
                                               std::function<std::shared_ptr<DatasetSource>()> again, std::string api) {
  return DistributedDataset(std::move(first), std::move(again), std::move(api));
}
}  // namespace internal

}  // namespace distribute
