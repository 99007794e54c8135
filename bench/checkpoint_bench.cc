// distribute-ckpt-bench: checkpoint save and restore against a plain write
// and read of the same bytes, side by side in one run (docs/benchmarks.md,
// "Checkpoints").
//
//   distribute-ckpt-bench [--bytes 1G] [--variables 256] [--replicas 2] [--rounds 3] [--dir /tmp]
//   mpirun -np 2 distribute-ckpt-bench --replicas 1 ...   (2 workers x 1 replica)
//
// The state is `variables` float32 variables of a MirroredStrategy (under
// mpirun, a MultiWorkerMirroredStrategy of --replicas per worker) and Adam's
// two slots for each, `bytes` in all. Under mpirun every worker saves and
// restores, and the plain baseline has each worker write and read its 1/W
// of the bytes to a file of its own, at the same time. Each round, alternating:
//   plain write: the same bytes written to one file from the same memory, fsync'd (and the directory);
//   save:        Checkpoint::write of the state (shards, CRC32C, manifest, fsyncs);
//   plain read:  that file read back into memory already touched;
//   restore:     Checkpoint::read of the state (read, CRC check, assign to every replica);
//   copy:        a memcpy of the state into memory touched before;
//   async:       how long Checkpoint::write with experimental_enable_async_checkpoint
//                blocks its caller (then sync(), not timed).
// Before each read, the files' cached pages are dropped (posix_fadvise), so
// that both reads come from the disk alike.
#include <distribute/distribute.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench_strategy.h"

using namespace distribute;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

[[noreturn]] void die(const std::string& what) { bench::die("distribute-ckpt-bench", what); }

void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_caches_under(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) drop_cache(e.path().string());
}

// The tensors' bytes to one file, fsync'd with its directory.
void plain_write(const std::string& path, const std::vector<Tensor>& tensors) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) die("cannot create " + path);
  for (const Tensor& t : tensors) {
    const auto* p = static_cast<const char*>(t.raw_data());
    for (std::size_t done = 0; done < t.nbytes();) {
      const ssize_t w = ::write(fd, p + done, std::min<std::size_t>(t.nbytes() - done, 4U << 20));
      if (w <= 0) die("write failed");
      done += static_cast<std::size_t>(w);
    }
  }
  if (::fsync(fd) != 0) die("fsync failed");
  ::close(fd);
  const int dir = ::open(fs::path(path).parent_path().c_str(), O_RDONLY | O_DIRECTORY);
  ::fsync(dir);
  ::close(dir);
}

void plain_read(const std::string& path, const std::vector<Tensor>& into) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) die("cannot open " + path);
  off_t at = 0;
  for (const Tensor& t : into) {
    auto* p = static_cast<char*>(t.mutable_raw_data());
    for (std::size_t done = 0; done < t.nbytes();) {
      const ssize_t r = ::pread(fd, p + done, t.nbytes() - done, at);
      if (r <= 0) die("read failed");
      done += static_cast<std::size_t>(r);
      at += r;
    }
  }
  ::close(fd);
}

std::uint64_t parse_bytes(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  const std::string suffix = end;
  const double scale = suffix == "G" ? 1 << 30 : suffix == "M" ? 1 << 20 : suffix == "K" ? 1 << 10 : 1;
  if (!(v > 0) || (suffix != "" && scale == 1)) die("--bytes needs a size (1G, 256M), got '" + s + "'");
  return static_cast<std::uint64_t>(v * scale);
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t bytes = 1ULL << 30;
  int variables = 256;
  int replicas = 2;
  int rounds = 3;
  std::string base = fs::temp_directory_path().string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--bytes") {
      bytes = parse_bytes(value);
    } else if (flag == "--variables") {
      variables = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--replicas") {
      replicas = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--rounds") {
      rounds = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--dir") {
      base = value;
    } else {
      die("unknown flag " + flag);
    }
  }

  const std::unique_ptr<Strategy> owned_strategy = bench::make_bench_strategy(replicas);
  Strategy& strategy = *owned_strategy;
  int worker = 0, workers = 1;
  if (const auto* mw = dynamic_cast<const MultiWorkerMirroredStrategy*>(&strategy)) {
    worker = mw->worker_rank();
    workers = mw->num_workers();
  }
  // Every worker waits for every other (an all-reduce of a scalar); with
  // `value`, the sum of every first replica's value.
  auto all_workers = [&](std::int64_t value = 0) {
    auto r = strategy.run([&](ReplicaContext& ctx) {
      return ctx.all_reduce(ReduceOp::kSum, constant(ctx.replica_id_in_sync_group() == 0 ? value : std::int64_t{0}));
    });
    return strategy.experimental_local_results(r)[0].scalar<std::int64_t>();
  };
  // One directory for the job: worker 0's pid names it.
  const std::int64_t job = all_workers(worker == 0 ? ::getpid() : 0);
  const std::string dir = base + "/distribute-ckpt-bench-" + std::to_string(job);
  fs::create_directories(dir);
  // Each variable and its two slots: bytes / (3 * variables), in floats.
  const auto elements = static_cast<std::int64_t>(std::max<std::uint64_t>(1, bytes / (12ULL * variables)));
  std::vector<Variable> vars;
  {
    auto scope = strategy.scope();
    for (int v = 0; v < variables; ++v) {
      vars.push_back(MirroredVariable(Tensor(DType::kFloat32, Shape{elements}), {.name = "v" + std::to_string(v)}));
    }
  }
  Adam adam;
  train::Checkpoint ckpt;
  for (int v = 0; v < variables; ++v) ckpt.track("model/v" + std::to_string(v), vars[static_cast<std::size_t>(v)]);
  ckpt.track("optimizer", adam);
  {
    // One step makes the slots.
    std::vector<GradientAndVariable> pairs;
    for (Variable& v : vars) pairs.emplace_back(Tensor(DType::kFloat32, Shape{elements}), v);
    strategy.run([&] { adam.apply_gradients(pairs); });
  }
  std::vector<Tensor> state;  // what a save writes, by reference (primary components)
  for (Variable& v : vars) {
    state.push_back(v.values()[0]);
    state.push_back(adam.get_slot(v, "m").values()[0]);
    state.push_back(adam.get_slot(v, "v").values()[0]);
  }
  std::vector<Tensor> landing;  // a plain read's destination, touched once before timing
  for (const Tensor& t : state) landing.push_back(t.clone());
  double total = 0;
  for (const Tensor& t : state) total += static_cast<double>(t.nbytes());

  // This worker's share of the plain baseline: every W-th tensor.
  std::vector<Tensor> my_state, my_landing;
  for (std::size_t i = 0; i < state.size(); ++i) {
    if (static_cast<int>(i % static_cast<std::size_t>(workers)) != worker) continue;
    my_state.push_back(state[i]);
    my_landing.push_back(landing[i]);
  }
  const bool chief = worker == 0;
  if (chief) {
    std::printf("# %d variables + Adam's slots, %.0f MiB, %s, %d worker(s) x %d replica(s), files in %s\n", variables,
                total / (1 << 20), std::string(strategy.name()).c_str(), workers, replicas, dir.c_str());
  }
  // The first asynchronous save makes its host buffers (first touch of
  // fresh memory); the rounds measure the ones after it, which reuse them.
  const train::CheckpointOptions async{.experimental_enable_async_checkpoint = true};
  {
    all_workers();
    const auto t = Clock::now();
    ckpt.write(dir + "/async", async);
    const double first_s = seconds_since(t);
    ckpt.sync();
    if (chief) std::printf("# the first asynchronous save (fresh host buffers) blocked %.1f ms\n", first_s * 1e3);
  }
  if (chief)
    std::printf("%5s  %14s  %14s  %10s  %14s  %14s  %10s  %9s  %9s  %10s\n", "round", "write+fsync", "save",
                "save/plain", "plain read", "restore", "rest/plain", "copy", "async", "async/copy");
  double sum_ratio_save = 0, sum_ratio_restore = 0, sum_ratio_async = 0;
  for (int round = 0; round < rounds; ++round) {
    const std::string plain = dir + "/plain-" + std::to_string(worker) + ".bin";
    all_workers();
    auto t = Clock::now();
    plain_write(plain, my_state);
    all_workers();
    const double plain_write_s = seconds_since(t);
    t = Clock::now();
    const std::string prefix = ckpt.write(dir + "/ckpt");
    all_workers();
    const double save_s = seconds_since(t);
    drop_caches_under(dir);
    all_workers();
    t = Clock::now();
    plain_read(plain, my_landing);
    all_workers();
    const double plain_read_s = seconds_since(t);
    drop_caches_under(dir);
    all_workers();
    t = Clock::now();
    ckpt.read(prefix).expect_partial();
    all_workers();
    const double restore_s = seconds_since(t);
    // A copy of the whole state into memory touched before, beside the time
    // an asynchronous save blocks its caller (each worker copies all of its
    // state: every worker holds every variable).
    all_workers();
    t = Clock::now();
    for (std::size_t i = 0; i < state.size(); ++i) {
      std::memcpy(landing[i].mutable_raw_data(), state[i].raw_data(), state[i].nbytes());
    }
    const double copy_s = seconds_since(t);
    all_workers();
    t = Clock::now();
    ckpt.write(dir + "/async", async);
    const double async_s = seconds_since(t);
    ckpt.sync();
    all_workers();
    const double gb = total / 1e9;
    if (chief)
      std::printf("%5d  %9.2f GB/s  %9.2f GB/s  %10.2f  %9.2f GB/s  %9.2f GB/s  %10.2f  %6.1f ms  %6.1f ms  %10.2f\n",
                  round + 1, gb / plain_write_s, gb / save_s, plain_write_s / save_s, gb / plain_read_s, gb / restore_s,
                  plain_read_s / restore_s, copy_s * 1e3, async_s * 1e3, async_s / copy_s);
    sum_ratio_save += plain_write_s / save_s;
    sum_ratio_restore += plain_read_s / restore_s;
    sum_ratio_async += async_s / copy_s;
  }
  if (chief)
    std::printf(
        "# mean: save at %.2f of a plain write + fsync, restore at %.2f of a plain read, an asynchronous save "
        "blocks %.2fx a copy of the state\n",
        sum_ratio_save / rounds, sum_ratio_restore / rounds, sum_ratio_async / rounds);
  all_workers();
  if (chief) fs::remove_all(dir);
}
