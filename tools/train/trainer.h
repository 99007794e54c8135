// Data-parallel training of an Mlp the TensorFlow way: variables under
// strategy.scope(), a distributed dataset splitting each global batch,
// strategy.run of a step whose optimizer aggregates through merge_call, and
// metrics accumulated in SyncOnReadVariables.
#pragma once

#include <distribute/distribute.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fashion_mnist.h"
#include "mlp.h"

namespace distribute::train {

struct TrainConfig {
  std::vector<int> layers = {784, 256, 128, 10};
  std::int64_t global_batch = 128;
  std::uint64_t seed = 1;
  std::string optimizer = "adam";  // "adam" or "sgd"
  double learning_rate = 0;        // 0: 0.001 for Adam, 0.05 for SGD
  double momentum = 0.9;           // SGD only
  std::int64_t eval_batch = 1000;
};

struct EpochStats {
  double train_loss = 0;  // mean over the epoch's rows
  std::int64_t rows = 0;
  std::int64_t steps = 0;
  std::int64_t rows_before = 0;     // of `rows`, those a checkpoint had taken (a resumed epoch)
  double seconds = 0;               // the steps only (of this run)
  double replica_step_seconds = 0;  // replica 0's time in its step functions
  Optimizer::Timings optimizer;     // replica 0's time in apply_gradients, by phase
};

// Rows per second of the steps this run took.
inline double samples_per_second(const EpochStats& e) {
  return e.seconds > 0 ? static_cast<double>(e.rows - e.rows_before) / e.seconds : 0;
}

struct EvalStats {
  double loss = 0;
  double accuracy = 0;
};

// What the progress bar shows while an epoch runs (worker 0 prints it).
struct Progress {
  int epoch = 0;
  std::int64_t step = 0;
  std::int64_t steps = 0;
  double loss = 0;  // this worker's running mean
  double samples_per_second = 0;
};

class Trainer {
 public:
  // Creates the model, the optimizer and the metric variables under s.scope().
  Trainer(Strategy& s, TrainConfig config);

  // One pass over `train`, shuffled from seed + epoch (every worker the same
  // order), in global batches; stops after max_steps steps if > 0.
  // A resumed epoch starts at `first_step` (the steps a checkpoint took
  // already, `rows_before` rows; the running loss sum is the checkpoint's).
  // after_step(steps done, rows done) is called after each step, in the
  // cross-replica context (where a checkpoint is saved).
  EpochStats train_epoch(const Examples& train, int epoch, std::int64_t max_steps = 0,
                         const std::function<void(const Progress&)>& progress = {}, std::int64_t first_step = 0,
                         std::int64_t rows_before = 0,
                         const std::function<void(std::int64_t, std::int64_t)>& after_step = {});
  // Loss and accuracy over `test`, split across every replica.
  EvalStats evaluate(const Examples& test);

  // Tracks what a resumed run needs in `checkpoint`: "model/dense_k/kernel"
  // and ".../bias", "optimizer", and the epoch's running loss "metrics/loss_sum".
  void track(Checkpoint& checkpoint);

  const Mlp& model() const { return *model_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  // Every parameter's primary component (copies), in model().variables() order.
  std::vector<Tensor> parameters() const;

 private:
  Strategy* strategy_;
  TrainConfig config_;
  std::unique_ptr<Mlp> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<Mlp::Workspace> workspaces_;  // one per local replica
  std::unique_ptr<SyncOnReadVariable> loss_sum_;
  std::unique_ptr<SyncOnReadVariable> correct_;
};

// A BatchFn of row indices (int64 (b,)): `order` in batches of `batch`
// (the last may be shorter). Each replica gathers its own rows (in
// parallel), so the batches carry indices, not pixels. `last_rows`, if
// given, receives each batch's size.
BatchFn index_batches(std::vector<std::int64_t> order, std::int64_t batch,
                      const std::shared_ptr<std::int64_t>& last_rows = nullptr);
// A permutation of [0, n) from `seed`, the same on every platform.
std::vector<std::int64_t> shuffled(std::int64_t n, std::uint64_t seed);

}  // namespace distribute::train
