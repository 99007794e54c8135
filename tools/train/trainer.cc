#include "trainer.h"

#include <chrono>
#include <numeric>
#include <random>

namespace distribute::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& c) {
  if (c.optimizer == "adam") {
    return std::make_unique<Adam>(Adam::Options{.learning_rate = c.learning_rate > 0 ? c.learning_rate : 0.001});
  }
  if (c.optimizer == "sgd") {
    return std::make_unique<SGD>(
        SGD::Options{.learning_rate = c.learning_rate > 0 ? c.learning_rate : 0.05, .momentum = c.momentum});
  }
  throw InvalidArgumentError("unknown optimizer '" + c.optimizer + "'; expected adam or sgd");
}

}  // namespace

std::vector<std::int64_t> shuffled(std::int64_t n, std::uint64_t seed) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 gen(seed);
  for (std::int64_t i = n - 1; i > 0; --i) {
    std::swap(order[static_cast<std::size_t>(i)], order[gen() % static_cast<std::uint64_t>(i + 1)]);
  }
  return order;
}

BatchFn index_batches(std::vector<std::int64_t> order, std::int64_t batch,
                      const std::shared_ptr<std::int64_t>& last_rows) {
  auto next = std::make_shared<std::size_t>(0);
  auto shared_order = std::make_shared<const std::vector<std::int64_t>>(std::move(order));
  return [shared_order, batch, next, last_rows]() -> std::optional<Nest<Tensor>> {
    const auto& ord = *shared_order;
    if (*next >= ord.size()) return std::nullopt;
    const std::size_t rows = std::min(static_cast<std::size_t>(batch), ord.size() - *next);
    std::vector<std::int64_t> ids(ord.begin() + static_cast<std::ptrdiff_t>(*next),
                                  ord.begin() + static_cast<std::ptrdiff_t>(*next + rows));
    *next += rows;
    if (last_rows) *last_rows = static_cast<std::int64_t>(rows);
    return Nest<Tensor>(constant(ids, Shape{static_cast<std::int64_t>(rows)}));
  };
}

Trainer::Trainer(Strategy& s, TrainConfig config)
    : strategy_(&s), config_(std::move(config)), optimizer_(make_optimizer(config_)) {
  if (config_.global_batch < s.num_replicas_in_sync()) {
    throw InvalidArgumentError("the global batch of " + std::to_string(config_.global_batch) +
                               " rows is smaller than the " + std::to_string(s.num_replicas_in_sync()) +
                               " replicas in sync: every replica needs at least one row");
  }
  auto scope = s.scope();
  model_ = std::make_unique<Mlp>(config_.layers, config_.seed);
  loss_sum_ = std::make_unique<SyncOnReadVariable>(
      constant(0.0), VariableOptions{.name = "loss_sum", .aggregation = VariableAggregation::kSum});
  correct_ = std::make_unique<SyncOnReadVariable>(
      constant(std::int64_t{0}), VariableOptions{.name = "correct", .aggregation = VariableAggregation::kSum});
  workspaces_.resize(static_cast<std::size_t>(s.num_local_replicas()));
}

void Trainer::track(Checkpoint& checkpoint) {
  for (const Variable& v : model_->variables()) checkpoint.track("model/" + v.name(), v);
  checkpoint.track("optimizer", *optimizer_);
  checkpoint.track("metrics/loss_sum", *loss_sum_);
}

EpochStats Trainer::train_epoch(const Examples& train, int epoch, std::int64_t max_steps,
                                const std::function<void(const Progress&)>& progress, std::int64_t first_step,
                                std::int64_t rows_before,
                                const std::function<void(std::int64_t, std::int64_t)>& after_step) {
  auto global_rows = std::make_shared<std::int64_t>(0);
  std::vector<std::int64_t> order = shuffled(train.size(), config_.seed + static_cast<std::uint64_t>(epoch));
  // A resumed epoch goes on where the checkpoint stopped: the same order, less the rows taken.
  const auto taken = static_cast<std::size_t>(
      std::min<std::int64_t>(first_step, (train.size() + config_.global_batch - 1) / config_.global_batch) *
      config_.global_batch);
  order.erase(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(std::min(taken, order.size())));
  DistributedDataset dataset = strategy_->experimental_distribute_dataset(
      index_batches(std::move(order), config_.global_batch, global_rows), config_.global_batch);
  if (first_step == 0) loss_sum_->assign(constant(0.0));
  optimizer_->reset_timings();
  EpochStats stats;
  stats.rows = rows_before;
  stats.rows_before = rows_before;
  stats.steps = first_step;
  // (Rounded up without adding: a batch near 2^63 would wrap to no step.)
  const std::int64_t steps_in_epoch =
      train.size() / config_.global_batch + (train.size() % config_.global_batch != 0 ? 1 : 0);
  const std::int64_t steps = max_steps > 0 ? std::min(max_steps, steps_in_epoch) : steps_in_epoch;
  double local_loss = 0;
  std::int64_t local_rows = 0;
  const auto start = Clock::now();
  auto last_report = start;
  for (std::int64_t step = first_step; step < steps; ++step) {
    auto batch = dataset.get_next();
    if (!batch) break;
    const double divisor = static_cast<double>(*global_rows);
    double step_time = 0;
    auto totals = strategy_->run(
        [&](ReplicaContext& ctx, const Nest<Tensor>& mine) {
          const auto t0 = Clock::now();
          Mlp::Workspace& ws = workspaces_[static_cast<std::size_t>(ctx.local_replica_id())];
          const auto [x, y] = gather_rows(train, mine.leaf());
          const Mlp::Totals t = model_->forward_backward(x, y, divisor, ws);
          optimizer_->apply_gradients(model_->gradients_and_variables(ws));
          loss_sum_->assign_add(constant(t.loss_sum));
          if (ctx.local_replica_id() == 0) step_time = seconds_since(t0);
          return std::make_pair(t.loss_sum, y.num_elements());
        },
        *batch);
    stats.replica_step_seconds += step_time;
    for (const auto& [loss, rows] : totals.values()) {
      local_loss += loss;
      local_rows += rows;
    }
    stats.rows += *global_rows;
    ++stats.steps;
    if (after_step) after_step(stats.steps, stats.rows);
    if (progress && (seconds_since(last_report) > 0.2 || step + 1 == steps)) {
      last_report = Clock::now();
      const double elapsed = seconds_since(start);
      progress(Progress{epoch, step + 1, steps, local_rows ? local_loss / static_cast<double>(local_rows) : 0,
                        elapsed > 0 ? static_cast<double>(stats.rows - rows_before) / elapsed : 0});
    }
  }
  stats.seconds = seconds_since(start);
  stats.optimizer = optimizer_->timings();
  // A cross-replica read of a SUM SyncOnReadVariable: every replica of every worker.
  stats.train_loss = stats.rows ? loss_sum_->read_value().scalar<double>() / static_cast<double>(stats.rows) : 0;
  return stats;
}

EvalStats Trainer::evaluate(const Examples& test) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(test.size()));
  std::iota(order.begin(), order.end(), 0);
  DistributedDataset dataset =
      strategy_->experimental_distribute_dataset(index_batches(order, config_.eval_batch), config_.eval_batch);
  loss_sum_->assign(constant(0.0));
  correct_->assign(constant(std::int64_t{0}));
  for (const auto& batch : dataset) {
    strategy_->run(
        [&](ReplicaContext& ctx, const Nest<Tensor>& mine) {
          Mlp::Workspace& ws = workspaces_[static_cast<std::size_t>(ctx.local_replica_id())];
          const auto [x, y] = gather_rows(test, mine.leaf());
          const Mlp::Totals t = model_->evaluate(x, y, ws);
          loss_sum_->assign_add(constant(t.loss_sum));
          correct_->assign_add(constant(t.correct));
        },
        batch);
  }
  const auto n = static_cast<double>(test.size());
  return EvalStats{loss_sum_->read_value().scalar<double>() / n,
                   static_cast<double>(correct_->read_value().scalar<std::int64_t>()) / n};
}

std::vector<Tensor> Trainer::parameters() const {
  std::vector<Tensor> out;
  for (const Variable& v : model_->variables()) out.push_back(v.values()[0].clone());
  return out;
}

}  // namespace distribute::train
