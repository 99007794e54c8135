// distribute-train: trains a 784-256-128-10 MLP on Fashion-MNIST with a
// tf.distribute strategy, and reports per-epoch loss, accuracy and speed.
//
//   distribute-train                                  # mirrored over every core, 15 epochs
//   distribute-train --strategy default --epochs 15 --metrics m.json --plot curves.svg
//   mpirun -np 2 distribute-train --strategy multi_worker --replicas 1
#include <distribute/distribute.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "agree.h"
#include "blas.h"
#include "core/crc32c.h"
#include "core/host_cpus.h"
#include "flags.h"
#include "output.h"
#include "trainer.h"

#ifdef DISTRIBUTE_HAVE_MPI
#include <distribute/mpi.h>
#endif

using namespace distribute;
using namespace distribute::train;

namespace {

constexpr const char* kUsage = R"(usage: distribute-train [options]
  --strategy NAME      default | one_device | mirrored | multi_worker   (default: mirrored)
  --replicas N         replicas (per worker for multi_worker); default: one per core
  --global-batch N     rows per step, across every replica                (default: 128)
  --epochs N           passes over the 60,000 training images             (default: 15)
  --steps-per-epoch N  stop each epoch after N steps (0: the whole epoch)
  --optimizer NAME     adam | sgd                                         (default: adam)
  --learning-rate X    default: 0.001 for adam, 0.05 for sgd
  --seed N             initial weights and shuffling                      (default: 1)
  --data DIR           Fashion-MNIST IDX files (default: /usr/share/datasets/fashion-mnist)
  --metrics FILE       write the per-epoch metrics as JSON
  --plot FILE          draw the learning curves as an SVG picture
  --checkpoint-dir DIR save checkpoints there (after each epoch), and go on from
                       the latest one found there: epoch, step, data order,
                       optimizer state, metrics and learning curve. A SIGTERM
                       or Ctrl-C to any worker then makes every worker finish
                       the same step, save and exit with status 42
  --checkpoint-every N also save every N steps (0: only after each epoch)
  --keep N             checkpoints kept in --checkpoint-dir          (default: 3)
  --async-checkpoint   save in the background: a save copies the state to
                       host memory and training goes on while a thread
                       writes it (at most one save in flight)
  --blas-threads N     OpenBLAS threads per GEMM, or auto: the usable cores
                       divided among the local replicas, at least 1   (default: auto)
  --blas-core NAME     OpenBLAS kernels: auto (the widest the CPU runs, where
                       OpenBLAS picked narrower ones and OPENBLAS_CORETYPE is
                       unset) or a core name (Haswell, SkylakeX, ...)    (default: auto)
  --help               this text
)";

struct Args {
  std::string strategy = "mirrored";
  int replicas = 0;
  TrainConfig config;
  int epochs = 15;
  std::int64_t steps_per_epoch = 0;
  std::string data = kFashionMnistDir;
  std::string metrics;
  std::string plot;
  int blas_threads = 0;  // auto
  std::string blas_core = "auto";
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;
  int keep = 3;
  bool async_checkpoint = false;
};

using tools::parse_int;
using tools::parse_int32;
using tools::parse_positive;
using tools::UsageError;

using tools::check_writable;
using tools::write_file;

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (flag == "--async-checkpoint") {
      a.async_checkpoint = true;
      continue;
    }
    if (i + 1 >= argc) throw UsageError("unknown flag or missing value: " + flag);
    const std::string value = argv[++i];
    if (flag == "--strategy") {
      if (value != "default" && value != "one_device" && value != "mirrored" && value != "multi_worker") {
        throw UsageError("--strategy must be default, one_device, mirrored or multi_worker, got '" + value + "'");
      }
      a.strategy = value;
    } else if (flag == "--replicas") {
      a.replicas = parse_int32(flag, value, 1);
    } else if (flag == "--global-batch") {
      a.config.global_batch = parse_int(flag, value, 1);
    } else if (flag == "--epochs") {
      a.epochs = parse_int32(flag, value, 1);
    } else if (flag == "--steps-per-epoch") {
      a.steps_per_epoch = parse_int(flag, value, 0);
    } else if (flag == "--optimizer") {
      if (value != "adam" && value != "sgd") throw UsageError("--optimizer must be adam or sgd, got '" + value + "'");
      a.config.optimizer = value;
    } else if (flag == "--learning-rate") {
      a.config.learning_rate = parse_positive(flag, value);
    } else if (flag == "--seed") {
      a.config.seed = static_cast<std::uint64_t>(parse_int(flag, value, 0));
    } else if (flag == "--data") {
      a.data = value;
    } else if (flag == "--metrics") {
      a.metrics = value;
    } else if (flag == "--plot") {
      a.plot = value;
    } else if (flag == "--checkpoint-dir") {
      if (value.empty()) throw UsageError("--checkpoint-dir needs a directory");
      a.checkpoint_dir = value;
    } else if (flag == "--checkpoint-every") {
      a.checkpoint_every = parse_int(flag, value, 0);
    } else if (flag == "--keep") {
      a.keep = parse_int32(flag, value, 1);
    } else if (flag == "--blas-threads") {
      a.blas_threads = value == "auto" ? 0 : parse_int32(flag, value, 1, 1024);
    } else if (flag == "--blas-core") {
      const std::string why = value == "auto" ? "" : refuse_blas_core(value, cpu_simd_level());
      if (!why.empty()) throw UsageError("--blas-core " + why);
      a.blas_core = value;
    } else {
      throw UsageError("unknown flag: " + flag);
    }
  }
  if (a.checkpoint_dir.empty() && a.checkpoint_every > 0) {
    throw UsageError("--checkpoint-every needs --checkpoint-dir");
  }
  if (a.checkpoint_dir.empty() && a.async_checkpoint) {
    throw UsageError("--async-checkpoint needs --checkpoint-dir");
  }
  if ((a.strategy == "default" || a.strategy == "one_device") && a.replicas > 1) {
    throw UsageError("--strategy " + a.strategy + " has exactly one replica; --replicas " + std::to_string(a.replicas) +
                     " needs mirrored or multi_worker");
  }
  return a;
}

// A loss or accuracy for JSON: a number, or null where it is NaN or infinite
// (JSON has no such numbers; a diverged run).
std::string json_number(double v, int digits);

struct EpochRecord {
  int epoch;
  EpochStats train;
  EvalStats test;
};

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(digits);
  s << v;
  return s.str();
}

// "10,000 examples, 3f2a9c01": the examples' count and the CRC-32 of their images and labels.
std::string data_digest(const Examples& e) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto add = [&crc](const Tensor& t) {
    const auto* p = static_cast<const Bytef*>(t.raw_data());
    for (std::size_t at = 0; at < t.nbytes(); at += 1u << 30) {
      crc = crc32(crc, p + at, static_cast<uInt>(std::min<std::size_t>(t.nbytes() - at, 1u << 30)));
    }
  };
  add(e.images);
  add(e.labels);
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08lx", static_cast<unsigned long>(crc));
  return tools::grouped(e.size()) + " examples, " + hex;
}

// 12345.6 -> "12,346"
std::string grouped(double v) { return tools::grouped(std::llround(v)); }

// Part of replica 0's step time, as a fraction.
std::string fraction(double seconds, const EpochStats& e) {
  return fixed(seconds / std::max(e.replica_step_seconds, 1e-9), 4);
}

std::string json_number(double v, int digits) { return std::isfinite(v) ? fixed(v, digits) : "null"; }

// The first epoch whose losses are not finite, or 0.
int diverged_at(const std::vector<EpochRecord>& epochs) {
  for (const EpochRecord& e : epochs) {
    if (!std::isfinite(e.train.train_loss) || !std::isfinite(e.test.loss)) return e.epoch;
  }
  return 0;
}

void write_metrics(const std::string& path, const Args& a, const Strategy& s, const std::vector<EpochRecord>& epochs) {
  std::ostringstream out;
  const int diverged = diverged_at(epochs);
  out << "{\n  \"strategy\": \"" << s.name() << "\",\n  \"replicas_in_sync\": " << s.num_replicas_in_sync()
      << ",\n  \"global_batch\": " << a.config.global_batch << ",\n  \"optimizer\": \"" << a.config.optimizer
      << "\",\n  \"seed\": " << a.config.seed << ",\n  \"diverged\": " << (diverged ? "true" : "false")
      << ",\n  \"epochs\": [\n";
  for (std::size_t i = 0; i < epochs.size(); ++i) {
    const EpochRecord& e = epochs[i];
    out << "    {\"epoch\": " << e.epoch << ", \"train_loss\": " << json_number(e.train.train_loss, 6)
        << ", \"test_loss\": " << json_number(e.test.loss, 6)
        << ", \"test_accuracy\": " << json_number(e.test.accuracy, 4)
        << ", \"train_samples_per_second\": " << fixed(samples_per_second(e.train), 1)
        << ", \"train_seconds\": " << fixed(e.train.seconds, 3) << ", \"steps\": " << e.train.steps
        << ", \"step_fraction\": {\"merge_call\": " << fraction(e.train.optimizer.merge_call_seconds, e.train)
        << ", \"all_reduce\": " << fraction(e.train.optimizer.all_reduce_seconds, e.train)
        << ", \"update\": " << fraction(e.train.optimizer.update_seconds, e.train) << "}}"
        << (i + 1 < epochs.size() ? ",\n" : "\n");
  }
  out << "  ]\n}\n";
  write_file("metrics file", path, out.str());
}

// Two panels: loss (train and test) and test accuracy, per epoch.
void write_plot(const std::string& path, const Strategy& s, const std::vector<EpochRecord>& all) {
  // Epochs whose figures are finite (a diverged run's are not: no point for them).
  std::vector<EpochRecord> epochs;
  for (const EpochRecord& e : all) {
    if (std::isfinite(e.train.train_loss) && std::isfinite(e.test.loss) && std::isfinite(e.test.accuracy)) {
      epochs.push_back(e);
    }
  }
  std::ostringstream out;
  const double w = 360, h = 240, left = 60, top = 40, gap = 90;
  const auto n = static_cast<double>(epochs.size());
  double max_loss = 0;
  double min_acc = 1;
  double max_acc = 0;
  for (const auto& e : epochs) {
    max_loss = std::max({max_loss, e.train.train_loss, e.test.loss});
    min_acc = std::min(min_acc, e.test.accuracy);
    max_acc = std::max(max_acc, e.test.accuracy);
  }
  max_loss = std::max(max_loss, 1e-6);
  min_acc = std::floor(min_acc * 50) / 50;
  max_acc = std::max(min_acc + 0.02, std::ceil(max_acc * 50) / 50);
  auto x_of = [&](double x0, int epoch) { return x0 + (n > 1 ? (epoch - 1) / (n - 1) : 0.5) * w; };
  auto line = [&](double x0, auto value, double lo, double hi, const char* colour) {
    std::string pts;
    for (const auto& e : epochs) {
      const double y = top + h - (value(e) - lo) / (hi - lo) * h;
      pts += fixed(x_of(x0, e.epoch), 1) + "," + fixed(y, 1) + " ";
    }
    out << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"2\" points=\"" << pts << "\"/>\n";
    for (const auto& e : epochs) {
      out << "<circle r=\"3\" fill=\"" << colour << "\" cx=\"" << fixed(x_of(x0, e.epoch), 1) << "\" cy=\""
          << fixed(top + h - (value(e) - lo) / (hi - lo) * h, 1) << "\"/>\n";
    }
  };
  auto axes = [&](double x0, const std::string& title, double lo, double hi, int digits) {
    out << "<rect x=\"" << x0 << "\" y=\"" << top << "\" width=\"" << w << "\" height=\"" << h
        << "\" fill=\"none\" stroke=\"#444\"/>\n";
    out << "<text x=\"" << x0 + w / 2 << "\" y=\"" << top - 12 << "\" text-anchor=\"middle\">" << title << "</text>\n";
    for (int t = 0; t <= 4; ++t) {
      const double v = lo + (hi - lo) * t / 4;
      const double y = top + h - h * t / 4;
      out << "<text x=\"" << x0 - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\" font-size=\"11\">"
          << fixed(v, digits) << "</text>\n";
    }
    for (const auto& e : epochs) {
      out << "<text x=\"" << fixed(x_of(x0, e.epoch), 1) << "\" y=\"" << top + h + 16
          << "\" text-anchor=\"middle\" font-size=\"11\">" << e.epoch << "</text>\n";
    }
    out << "<text x=\"" << x0 + w / 2 << "\" y=\"" << top + h + 34 << "\" text-anchor=\"middle\" font-size=\"12\">"
        << "epoch</text>\n";
  };
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << 2 * w + left + gap + 20 << "\" height=\""
      << top + h + 80 << "\" font-family=\"sans-serif\" font-size=\"13\">\n<rect width=\"100%\" height=\"100%\" "
      << "fill=\"white\"/>\n";
  axes(left, "cross-entropy loss", 0, max_loss, 2);
  line(
      left, [](const EpochRecord& e) { return e.train.train_loss; }, 0, max_loss, "#1f77b4");
  line(
      left, [](const EpochRecord& e) { return e.test.loss; }, 0, max_loss, "#d62728");
  const double x1 = left + w + gap;
  axes(x1, "test accuracy", min_acc, max_acc, 2);
  line(
      x1, [](const EpochRecord& e) { return e.test.accuracy; }, min_acc, max_acc, "#2ca02c");
  out << "<text x=\"" << left << "\" y=\"" << top + h + 60 << "\" font-size=\"12\"><tspan fill=\"#1f77b4\">"
      << "train loss</tspan>  <tspan fill=\"#d62728\">test loss</tspan>  <tspan fill=\"#2ca02c\">test accuracy"
      << "</tspan>  " << s.name() << ", " << s.num_replicas_in_sync() << " replicas in sync"
      << (epochs.size() < all.size() ? "; diverged: epochs without finite losses are not drawn" : "")
      << "</text>\n</svg>\n";
  write_file("plot file", path, out.str());
}

// --strategy mirrored or multi_worker (`workers`: the workers' link, if any).
std::unique_ptr<Strategy> make_replicated_strategy(const Args& a, int cores,
                                                   [[maybe_unused]] std::shared_ptr<Communicator>& workers) {
  // A replica is a thread: too many of them run out of threads or memory.
  int local = 0;
  try {
    if (a.strategy == "mirrored") {
      local = a.replicas > 0 ? a.replicas : cores;
      std::vector<std::string> devices;
      devices.reserve(static_cast<std::size_t>(local));
      for (int i = 0; i < local; ++i) devices.push_back("CPU:" + std::to_string(i));
      return std::make_unique<MirroredStrategy>(devices);
    } else {
#ifdef DISTRIBUTE_HAVE_MPI
      workers = mpi::cluster_from_launcher();  // nullptr without a launcher: one worker
      local = a.replicas > 0 ? a.replicas : std::max(1, cores / (workers ? workers->size() : 1));
      return std::make_unique<MultiWorkerMirroredStrategy>(local, workers);
#else
      throw UsageError("--strategy multi_worker needs a build with MPI");
#endif
    }
  } catch (const std::system_error& e) {
    throw ResourceExhaustedError("could not start the threads of " + tools::grouped(local) + " replicas (" + e.what() +
                                 "): the system had no thread to give (its limit on threads, ulimit -u and "
                                 "/proc/sys/kernel/threads-max, or memory for their stacks, ulimit -v); use fewer "
                                 "--replicas");
  } catch (const std::bad_alloc&) {
    throw ResourceExhaustedError("out of memory making a strategy of " + tools::grouped(local) +
                                 " replicas; use fewer --replicas");
  }
}

// What every worker must share: the same batches from the same data.
void agree_on_training(Strategy& s, const Args& a, const FashionMnist& data) {
  tools::agree_on_flags(s, {{"--global-batch", std::to_string(a.config.global_batch)},
                            {"--epochs", std::to_string(a.epochs)},
                            {"--steps-per-epoch", std::to_string(a.steps_per_epoch)},
                            {"--optimizer", a.config.optimizer},
                            {"--learning-rate", fixed(a.config.learning_rate, 9)},
                            {"--seed", std::to_string(a.config.seed)},
                            {"--checkpoint-dir", a.checkpoint_dir},
                            {"--checkpoint-every", std::to_string(a.checkpoint_every)},
                            {"training data (images, CRC-32)", data_digest(data.train)},
                            {"test data (images, CRC-32)", data_digest(data.test)}});
}

// The chief's lines for one epoch: its figures, and where replica 0's step time went.
void print_epoch(const Args& a, int epoch, const EpochStats& train, const EvalStats& test) {
  std::cout << "epoch " << epoch << "/" << a.epochs << ": train loss " << fixed(train.train_loss, 4) << ", test loss "
            << fixed(test.loss, 4) << ", test accuracy " << fixed(test.accuracy, 4) << ", "
            << grouped(samples_per_second(train)) << " samples/s (" << fixed(train.seconds, 2) << " s, " << train.steps
            << " steps)\n";
  const double step = std::max(train.replica_step_seconds, 1e-9);
  std::cout << "  replica 0's step time: merge_call " << fixed(100 * train.optimizer.merge_call_seconds / step, 1)
            << "%, all_reduce " << fixed(100 * train.optimizer.all_reduce_seconds / step, 1) << "%, update "
            << fixed(100 * train.optimizer.update_seconds / step, 1) << "%\n";
}

// What a checkpoint of distribute-train holds besides the trainer's own
// variables: where the run is, the settings it must go on with, and the
// learning curve so far (one row per finished epoch).
struct RunState {
  Variable epochs_done{constant(std::int64_t{0}), {.name = "epochs_done"}};
  Variable steps_in_epoch{constant(std::int64_t{0}), {.name = "steps_in_epoch"}};
  Variable rows_in_epoch{constant(std::int64_t{0}), {.name = "rows_in_epoch"}};
  // --seed, --global-batch and --optimizer (0 adam, 1 sgd): the data order
  // and the update rule a resumed run must keep.
  Variable settings;
  std::optional<Variable> history;

  explicit RunState(const Args& a)
      : settings(constant(std::vector<std::int64_t>{static_cast<std::int64_t>(a.config.seed), a.config.global_batch,
                                                    a.config.optimizer == "sgd" ? 1 : 0},
                          Shape{3}),
                 {.name = "settings"}) {}
  void track(Checkpoint& c) {
    c.track("train/epochs_done", epochs_done);
    c.track("train/steps_in_epoch", steps_in_epoch);
    c.track("train/rows_in_epoch", rows_in_epoch);
  }
};

constexpr int kHistoryColumns = 11;

Tensor encode_history(const std::vector<EpochRecord>& records) {
  std::vector<double> v;
  for (const EpochRecord& r : records) {
    v.insert(v.end(), {static_cast<double>(r.epoch), r.train.train_loss, static_cast<double>(r.train.rows),
                       static_cast<double>(r.train.steps), r.train.seconds, r.train.replica_step_seconds,
                       r.train.optimizer.merge_call_seconds, r.train.optimizer.all_reduce_seconds,
                       r.train.optimizer.update_seconds, r.test.loss, r.test.accuracy});
  }
  return constant(v, Shape{static_cast<std::int64_t>(records.size()), kHistoryColumns});
}

std::vector<EpochRecord> decode_history(const Tensor& t) {
  if (t.rank() != 2 || t.shape()[1] != kHistoryColumns || t.dtype() != DType::kFloat64) {
    throw InvalidArgumentError("the checkpoint's learning curve 'train/history' is " +
                               std::string(to_string(t.dtype())) + t.shape().to_string() + ", not float64(n, " +
                               std::to_string(kHistoryColumns) + ")");
  }
  std::vector<EpochRecord> out;
  const auto v = t.flat<double>();
  for (std::int64_t i = 0; i < t.shape()[0]; ++i) {
    const double* r = v.data() + i * kHistoryColumns;
    EpochRecord e{};
    e.epoch = static_cast<int>(r[0]);
    e.train.train_loss = r[1];
    e.train.rows = static_cast<std::int64_t>(r[2]);
    e.train.steps = static_cast<std::int64_t>(r[3]);
    e.train.seconds = r[4];
    e.train.replica_step_seconds = r[5];
    e.train.optimizer = {r[6], r[7], r[8]};
    e.test = {r[9], r[10]};
    out.push_back(e);
  }
  return out;
}

// The CRC32C of every parameter's bytes: equal digests, bit-identical models.
std::string parameters_digest(const Trainer& trainer) {
  std::uint32_t crc = 0;
  for (const Tensor& t : trainer.parameters()) crc = internal::crc32c_extend(crc, t.raw_data(), t.nbytes());
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", crc);
  return hex;
}

// The bar of an epoch's progress, redrawn in place on stderr.
void print_progress_bar(const Progress& p, int epochs) {
  const int width = 30;
  const int filled = static_cast<int>(width * p.step / p.steps);
  std::fprintf(stderr, "\repoch %d/%d [%s%s] %3d%% loss %.4f %s samples/s ", p.epoch, epochs,
               std::string(static_cast<std::size_t>(filled), '=').c_str(),
               std::string(static_cast<std::size_t>(width - filled), ' ').c_str(),
               static_cast<int>(100 * p.step / p.steps), p.loss, grouped(p.samples_per_second).c_str());
  std::fflush(stderr);
}

// The chief's account of the run: metrics, plot, accuracy, digest.
void report(const Args& a, const Strategy& s, const Trainer& trainer, const std::vector<EpochRecord>& records,
            int diverged) {
  if (!a.metrics.empty()) write_metrics(a.metrics, a, s, records);
  if (!a.plot.empty()) write_plot(a.plot, s, records);
  std::cout << "test accuracy " << fixed(records.back().test.accuracy, 4) << "\n";
  std::cout << "parameters CRC32C " << parameters_digest(trainer) << "\n";
  if (diverged) {
    std::cerr << "distribute-train: the training diverged: the loss is not finite from epoch " << diverged
              << " on (a smaller --learning-rate may help)\n";
  }
}

// --checkpoint-dir: every worker saves (each its share of the tensors) and
// restores; a run goes on from the latest checkpoint found there. Gives back
// the epochs' records of the restored run (none for a new one).
std::vector<EpochRecord> open_checkpoints(const Args& a, bool chief, Trainer& trainer, RunState& state,
                                          std::optional<Checkpoint>& checkpoint,
                                          std::optional<CheckpointManager>& manager) {
  std::vector<EpochRecord> records;
  if (a.checkpoint_dir.empty()) return records;
  checkpoint.emplace();
  trainer.track(*checkpoint);
  state.track(*checkpoint);
  manager.emplace(*checkpoint, a.checkpoint_dir, a.keep);
  if (const auto latest = manager->latest_checkpoint()) {
    const auto settings = CheckpointReader(*latest).get_tensor("train/settings/.ATTRIBUTES/VARIABLE_VALUE");
    if (!(settings == state.settings.read_value())) {
      const auto v = settings.flat<std::int64_t>();
      throw InvalidArgumentError("the checkpoint " + *latest + " was written with " +
                                 (v.size() == 3
                                      ? "--seed " + std::to_string(v[0]) + " --global-batch " + std::to_string(v[1]) +
                                            " --optimizer " + (v[2] == 1 ? "sgd" : "adam")
                                      : std::string("other settings")) +
                                 ": a run that goes on from it must keep them (or use another --checkpoint-dir)");
    }
    checkpoint->track("train/settings", state.settings);
    // Every variable of this model must find its value there.
    checkpoint->restore(*latest).assert_existing_objects_matched();
    if (auto history = checkpoint->initial_value("train/history")) records = decode_history(*history);
    if (chief) {
      std::cout << "distribute-train: restored " << *latest << ": "
                << state.epochs_done.read_value().scalar<std::int64_t>() << " epochs done, "
                << state.steps_in_epoch.read_value().scalar<std::int64_t>() << " steps into the next; "
                << trainer.optimizer().iterations() << " steps in all\n";
    }
  } else {
    checkpoint->track("train/settings", state.settings);
  }
  return records;
}

// Thrown once a preemption's checkpoint is saved: main() returns 42
// after every object is destroyed (MPI finalised), rather than exit().
struct Preempted {};

// --checkpoint-dir's pieces (none without it): the checkpoint, its manager
// and the preemption handler, with which a SIGTERM to any worker ends every
// worker after the same step with a checkpoint of it; and the epochs'
// records, the restored run's first.
class Checkpoints {
 public:
  Checkpoints(const Args& a, Strategy& s, bool chief, Trainer& trainer, RunState& state) : a_(&a), state_(&state) {
    records = open_checkpoints(a, chief, trainer, state, checkpoint_, manager_);
    if (!manager_) return;
    track_history();
    // (The handler restores the latest checkpoint again, as TF's does: the
    // values open_checkpoints just checked.)
    preemption_.emplace(s, *manager_, TerminationConfig{.exit_fn = [] { throw Preempted{}; }});
  }
  std::vector<EpochRecord> records;

  void save() {
    if (!manager_) return;
    track_history();
    manager_->save(std::nullopt, true, {.experimental_enable_async_checkpoint = a_->async_checkpoint});
  }
  // After each step (`iterations` in all so far, `steps` and `rows` of this
  // epoch): where the run is, then a preemption's save (the handler counts
  // the step first), then the periodic one.
  void after_step(std::int64_t iterations, std::int64_t steps, std::int64_t rows) {
    if (!preemption_) return;
    state_->steps_in_epoch.assign(constant(steps));
    state_->rows_in_epoch.assign(constant(rows));
    preemption_->save_checkpoint_if_preempted();
    if (a_->checkpoint_every > 0 && iterations % a_->checkpoint_every == 0) save();
  }
  void sync() {
    if (manager_) manager_->sync();
  }

 private:
  // The learning curve as the next save holds it (a preemption's too).
  void track_history() {
    state_->history.emplace(encode_history(records), VariableOptions{.name = "history"});
    checkpoint_->track("train/history", *state_->history);
  }
  const Args* a_;
  RunState* state_;
  std::optional<Checkpoint> checkpoint_;
  std::optional<CheckpointManager> manager_;
  std::optional<PreemptionCheckpointHandler> preemption_;
};

int run(const Args& a) {
  const int cores = internal::usable_cpus();
  std::unique_ptr<Strategy> owned;
  Strategy* s = nullptr;
  std::shared_ptr<Communicator> workers;
  if (a.strategy == "default") {
    s = &default_strategy();
  } else if (a.strategy == "one_device") {
    owned = std::make_unique<OneDeviceStrategy>("CPU:0");
  } else {
    owned = make_replicated_strategy(a, cores, workers);
  }
  if (owned) s = owned.get();
  // Replicas x BLAS threads within the cores: a pool per replica on every
  // core would oversubscribe them (docs/python.md has the figures).
  set_blas_threads(a.blas_threads > 0 ? a.blas_threads : std::max(1, cores / s->num_local_replicas()));
  const bool chief = s->first_replica_id() == 0;
  if (chief) {
    check_writable("--metrics", a.metrics);
    check_writable("--plot", a.plot);
  }
  const FashionMnist data = load_fashion_mnist(a.data);
  if (a.config.global_batch > data.train.size()) {
    throw InvalidArgumentError("--global-batch " + std::to_string(a.config.global_batch) + " is more than the " +
                               tools::grouped(data.train.size()) +
                               " training images: an epoch would not hold one batch");
  }
  agree_on_training(*s, a, data);
  Trainer trainer(*s, a.config);
  if (chief) {
    std::cout << "distribute-train: " << s->describe() << ", " << a.config.optimizer << ", global batch "
              << a.config.global_batch << ", " << trainer.model().num_parameters() << " parameters, "
              << data.train.size() << " training and " << data.test.size() << " test images; " << blas_description()
              << "; " << internal::describe_host_cpus() << "\n";
  }
  RunState state(a);
  Checkpoints checkpoints(a, *s, chief, trainer, state);
  std::vector<EpochRecord>& records = checkpoints.records;
  const bool bar = chief && isatty(STDERR_FILENO);
  const int first_epoch = static_cast<int>(state.epochs_done.read_value().scalar<std::int64_t>()) + 1;
  for (int epoch = first_epoch; epoch <= a.epochs; ++epoch) {
    auto progress = [&](const Progress& p) {
      if (bar) print_progress_bar(p, a.epochs);
    };
    auto after_step = [&](std::int64_t steps, std::int64_t rows) {
      checkpoints.after_step(trainer.optimizer().iterations(), steps, rows);
    };
    const bool resumed = epoch == first_epoch;
    EpochStats train =
        trainer.train_epoch(data.train, epoch, a.steps_per_epoch, progress,
                            resumed ? state.steps_in_epoch.read_value().scalar<std::int64_t>() : 0,
                            resumed ? state.rows_in_epoch.read_value().scalar<std::int64_t>() : 0, after_step);
    if (bar) std::fprintf(stderr, "\r%*s\r", 100, "");
    EvalStats test = trainer.evaluate(data.test);
    records.push_back({epoch, train, test});
    if (chief) print_epoch(a, epoch, train, test);
    state.epochs_done.assign(constant(std::int64_t{epoch}));
    state.steps_in_epoch.assign(constant(std::int64_t{0}));
    state.rows_in_epoch.assign(constant(std::int64_t{0}));
    checkpoints.save();
  }
  checkpoints.sync();  // the last save, if asynchronous, whole before the run ends
  if (records.empty()) {
    // Every epoch was done before (a finished run's checkpoint): the model as it was left.
    records.push_back({a.epochs, EpochStats{}, trainer.evaluate(data.test)});
  }
  const int diverged = diverged_at(records);
  if (chief) report(a, *s, trainer, records, diverged);
  return diverged ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    fit_blas_to_cpu(argv, a.blas_core);  // before any thread or MPI: it may run the program again
    return run(a);
  } catch (const Preempted&) {
    return TerminationConfig{}.exit_code;
  } catch (const UsageError& e) {
    std::cerr << "distribute-train: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "distribute-train: " << e.what() << "\n";
    return 1;
  }
}
