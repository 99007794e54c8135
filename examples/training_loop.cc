// The README's training example: a TensorFlow-style custom training loop.
// Fits y = 3x - 1 by least squares on 2 replicas: variables under scope(),
// a distributed dataset, and an optimizer step inside strategy.run.
#include <distribute/distribute.h>

#include <iomanip>
#include <iostream>
#include <optional>

using namespace distribute;

int main() {
  MirroredStrategy strategy({"CPU:0", "CPU:1"});
  std::optional<MirroredVariable> w, b;
  {
    auto scope = strategy.scope();  // variables created here are mirrored
    w.emplace(constant(0.f), VariableOptions{.name = "w"});
    b.emplace(constant(0.f), VariableOptions{.name = "b"});
  }
  SGD sgd({.learning_rate = 0.1, .momentum = 0.5});
  const std::int64_t global_batch = 8;
  for (int epoch = 0; epoch < 40; ++epoch) {
    // 32 points x in [-1, 1), in global batches of 8: {x, y} rows.
    int next = 0;
    BatchFn batches = [&]() -> std::optional<Nest<Tensor>> {
      if (next == 32) return std::nullopt;
      Tensor x = iota(DType::kFloat32, Shape{global_batch}, -1 + next / 16.0, 1 / 16.0);
      Tensor y(DType::kFloat32, Shape{global_batch});
      for (int i = 0; i < global_batch; ++i) y.mutable_flat<float>()[i] = 3 * x.flat<float>()[i] - 1;
      next += global_batch;
      return Nest<Tensor>::tuple({x, y});
    };
    for (const auto& batch : strategy.experimental_distribute_dataset(batches, global_batch)) {
      strategy.run(
          [&](const Nest<Tensor>& mine) {
            // Gradients of this replica's share of the global mean squared error.
            const auto x = mine[0].leaf().flat<float>();
            const auto y = mine[1].leaf().flat<float>();
            const float wv = w->read_value().scalar<float>(), bv = b->read_value().scalar<float>();
            float dw = 0, db = 0;
            for (std::size_t i = 0; i < x.size(); ++i) {
              const float err = wv * x[i] + bv - y[i];
              dw += 2 * err * x[i] / global_batch;
              db += 2 * err / global_batch;
            }
            sgd.apply_gradients({{constant(dw), *w}, {constant(db), *b}});  // summed over replicas
          },
          batch);
    }
  }
  std::cout << std::fixed << std::setprecision(3) << "w = " << w->read_value().scalar<float>()
            << ", b = " << b->read_value().scalar<float>() << " after " << sgd.iterations() << " steps on "
            << strategy.num_replicas_in_sync() << " replicas\n";
}
