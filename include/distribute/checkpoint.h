// File: checkpoint.h
//
// Checkpoints of a training run, as tf.train.Checkpoint, CheckpointManager
// and tf.train.load_checkpoint: save variables and optimizers (their slots
// and iterations) under one strategy, restore them under any other.
//
//   MirroredStrategy strategy({"CPU:0", "CPU:1"});
//   std::optional<MirroredVariable> w;
//   { auto scope = strategy.scope(); w.emplace(constant({1.f, 2.f}), VariableOptions{.name = "w"}); }
//   Adam adam;
//   train::Checkpoint ckpt({{"model/w", *w}, {"optimizer", adam}});
//   train::CheckpointManager manager(ckpt, "/tmp/run", /*max_to_keep=*/3);
//   manager.restore_or_initialize();      // the latest checkpoint, if any
//   ...train...; manager.save();          // /tmp/run/ckpt-1
//
// What is saved, as TensorFlow saves it: one tensor per variable, whatever
// the layout: a MirroredVariable's value once; a SyncOnReadVariable's
// aggregate (SUM, MEAN; ONLY_FIRST_REPLICA's first replica). Restore assigns
// it as a cross-replica assign does (a SUM variable gets value / N on each of
// its N replicas), so a checkpoint written under one strategy and replica
// count restores under any other. Keys follow TF's object graph:
// "<path>/.ATTRIBUTES/VARIABLE_VALUE", slots under
// "<var path>/.OPTIMIZER_SLOT/<optimizer path>/<slot>/.ATTRIBUTES/VARIABLE_VALUE",
// an optimizer's step count as "<optimizer path>/iter/...", a dataset's
// position as "<path>/.ATTRIBUTES/ITERATOR_STATE" (int64 [pass, step, ended]).
//
// Format (docs/checkpoints.md): prefix P is the JSON manifest "P.index.json"
// (each tensor's key, shard, dtype, shape, CRC32C; the step and the layout
// that wrote it) and safetensors shards "P.data-KKKKK-of-NNNNN.<token>.safetensors",
// one per worker that wrote tensors. A checkpoint is visible only once whole:
// the shards are written and fsync'd, then the manifest is renamed into place
// and the directory fsync'd. Bytes that do not match their CRC32C are never
// restored (DataLossError naming the file and the tensor).
//
// Under MultiWorkerMirroredStrategy every worker calls save and restore, as
// in TensorFlow (reading a SyncOnRead variable is a collective); each tensor
// is written once in the job, the writes spread over the workers, and worker
// 0 commits the manifest once every worker's shard is on disk. An error on
// any worker is raised by every worker and leaves the previous checkpoint as
// it was. The directory must be one filesystem that every worker sees.
//
// Save and restore are called in a cross-replica context (not inside
// Strategy::run), by one thread at a time per Checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "distribute/input.h"
#include "distribute/optimizers.h"
#include "distribute/tensor.h"
#include "distribute/variables.h"

namespace distribute::train {

// What a Checkpoint holds under a name: a variable (a handle: the checkpoint
// refers to the same variable), or an optimizer or a distributed dataset
// (by reference: it must outlive the checkpoint's saves and restores).
class Trackable {
 public:
  Trackable(const Variable& variable) : variable_(variable) {}    // NOLINT: implicit, as keyword arguments
  Trackable(Optimizer& optimizer) : optimizer_(&optimizer) {}     // NOLINT: implicit
  Trackable(DistributedDataset& dataset) : dataset_(&dataset) {}  // NOLINT: implicit
  const Variable* variable() const { return variable_ ? &*variable_ : nullptr; }
  Optimizer* optimizer() const { return optimizer_; }
  DistributedDataset* dataset() const { return dataset_; }

 private:
  std::optional<Variable> variable_;
  Optimizer* optimizer_ = nullptr;
  DistributedDataset* dataset_ = nullptr;
};

struct CheckpointOptions {
  // Written into the manifest as "step" (CheckpointManager passes its
  // step_counter's value); informational.
  std::optional<std::int64_t> step;
  // TF's experimental_enable_async_checkpoint: save() returns once the
  // values are copied to host memory (buffers the next such save reuses: one
  // copy of the state), and a thread writes them while training goes on. At
  // most one save is in flight: the next save, restore or sync() waits for
  // it first and raises its error (the failed save then changes nothing, as
  // a synchronous one). Under several workers the shards are written in the
  // background and the commit (an exchange among the workers) is made by the
  // next save, restore or sync(), which every worker calls alike.
  bool experimental_enable_async_checkpoint = false;
};

// One tensor of a checkpoint, as its manifest describes it.
struct CheckpointEntry {
  std::string key;        // "model/w/.ATTRIBUTES/VARIABLE_VALUE"
  std::string full_name;  // the variable's name ("w"), or the optimizer's ("Adam")
  DType dtype = DType::kFloat32;
  Shape shape;
  std::string file;          // the shard's file name, beside the manifest
  std::uint64_t offset = 0;  // of its bytes in the shard's data (after the header)
  std::uint64_t size = 0;    // bytes
  std::uint32_t crc32c = 0;
};

// tf.train.load_checkpoint: the tensors of one checkpoint, read without a
// model. Opening reads the manifest and every shard's header (NotFoundError
// if `path` holds no checkpoint; DataLossError for a bad manifest or header).
class CheckpointReader {
 public:
  // `path`: a checkpoint prefix ("dir/ckpt-3"), or a directory (its latest
  // checkpoint).
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;

  const std::string& prefix() const;
  // Entries sorted by key.
  const std::vector<CheckpointEntry>& entries() const;
  bool has_tensor(std::string_view key) const;
  const CheckpointEntry& entry(std::string_view key) const;  // NotFoundError if absent
  // The tensor's bytes, checked against their CRC32C (DataLossError naming
  // the file and the key).
  Tensor get_tensor(std::string_view key) const;
  // Reads every tensor and checks its CRC32C and the shards' sizes; returns
  // one line per problem (empty when the checkpoint is sound).
  std::vector<std::string> verify() const;
  // The manifest's "step" (if one was given) and "save_counter", and the
  // layout that wrote it ("MirroredStrategy, 1 worker x 2 replicas").
  std::optional<std::int64_t> step() const;
  std::int64_t save_counter() const;
  const std::string& layout() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

class Checkpoint;

// What restore() returns, as TF's CheckpointLoadStatus. The assertions throw
// FailedPreconditionError (TF's AssertionError) with TF's messages, and
// return the status for chaining.
class CheckpointLoadStatus {
 public:
  // Every tracked object that holds values got them from this checkpoint
  // (checkpoint values without an object are allowed).
  CheckpointLoadStatus& assert_existing_objects_matched();
  // That, and every value in the checkpoint was restored into an object.
  CheckpointLoadStatus& assert_consumed();
  // Something besides the root matched.
  CheckpointLoadStatus& assert_nontrivial_match();
  // Silences the warning about values never restored (when the checkpoint
  // is destroyed); restores nothing else.
  CheckpointLoadStatus& expect_partial();

 private:
  friend class Checkpoint;
  CheckpointLoadStatus(Checkpoint* checkpoint, std::uint64_t restore_id) : checkpoint_(checkpoint), id_(restore_id) {}
  Checkpoint* checkpoint_;
  std::uint64_t id_;
};

class Checkpoint {
 public:
  // tf.train.Checkpoint(**kwargs): `objects` by name. A name is a path of
  // '/'-separated parts ("model/dense/kernel"), each an edge of TF's object
  // graph; names must be distinct.
  Checkpoint();
  Checkpoint(std::initializer_list<std::pair<std::string, Trackable>> objects);
  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // ckpt.name = object (a name tracked already then names this object). If
  // a restore is pending, the values saved for it
  // (and, for an optimizer or a variable, the slots of the pair) are
  // restored now: TF's restore-on-create.
  Checkpoint& track(const std::string& name, Trackable object);

  // save_counter += 1, writes "<file_prefix>-<save_counter>" and records it
  // in dirname(file_prefix)/checkpoint.json (as TF's "checkpoint" state
  // file). Returns the path written.
  std::string save(const std::string& file_prefix, const CheckpointOptions& options = {});
  // Writes exactly `file_prefix`; no counter, no state file. Returns it.
  std::string write(const std::string& file_prefix, const CheckpointOptions& options = {});

  // Restores what the checkpoint at `save_path` holds for the tracked
  // objects (a directory: its latest checkpoint); values for objects tracked
  // later are restored when they are tracked. `restore` also restores
  // save_counter; `read` (for write()'s checkpoints) does not expect it.
  // NotFoundError if there is no checkpoint there.
  CheckpointLoadStatus restore(const std::string& save_path);
  CheckpointLoadStatus read(const std::string& save_path);

  // TF's _preload_simple_restoration: the value the pending restore holds
  // for the variable `name`, to create that variable with (restore-on-create).
  std::optional<Tensor> initial_value(const std::string& name) const;

  // Saves made by save() (restored by restore()).
  std::int64_t save_counter() const;
  // Waits for an asynchronous save in flight and completes it (under
  // several workers, its commit: every worker calls sync); raises its error.
  void sync();

 private:
  friend class CheckpointLoadStatus;
  friend class CheckpointManager;
  friend class PreemptionCheckpointHandler;
  CheckpointLoadStatus load(const std::string& save_path, bool expects_save_counter);
  // Called at the start of every save and write (in the cross-replica
  // context), until set again with an empty function: what `owner` brings
  // up to date just before the values are read (the preemption handler's
  // step count, which it would otherwise assign at every step).
  void before_write(const void* owner, std::function<void()> fn);
  // The strategy whose workers save together (the first multi-worker one
  // among the variables'), or null.
  Strategy* coordinator() const;
  struct State;
  std::unique_ptr<State> state_;
};

struct CheckpointManagerOptions {
  // TF's keep_checkpoint_every_n_hours: of the checkpoints max_to_keep
  // drops, one per this many hours is kept (and no longer managed).
  std::optional<double> keep_checkpoint_every_n_hours;
  std::string checkpoint_name = "ckpt";
  // With checkpoint_interval: save() writes only when step_counter has
  // advanced by the interval since the last save. Its value also goes into
  // the manifest as "step".
  std::optional<Variable> step_counter;
  std::optional<std::int64_t> checkpoint_interval;
  // Called by restore_or_initialize when there is no checkpoint.
  std::function<void()> init_fn;
  // Seconds since the epoch (tests pass their own clock).
  std::function<double()> clock;
};

// tf.train.CheckpointManager: numbered checkpoints in one directory, the
// newest max_to_keep of them kept, an index (checkpoint.json) written
// crash-safely after each save. While a manager lives, it holds a lock on
// the directory: a second manager on it, in this process or another job,
// is refused (FailedPreconditionError) rather than mixing their saves.
// The directory is created, and checked writable, on construction.
class CheckpointManager {
 public:
  // max_to_keep: std::nullopt keeps every checkpoint; else > 0.
  CheckpointManager(Checkpoint& checkpoint, std::string directory, std::optional<int> max_to_keep,
                    CheckpointManagerOptions options = {});
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Saves "<directory>/<checkpoint_name>-<n>" (n = checkpoint_number, else
  // the checkpoint's save_counter after its increment) and sweeps the oldest
  // beyond max_to_keep. With a checkpoint_interval, returns std::nullopt
  // (saving nothing) until step_counter has advanced by it (check_interval
  // false skips that test, not the one that the step changed).
  // With options.experimental_enable_async_checkpoint the save goes on in
  // the background (see CheckpointOptions); latest_checkpoint() and
  // checkpoints() name it once it is complete, as the next save, restore or
  // sync() finds it.
  std::optional<std::string> save(std::optional<std::int64_t> checkpoint_number = std::nullopt,
                                  bool check_interval = true, const CheckpointOptions& options = {});
  // Checkpoint::sync: waits for an asynchronous save, records it, raises its error.
  void sync();
  // The newest checkpoint, or nullopt.
  std::optional<std::string> latest_checkpoint() const;
  // The managed checkpoints, oldest first.
  const std::vector<std::string>& checkpoints() const;
  // Restores the latest checkpoint and returns its path; else calls init_fn
  // (if any) and returns nullopt.
  std::optional<std::string> restore_or_initialize();
  const std::string& directory() const;
  // The checkpoint it saves (TF's `manager.checkpoint`).
  Checkpoint& checkpoint() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// tf.train.latest_checkpoint: the newest checkpoint that the directory's
// index names and that is whole (its manifest exists), or nullopt.
std::optional<std::string> latest_checkpoint(const std::string& directory);

}  // namespace distribute::train
