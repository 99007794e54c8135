#include "distribute/input.h"

#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "distribute/strategy.h"
#include "runtime/runtime_util.h"
#include "runtime/strategy_ref.h"
#include "runtime/worker_agreement.h"

namespace distribute {

// ---- contexts ---------------------------------------------------------------------

ValueContext::ValueContext(int replica_id_in_sync_group, int num_replicas_in_sync)
    : replica_id_(replica_id_in_sync_group), num_replicas_(num_replicas_in_sync) {}

std::string ValueContext::to_string() const {
  return "tf.distribute.ValueContext(replica id " + std::to_string(replica_id_) +
         ",  total replicas in sync: " + std::to_string(num_replicas_) + ")";
}

InputContext::InputContext(int num_input_pipelines, int input_pipeline_id, int num_replicas_in_sync)
    : num_input_pipelines_(num_input_pipelines),
      input_pipeline_id_(input_pipeline_id),
      num_replicas_in_sync_(num_replicas_in_sync) {
  if (num_input_pipelines < 1 || num_replicas_in_sync < 1 || input_pipeline_id < 0 ||
      input_pipeline_id >= num_input_pipelines) {
    throw InvalidArgumentError(
        "InputContext: need num_input_pipelines >= 1, 0 <= input_pipeline_id < "
        "num_input_pipelines and num_replicas_in_sync >= 1; got " +
        std::to_string(num_input_pipelines) + ", " + std::to_string(input_pipeline_id) + ", " +
        std::to_string(num_replicas_in_sync));
  }
}

std::int64_t InputContext::get_per_replica_batch_size(std::int64_t global_batch_size) const {
  if (global_batch_size % num_replicas_in_sync_ != 0) {
    throw InvalidArgumentError("The `global_batch_size` " + std::to_string(global_batch_size) +
                               " is not divisible by `num_replicas_in_sync` " + std::to_string(num_replicas_in_sync_) +
                               " ");
  }
  return global_batch_size / num_replicas_in_sync_;
}

std::string InputContext::to_string() const {
  return "tf.distribute.InputContext(input pipeline id " + std::to_string(input_pipeline_id_) +
         ", total: " + std::to_string(num_input_pipelines_) + ")";
}

// ---- batches ------------------------------------------------------------------------

namespace {

// Rows [begin, end) of every leaf: views, no copy (read-only where the leaf is).
Nest<Tensor> slice_rows(const Nest<Tensor>& batch, std::int64_t begin, std::int64_t end, const std::string& device) {
  return batch.map([&](const Tensor& t) {
    std::vector<std::int64_t> dims = t.shape().dims();
    const std::int64_t row_bytes = dims[0] == 0 ? 0 : static_cast<std::int64_t>(t.nbytes()) / dims[0];
    dims[0] = end - begin;
    std::byte* base = t.storage().get();
    Tensor rows = Tensor::from_shared(std::shared_ptr<std::byte>(t.storage(), base + begin * row_bytes), t.dtype(),
                                      Shape(dims), device);
    return t.is_read_only() ? std::move(rows).as_read_only() : rows;
  });
}

// The batch dimension every leaf shares; InvalidArgumentError otherwise.
std::int64_t batch_rows(const Nest<Tensor>& batch, std::string_view api) {
  std::int64_t rows = -1;
  const std::vector<Tensor> leaves = batch.flatten();
  const std::vector<std::string> paths = batch.flatten_paths();
  if (leaves.empty()) throw InvalidArgumentError(std::string(api) + ": a batch needs at least one tensor");
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    if (leaves[i].rank() == 0) {
      throw InvalidArgumentError(std::string(api) + ": batch element " + paths[i] +
                                 " is a scalar; every element needs a batch dimension");
    }
    if (rows >= 0 && leaves[i].shape()[0] != rows) {
      throw InvalidArgumentError(std::string(api) + ": the elements of a batch have different batch sizes (" +
                                 paths[0] + ": " + std::to_string(rows) + ", " + paths[i] + ": " +
                                 std::to_string(leaves[i].shape()[0]) + ")");
    }
    rows = leaves[i].shape()[0];
  }
  return rows;
}

}  // namespace

struct internal::DatasetSource {
  virtual ~DatasetSource() = default;
  virtual std::optional<PerReplica<Nest<Tensor>>> next() = 0;
  // Draws what `steps` calls of next() that gave batches drew (and, if
  // `ended`, the call after them that found none), on this worker alone,
  // and drops it. Returns the steps that had data, where this source can
  // tell (else `steps`).
  virtual std::int64_t skip(std::int64_t steps, bool ended) = 0;
};

namespace {

// What one worker's part of get_next raised, caught so that every worker
// raises it: the others are (or will be) in the exchange that follows, and
// would wait there for a worker that never comes.
struct LocalFailure {
  std::exception_ptr original;  // raised again on this worker, as it was
  std::optional<Error> shared;  // what the other workers raise

  template <class Body>
  void run(Body&& body, std::string_view api) {
    try {
      body();
    } catch (const Error& e) {
      original = std::current_exception();
      shared = e;
    } catch (...) {
      original = std::current_exception();
      shared = InternalError(std::string(api) + ": the dataset raised " + internal::describe_exception(original));
    }
  }
  // The exchange of `payload`; raises the failure of any worker on every worker.
  std::vector<std::string> exchange(Strategy& s, const std::string& payload, std::string_view api) const {
    std::vector<std::string> all;
    try {
      all = internal::exchange_across_workers(s, payload, api, shared ? &*shared : nullptr);
    } catch (...) {
      if (!original) throw;
      // This worker raises its own error in place of the one the workers
      // agreed on; it stays agreed, so that a merge_fn that raises it leaves
      // the workers' link usable, as the other workers' merge_fns do.
      const bool agreed = internal::take_agreed_worker_error(std::current_exception());
      try {
        std::rethrow_exception(original);
      } catch (...) {
        if (agreed) internal::note_agreed_worker_error();
        throw;
      }
    }
    if (original) std::rethrow_exception(original);  // (not reached: the exchange raises it on every worker)
    return all;
  }
};

// experimental_distribute_dataset: each global batch split across every replica in sync.
class RebatchSource final : public internal::DatasetSource {
 public:
  RebatchSource(Strategy& s, BatchFn batches, std::int64_t global_batch_size)
      : strategy_(s), batches_(std::move(batches)), global_(global_batch_size) {
    const int n = s.num_replicas_in_sync();
    if (global_batch_size < 1) {
      throw InvalidArgumentError("experimental_distribute_dataset: the global batch size must be >= 1, got " +
                                 std::to_string(global_batch_size));
    }
    // TensorFlow's batch_sizes_for_worker: the first G mod N replicas take one more row.
    const std::int64_t floor = global_batch_size / n;
    const std::int64_t ceil_count = global_batch_size - floor * n;
    std::int64_t offset = 0;
    for (int g = 0; g < n; ++g) {
      const std::int64_t size = floor + (g < ceil_count ? 1 : 0);
      if (g >= s.first_replica_id() && g < s.first_replica_id() + s.num_local_replicas()) {
        begin_.push_back(offset);
        size_.push_back(size);
      }
      offset += size;
    }
  }

  std::optional<PerReplica<Nest<Tensor>>> next() override {
    Strategy& s = strategy_.get("the distributed dataset of experimental_distribute_dataset");
    internal::Access::require_cross_replica_or_default(s, "get_next");
    std::optional<Nest<Tensor>> batch;
    std::int64_t rows = -1;
    LocalFailure failure;
    failure.run(
        [&] {
          if (!exhausted_) batch = batches_();
          exhausted_ = !batch;  // the function is not called again once it has said so
          rows = batch ? batch_rows(*batch, "experimental_distribute_dataset") : -1;
          if (rows > global_) {
            throw InvalidArgumentError("experimental_distribute_dataset: a batch has " + std::to_string(rows) +
                                       " rows, more than the global batch size " + std::to_string(global_));
          }
        },
        "experimental_distribute_dataset");
    const std::vector<std::string> all = failure.exchange(s, std::to_string(rows), "experimental_distribute_dataset");
    for (std::size_t w = 0; w < all.size(); ++w) {
      if (all[w] != all[0]) {
        auto said = [](const std::string& r) { return r == "-1" ? std::string("no batch left") : r + " rows"; };
        try {
          throw InvalidArgumentError("experimental_distribute_dataset: the workers' global batches differ (worker 0: " +
                                     said(all[0]) + ", worker " + std::to_string(w) + ": " + said(all[w]) +
                                     "); every worker must produce the same global batches");
        } catch (...) {
          internal::note_agreed_worker_error();  // every worker has the same `all`: each raises it alike
          throw;
        }
      }
    }
    if (!batch) return std::nullopt;
    std::vector<Nest<Tensor>> out;
    for (std::size_t i = 0; i < begin_.size(); ++i) {
      const std::int64_t b = std::min(begin_[i], rows);
      const std::int64_t e = std::min(begin_[i] + size_[i], rows);
      out.push_back(slice_rows(*batch, b, e, s.devices()[i]));
    }
    return PerReplica<Nest<Tensor>>(std::move(out));
  }

  // Every worker draws each global batch: the batches are counted here.
  std::int64_t skip(std::int64_t steps, bool ended) override {
    std::int64_t had = 0;
    for (; had < steps + (ended ? 1 : 0) && !exhausted_; ++had) exhausted_ = !batches_();
    if (exhausted_) --had;                       // (the call that found none)
    if (ended && !exhausted_) return steps + 1;  // data where the saved pass had ended
    return had;
  }

 private:
  internal::StrategyRef strategy_;
  BatchFn batches_;
  std::int64_t global_;
  bool exhausted_ = false;
  std::vector<std::int64_t> begin_;  // per local replica
  std::vector<std::int64_t> size_;
};

// distribute_datasets_from_function: each local replica takes the next batch of this worker's pipeline.
class PipelineSource final : public internal::DatasetSource {
 public:
  PipelineSource(Strategy& s, BatchFn batches) : strategy_(s), batches_(std::move(batches)) {}

  std::optional<PerReplica<Nest<Tensor>>> next() override {
    Strategy& s = strategy_.get("the distributed dataset of distribute_datasets_from_function");
    internal::Access::require_cross_replica_or_default(s, "get_next");
    std::vector<std::optional<Nest<Tensor>>> got;
    bool any = false;
    LocalFailure failure;
    failure.run([&] { any = draw(s.num_local_replicas(), &got); }, "distribute_datasets_from_function");
    // "1": batches this step; "0": none, but an earlier batch gives the
    // structure of empty ones; "x": none ever.
    const std::vector<std::string> all = failure.exchange(s,
                                                          any     ? "1"
                                                          : last_ ? "0"
                                                                  : "x",
                                                          "distribute_datasets_from_function");
    bool any_worker = false;
    for (const std::string& a : all) any_worker = any_worker || a == "1";
    if (!any_worker) return std::nullopt;
    for (std::size_t w = 0; w < all.size(); ++w) {
      if (all[w] != "x") continue;
      // Every worker has the same `all`, so each raises this alike (the
      // others would otherwise wait in the step's collectives for this one).
      try {
        throw InvalidArgumentError("distribute_datasets_from_function: worker " + std::to_string(w) +
                                   "'s dataset produced no batch at all while other workers' did; its replicas "
                                   "cannot be given empty batches of an unknown structure");
      } catch (...) {
        internal::note_agreed_worker_error();
        throw;
      }
    }
    std::vector<Nest<Tensor>> out;
    for (std::size_t i = 0; i < got.size(); ++i) {
      out.push_back(got[i] ? got[i]->map([&](const Tensor& t) { return t.with_device(s.devices()[i]); })
                           : slice_rows(*last_, 0, 0, s.devices()[i]));
    }
    return PerReplica<Nest<Tensor>>(std::move(out));
  }

  // A step counts when any worker had data, so this worker's pipeline may
  // have ended before: the draws are made again as next() made them,
  // uncounted.
  std::int64_t skip(std::int64_t steps, bool ended) override {
    const int local =
        strategy_.get("the distributed dataset of distribute_datasets_from_function").num_local_replicas();
    for (std::int64_t i = 0; i < steps + (ended ? 1 : 0); ++i) draw(local, nullptr);
    return steps;
  }

 private:
  // One step's batches of this worker's replicas (into `got`, if given);
  // whether any replica had one.
  bool draw(int replicas, std::vector<std::optional<Nest<Tensor>>>* got) {
    bool any = false;
    for (int i = 0; i < replicas; ++i) {
      std::optional<Nest<Tensor>> b = exhausted_ ? std::nullopt : batches_();
      if (!b) {
        exhausted_ = true;
      } else {
        batch_rows(*b, "distribute_datasets_from_function");
        last_ = *b;
        any = true;
      }
      if (got != nullptr) got->push_back(std::move(b));
    }
    return any;
  }

  internal::StrategyRef strategy_;
  BatchFn batches_;
  bool exhausted_ = false;
  std::optional<Nest<Tensor>> last_;  // the structure for empty batches
};

}  // namespace

std::optional<PerReplica<Nest<Tensor>>> DistributedDataset::get_next() {
  // The source checks the context first: a call made (wrongly) by every
  // replica inside run raises there, before this dataset's state is touched.
  auto batch = source_->next();
  begun_ = true;
  ended_ = !batch;
  resumed_ = false;
  if (batch) ++steps_;
  return batch;
}

DistributedDataset::iterator DistributedDataset::begin() {
  if (resumed_) {
    resumed_ = false;  // the pass a restore left part read goes on
  } else if (begun_ && again_) {
    source_ = again_();  // a new pass, from the start
    begun_ = false;
    ended_ = false;
    ++passes_;
    steps_ = 0;
  } else if (ended_) {
    throw FailedPreconditionError(api_ +
                                  ": the dataset's batch function (a BatchFn) was exhausted by an earlier pass and "
                                  "cannot be iterated again; pass a DatasetFn, which makes a BatchFn for each pass, "
                                  "to iterate once per epoch");
  }
  return iterator(this);
}

DistributedDataset::iterator::iterator(DistributedDataset* dataset) : dataset_(dataset) {
  if (dataset_ != nullptr) current_ = dataset_->get_next();
}

DistributedDataset::iterator& DistributedDataset::iterator::operator++() {
  current_ = dataset_->get_next();
  return *this;
}

// ---- Position, for checkpoints ------------------------------------------------------------

namespace internal {

DatasetPosition Access::dataset_position(const DistributedDataset& d) { return {d.passes_, d.steps_, d.ended_}; }

std::string Access::why_not_restorable(const DistributedDataset& d, const DatasetPosition& p) {
  if (p.pass < 0 || p.steps < 0) {
    return "the saved position (pass " + std::to_string(p.pass) + ", step " + std::to_string(p.steps) +
           ") is not one a dataset can have";
  }
  if (d.begun_ || d.passes_ > 0) {
    return "the dataset has been read from (pass " + std::to_string(d.passes_) + ", step " + std::to_string(d.steps_) +
           "); restore into a dataset made alike and not yet read from";
  }
  if (p.pass > 0 && !d.again_) {
    return "it was saved in pass " + std::to_string(p.pass) +
           " of a dataset iterated again, and this one's source (a BatchFn) gives one pass; make it from a DatasetFn";
  }
  return {};
}

void Access::restore_dataset_passes(DistributedDataset& d, const DatasetPosition& p) {
  for (; d.passes_ < p.pass; ++d.passes_) d.source_ = d.again_();
}

void Access::restore_dataset_steps(DistributedDataset& d, const DatasetPosition& p, std::string_view what) {
  const std::int64_t had = d.source_->skip(p.steps, p.ended);
  if (had != p.steps) {
    throw FailedPreconditionError(
        std::string(what) + ": the checkpoint's position is step " + std::to_string(p.steps) +
        (p.ended ? " at the end" : "") + " of pass " + std::to_string(p.pass) + ", but the source's pass " +
        (had < p.steps ? "ends after " + std::to_string(had) + " batches" : std::string("goes on past that end")) +
        ": it does not give the batches it gave when saved");
  }
  d.steps_ = p.steps;
  d.ended_ = p.ended;
  d.begun_ = p.steps > 0 || p.ended;
  d.resumed_ = d.begun_ && !p.ended;
}

}  // namespace internal

// ---- Strategy members -------------------------------------------------------------------

DistributedDataset Strategy::experimental_distribute_dataset(BatchFn global_batches, std::int64_t global_batch_size) {
  if (!global_batches) throw InvalidArgumentError("experimental_distribute_dataset: no batch function");
  return internal::Access::make_dataset(
      std::make_shared<RebatchSource>(*this, std::move(global_batches), global_batch_size), nullptr,
      "experimental_distribute_dataset");
}

DistributedDataset Strategy::experimental_distribute_dataset(DatasetFn dataset, std::int64_t global_batch_size) {
  if (!dataset) throw InvalidArgumentError("experimental_distribute_dataset: no dataset function");
  auto pass = [ref = internal::StrategyRef(*this), dataset = std::move(dataset),
               global_batch_size]() -> std::shared_ptr<internal::DatasetSource> {
    Strategy& s = ref.get("the distributed dataset of experimental_distribute_dataset");
    BatchFn batches = dataset();
    if (!batches) {
      throw InvalidArgumentError("experimental_distribute_dataset: the dataset function returned no batch function");
    }
    return std::make_shared<RebatchSource>(s, std::move(batches), global_batch_size);
  };
  auto first = pass();
  return internal::Access::make_dataset(std::move(first), std::move(pass), "experimental_distribute_dataset");
}

namespace {

// One pass of distribute_datasets_from_function: dataset_fn called for this
// worker's pipeline; under several workers a collective, so that a failure
// of dataset_fn on one worker is raised by every worker.
std::shared_ptr<internal::DatasetSource> pipeline_pass(Strategy& s,
                                                       const std::function<BatchFn(const InputContext&)>& dataset_fn) {
  const int workers = s.num_replicas_in_sync() / s.num_local_replicas();
  const InputContext context(workers, s.first_replica_id() / s.num_local_replicas(), s.num_replicas_in_sync());
  BatchFn batches;
  LocalFailure failure;
  failure.run(
      [&] {
        batches = dataset_fn(context);
        if (!batches) {
          throw InvalidArgumentError("distribute_datasets_from_function: dataset_fn returned no batch function");
        }
      },
      "distribute_datasets_from_function");
  // Under several workers, dataset_fn failing on one (a file missing on its
  // host) is raised by every worker, not by that one alone while the others
  // wait for it in their first get_next.
  // (Its own name: a worker making a dataset while another reads one is a
  // mismatch, not one call taken for the other.)
  failure.exchange(s, "", "distribute_datasets_from_function (making the dataset)");
  return std::make_shared<PipelineSource>(s, std::move(batches));
}

}  // namespace

DistributedDataset Strategy::distribute_datasets_from_function(
    const std::function<BatchFn(const InputContext&)>& dataset_fn) {
  // Its workers agree on dataset_fn's outcome: once per worker, not per replica.
  require_cross_replica_or_default("distribute_datasets_from_function");
  // A BatchFn cannot start again: each later pass calls dataset_fn anew,
  // where TensorFlow iterates again the dataset it returned once.
  auto again = [ref = internal::StrategyRef(*this), dataset_fn] {
    Strategy& s = ref.get("the distributed dataset of distribute_datasets_from_function");
    internal::Access::require_cross_replica_or_default(s, "distribute_datasets_from_function (a new pass)");
    return pipeline_pass(s, dataset_fn);
  };
  return internal::Access::make_dataset(pipeline_pass(*this, dataset_fn), std::move(again),
                                        "distribute_datasets_from_function");
}

}  // namespace distribute
