// File: optimizers.h
//
// Optimizers that update distributed variables as Keras' do under a
// tf.distribute strategy: apply_gradients, called by every replica inside
// Strategy::run with its own gradients, makes one merge_call (the replicas
// agree on the variables; slots are made; the step is counted), one batched
// all-reduce that sums every gradient over every replica in sync (packed by
// bytes_per_pack), and one update of each component: every replica updates
// its own, in parallel, from the same bits.
//
//   MirroredStrategy strategy({"CPU:0", "CPU:1"});
//   std::optional<MirroredVariable> w;
//   { auto scope = strategy.scope(); w.emplace(constant({1.f, 2.f}), VariableOptions{.name = "w"}); }
//   SGD sgd({.learning_rate = 0.1, .momentum = 0.9});
//   strategy.run([&](ReplicaContext& ctx) {
//     Tensor grad = ...;   // this replica's gradient of loss / global_batch_size
//     sgd.apply_gradients({{grad, *w}});
//   });
//
// Gradients are SUMMED over replicas, as Keras does: a replica's loss must be
// divided by the GLOBAL batch size (compute_average_loss), so that the sum is
// the gradient of the global batch's mean loss.
//
// The learning rate is a number or a schedule of Keras' (ExponentialDecay,
// PiecewiseConstantDecay, CosineDecay), evaluated at `iterations` (the steps
// taken before this one), and can be set between steps, as can iterations:
//
//   Adam adam({.learning_rate = ExponentialDecay(0.01, /*decay_steps=*/1000, /*decay_rate=*/0.9)});
//   adam.set_iterations(restored_step);   // a restored run goes on with its schedule
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "distribute/options.h"
#include "distribute/tensor.h"
#include "distribute/variables.h"

namespace distribute {

namespace internal {
struct CheckpointAccess;  // checkpoint.cc: saves and restores the slots and iterations
}

// A learning rate as a function of the step (the optimizer's iterations
// before the update), as keras.optimizers.schedules.LearningRateSchedule.
class LearningRateSchedule {
 public:
  virtual ~LearningRateSchedule() = default;
  virtual double operator()(std::int64_t step) const = 0;
  // "ExponentialDecay(initial_learning_rate=0.1, decay_steps=100, ...)".
  virtual std::string describe() const = 0;
};

// initial_learning_rate * decay_rate ^ (step / decay_steps); with
// staircase, the exponent is floored (the rate changes every decay_steps).
class ExponentialDecay final : public LearningRateSchedule {
 public:
  // decay_steps > 0; the rates finite, decay_rate > 0.
  ExponentialDecay(double initial_learning_rate, std::int64_t decay_steps, double decay_rate, bool staircase = false);
  double operator()(std::int64_t step) const override;
  std::string describe() const override;

 private:
  double initial_;
  std::int64_t decay_steps_;
  double decay_rate_;
  bool staircase_;
};

// values[0] up to and including boundaries[0], values[1] up to boundaries[1],
// ..., and values.back() after the last boundary.
class PiecewiseConstantDecay final : public LearningRateSchedule {
 public:
  // Boundaries strictly increasing; values.size() == boundaries.size() + 1.
  PiecewiseConstantDecay(std::vector<std::int64_t> boundaries, std::vector<double> values);
  double operator()(std::int64_t step) const override;
  std::string describe() const override;

 private:
  std::vector<std::int64_t> boundaries_;
  std::vector<double> values_;
};

// initial_learning_rate * ((1 - alpha) * 0.5 * (1 + cos(pi * s / decay_steps)) + alpha),
// s = min(step, decay_steps): from the initial rate down to alpha times it.
class CosineDecay final : public LearningRateSchedule {
 public:
  // decay_steps > 0; alpha in [0, 1].
  CosineDecay(double initial_learning_rate, std::int64_t decay_steps, double alpha = 0.0);
  double operator()(std::int64_t step) const override;
  std::string describe() const override;

 private:
  double initial_;
  std::int64_t decay_steps_;
  double alpha_;
};

// What an optimizer's learning_rate holds: a number or a schedule.
class LearningRate {
 public:
  LearningRate(double value) : value_(value) {}  // NOLINT: implicit, as Keras takes a float
  template <class S>
  requires std::is_base_of_v<LearningRateSchedule, S> LearningRate(S schedule)  // NOLINT: implicit, as Keras
      : schedule_(std::make_shared<const S>(std::move(schedule))) {}
  explicit LearningRate(std::shared_ptr<const LearningRateSchedule> schedule);

  // The rate for `step` (the schedule's value, or the number).
  double at(std::int64_t step) const { return schedule_ ? (*schedule_)(step) : value_; }
  // The schedule, or null for a number.
  const std::shared_ptr<const LearningRateSchedule>& schedule() const { return schedule_; }
  // The number (0 when a schedule is held).
  double value() const { return value_; }
  std::string describe() const;

 private:
  double value_ = 0;
  std::shared_ptr<const LearningRateSchedule> schedule_;
};

// One (gradient, variable) pair, as an element of Keras' grads_and_vars; no
// gradient (std::nullopt, Keras' None) leaves that variable as it is.
using GradientAndVariable = std::pair<std::optional<Tensor>, Variable>;

class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual std::string_view name() const = 0;

  // Called by every replica of the run (or in the default context), with
  // the same variables in the same order; each gradient has its variable's
  // dtype and shape; variables are float32 or float64. The gradients are
  // summed across every replica in sync, then every component of every
  // variable is updated once (docs/semantics.md §5.7). `options` apply to the
  // all-reduce. In a cross-replica context it is a FailedPreconditionError,
  // as in Keras. As Keras: a pair without a gradient is left out, with a
  // warning on stderr naming its variable (once per variable); if no pair
  // has one, InvalidArgumentError ("No gradients provided for any variable").
  void apply_gradients(const std::vector<GradientAndVariable>& grads_and_vars,
                       const CommunicationOptions& options = {});

  // The learning rate: a number or a schedule, evaluated at iterations()
  // once per step, in its merge_call (under a lock: a rate set from another
  // thread during a step takes effect at the next one). A schedule's value
  // that is not finite fails that step on every replica.
  LearningRate learning_rate() const;
  void set_learning_rate(LearningRate learning_rate);
  // The rate the next step uses: learning_rate().at(iterations()).
  double current_learning_rate() const;

  // apply_gradients calls (Keras' `iterations`): a call counts from its
  // merge_call on, and is taken back if its all-reduce fails. Inside
  // Strategy::run every replica may read it; after apply_gradients it
  // includes that call.
  std::int64_t iterations() const { return iterations_.load(); }
  // Sets the count (>= 0), as Keras' iterations.assign: a restored
  // optimizer goes on with its schedule and Adam's bias correction.
  void set_iterations(std::int64_t iterations);

  // Where local replica 0's apply_gradients time went, summed over calls
  // since the last reset, for benchmarks: the merge_call (including the wait
  // for the other replicas to arrive), the all-reduce, and its own updates.
  // Read outside Strategy::run.
  struct Timings {
    double merge_call_seconds = 0;
    double all_reduce_seconds = 0;
    double update_seconds = 0;
  };
  const Timings& timings() const { return timings_; }
  void reset_timings() { timings_ = {}; }

  // The slot variable `slot` of `var` ("momentum" for SGD with momentum,
  // "m" and "v" for Adam), made by the first apply_gradients that updated
  // `var`: a MirroredVariable of var's strategy. NotFoundError otherwise.
  Variable get_slot(const Variable& var, std::string_view slot) const;

 protected:
  // `learning_rate`: a finite number or a schedule (else InvalidArgumentError naming `optimizer`).
  Optimizer(std::string_view optimizer, LearningRate learning_rate);
  // The names of the slots each variable gets (zero-initialised).
  virtual std::vector<std::string> slot_names() const = 0;
  // Updates one component with the summed gradient; `slots` are the same
  // component of each slot, in slot_names() order; `step` is 1 on the first
  // apply_gradients; `learning_rate` is the rate for this step.
  virtual void apply_dense(const Tensor& var, const Tensor& grad, std::span<const Tensor> slots, std::int64_t step,
                           double learning_rate) const = 0;

 private:
  friend struct internal::CheckpointAccess;
  struct Slots {
    Variable var;
    std::vector<Variable> slots;
  };
  Slots& slots_of(const Variable& var);
  void warn_of_missing_gradients(const std::vector<GradientAndVariable>& grads_and_vars);
  std::unordered_map<const void*, std::unique_ptr<Slots>> slots_;
  // Counted by merge_fn (every replica waits for it), taken back by local
  // replica 0 if the gradients then fail to reduce; read by any replica.
  std::atomic<std::int64_t> iterations_{0};
  Timings timings_;
  mutable std::mutex learning_rate_mu_;  // set by the user's thread, read by merge_fn
  LearningRate learning_rate_;
  std::unordered_map<const void*, bool> warned_no_gradient_;  // touched in merge_fn only
};

// Keras' SGD: var -= lr * g; with momentum m: accum = m * accum - lr * g,
// var += accum (nesterov: var += m * accum - lr * g).
class SGD final : public Optimizer {
 public:
  struct Options {
    LearningRate learning_rate = 0.01;
    double momentum = 0.0;  // in [0, 1]
    bool nesterov = false;
  };
  explicit SGD(Options options);
  SGD() : SGD(Options{}) {}
  std::string_view name() const override { return "SGD"; }
  // As constructed (learning_rate() is the current rate).
  const Options& options() const { return options_; }

 private:
  std::vector<std::string> slot_names() const override;
  void apply_dense(const Tensor& var, const Tensor& grad, std::span<const Tensor> slots, std::int64_t step,
                   double learning_rate) const override;
  Options options_;
};

// Keras' Adam (epsilon added to sqrt(v) after bias correction):
// alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t); m += (g - m) * (1 - beta_1);
// v += (g^2 - v) * (1 - beta_2); var -= alpha * m / (sqrt(v) + epsilon).
class Adam final : public Optimizer {
 public:
  struct Options {
    LearningRate learning_rate = 0.001;
    double beta_1 = 0.9;    // in [0, 1)
    double beta_2 = 0.999;  // in [0, 1)
    double epsilon = 1e-7;
  };
  explicit Adam(Options options);
  Adam() : Adam(Options{}) {}
  std::string_view name() const override { return "Adam"; }
  // As constructed (learning_rate() is the current rate).
  const Options& options() const { return options_; }

 private:
  std::vector<std::string> slot_names() const override;
  void apply_dense(const Tensor& var, const Tensor& grad, std::span<const Tensor> slots, std::int64_t step,
                   double learning_rate) const override;
  Options options_;
};

}  // namespace distribute
