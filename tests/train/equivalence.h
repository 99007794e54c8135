// Trains the MLP for a number of steps on a strategy and returns the
// parameters: the core of the equivalence tests (in-process and mpirun).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "synthetic.h"
#include "trainer.h"

namespace distribute::train::testing {

inline constexpr int kEquivalenceSteps = 50;
inline constexpr std::int64_t kEquivalenceBatch = 64;
// Documented in docs/benchmarks.md ("Equivalence"): after 50 SGD steps the
// parameters of every replica layout agree with one replica's to this much
// (absolute); they differ only by the order of float additions.
inline constexpr double kEquivalenceTolerance = 2e-6;

inline TrainConfig equivalence_config() {
  TrainConfig c;
  c.global_batch = kEquivalenceBatch;
  c.optimizer = "sgd";
  c.learning_rate = 0.05;
  c.momentum = 0.9;
  c.seed = 7;
  return c;
}

inline const Examples& equivalence_data() {
  static const Examples data = synthetic_examples(1000, 11);
  return data;
}

// 50 steps (the epoch's first 50 global batches of 64 rows, shuffled).
inline std::vector<Tensor> train_parameters(Strategy& s, const TrainConfig& config = equivalence_config()) {
  Trainer trainer(s, config);
  trainer.train_epoch(equivalence_data(), /*epoch=*/0, kEquivalenceSteps);
  return trainer.parameters();
}

inline double max_abs_difference(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double worst = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    const auto x = a[k].flat<float>();
    const auto y = b[k].flat<float>();
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(double{x[i]} - double{y[i]}));
  }
  return worst;
}

}  // namespace distribute::train::testing
