// Training that survives being stopped: the README's training loop with a
// CheckpointManager and a PreemptionCheckpointHandler. Stop it with Ctrl-C
// or a SIGTERM (the step ends, a checkpoint of it, exit status 42) or with
// kill -9 (the last epoch's checkpoint stays) and run it again: it goes on
// from the latest checkpoint, and ends where an uninterrupted run ends, bit
// for bit.
//
//   resumable_training /tmp/fit [epochs]
#include <distribute/distribute.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

using namespace distribute;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: resumable_training CHECKPOINT_DIR [EPOCHS]\n");
    return 2;
  }
  const int epochs = argc > 2 ? std::atoi(argv[2]) : 40;
  MirroredStrategy strategy({"CPU:0", "CPU:1"});
  std::optional<MirroredVariable> w, b;
  {
    auto scope = strategy.scope();
    w.emplace(constant(0.f), VariableOptions{.name = "w"});
    b.emplace(constant(0.f), VariableOptions{.name = "b"});
  }
  Variable epoch(constant(std::int64_t{0}), {.name = "epoch"});  // where to go on from
  Adam adam({.learning_rate = 0.05});
  train::Checkpoint checkpoint({{"model/w", *w}, {"model/b", *b}, {"optimizer", adam}, {"epoch", epoch}});
  train::CheckpointManager manager(checkpoint, argv[1], /*max_to_keep=*/3);
  // Restores the latest checkpoint; from here a SIGTERM or Ctrl-C ends the
  // step it comes in, saves and exits with 42.
  train::PreemptionCheckpointHandler handler(strategy, manager);
  if (const auto restored = manager.latest_checkpoint()) {
    std::printf("restored %s at epoch %lld, step %lld\n", restored->c_str(),
                static_cast<long long>(epoch.read_value().scalar<std::int64_t>()),
                static_cast<long long>(handler.total_run_calls()));
  }
  const std::int64_t global_batch = 8, steps_per_epoch = 4;
  // A preemption's checkpoint may come in the middle of an epoch: the steps
  // it took are skipped (the batches are the same every epoch).
  std::int64_t skip = handler.total_run_calls() - epoch.read_value().scalar<std::int64_t>() * steps_per_epoch;
  for (std::int64_t e = epoch.read_value().scalar<std::int64_t>(); e < epochs; ++e) {
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
      if (skip > 0 && skip--) continue;
      handler.run([&] {
        strategy.run(
            [&](const Nest<Tensor>& mine) {
              const auto x = mine[0].leaf().flat<float>();
              const auto y = mine[1].leaf().flat<float>();
              const float wv = w->read_value().scalar<float>(), bv = b->read_value().scalar<float>();
              float dw = 0, db = 0;
              for (std::size_t i = 0; i < x.size(); ++i) {
                const float err = wv * x[i] + bv - y[i];
                dw += 2 * err * x[i] / global_batch;
                db += 2 * err / global_batch;
              }
              adam.apply_gradients({{constant(dw), *w}, {constant(db), *b}});
            },
            batch);
      });
    }
    epoch.assign(constant(e + 1));
    manager.save();  // after each epoch: a kill -9 loses at most one
  }
  // %.9g: every bit of a float, for the test that reads the checkpoint back.
  std::printf("w = %.9g, b = %.9g after %lld steps; saved %s\n", w->read_value().scalar<float>(),
              b->read_value().scalar<float>(), static_cast<long long>(adam.iterations()),
              manager.latest_checkpoint()->c_str());
}
