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
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "distribute/options.h"
#include "distribute/tensor.h"
#include "distribute/variables.h"

namespace distribute {

// One (gradient, variable) pair, as an element of Keras' grads_and_vars.
using GradientAndVariable = std::pair<Tensor, Variable>;

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
  // as in Keras.
  void apply_gradients(const std::vector<GradientAndVariable>& grads_and_vars,
                       const CommunicationOptions& options = {});

  // apply_gradients calls (Keras' `iterations`): a call counts from its
  // merge_call on, and is taken back if its all-reduce fails. Inside
  // Strategy::run every replica may read it; after apply_gradients it
  // includes that call.
  std::int64_t iterations() const { return iterations_.load(); }

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
  Optimizer() = default;
  // The names of the slots each variable gets (zero-initialised).
  virtual std::vector<std::string> slot_names() const = 0;
  // Updates one component with the summed gradient; `slots` are the same
  // component of each slot, in slot_names() order; `step` is 1 on the first
  // apply_gradients.
  virtual void apply_dense(const Tensor& var, const Tensor& grad, std::span<const Tensor> slots,
                           std::int64_t step) const = 0;

 private:
  struct Slots {
    Variable var;
    std::vector<Variable> slots;
  };
  Slots& slots_of(const Variable& var);
  std::unordered_map<const void*, std::unique_ptr<Slots>> slots_;
  // Counted by merge_fn (every replica waits for it), taken back by local
  // replica 0 if the gradients then fail to reduce; read by any replica.
  std::atomic<std::int64_t> iterations_{0};
  Timings timings_;
};

// Keras' SGD: var -= lr * g; with momentum m: accum = m * accum - lr * g,
// var += accum (nesterov: var += m * accum - lr * g).
class SGD final : public Optimizer {
 public:
  struct Options {
    double learning_rate = 0.01;
    double momentum = 0.0;  // in [0, 1]
    bool nesterov = false;
  };
  explicit SGD(Options options);
  SGD() : SGD(Options{}) {}
  std::string_view name() const override { return "SGD"; }
  const Options& options() const { return options_; }

 private:
  std::vector<std::string> slot_names() const override;
  void apply_dense(const Tensor& var, const Tensor& grad, std::span<const Tensor> slots,
                   std::int64_t step) const override;
  Options options_;
};

// Keras' Adam (epsilon added to sqrt(v) after bias correction):
// alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t); m += (g - m) * (1 - beta_1);
// v += (g^2 - v) * (1 - beta_2); var -= alpha * m / (sqrt(v) + epsilon).
class Adam final : public Optimizer {
 public:
  struct Options {
    double learning_rate = 0.001;
    double beta_1 = 0.9;    // in [0, 1)
    double beta_2 = 0.999;  // in [0, 1)
    double epsilon = 1e-7;
  };
  explicit Adam(Options options);
  Adam() : Adam(Options{}) {}
  std::string_view name() const override { return "Adam"; }
  const Options& options() const { return options_; }

 private:
  std::vector<std::string> slot_names() const override;
  void apply_dense(const Tensor& var, const Tensor& grad, std::span<const Tensor> slots,
                   std::int64_t step) const override;
  Options options_;
};

}  // namespace distribute
