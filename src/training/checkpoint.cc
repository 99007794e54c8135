#include "distribute/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "distribute/context.h"
#include "distribute/errors.h"
#include "runtime/worker_agreement.h"
#include "training/checkpoint_format.h"
#include "training/checkpoint_io.h"

namespace distribute {

namespace internal {
// The optimizer's slots and step count, for checkpoints (a friend of Optimizer).
struct CheckpointAccess {
  static std::vector<std::string> slot_names(const Optimizer& o) { return o.slot_names(); }
  // The slots of `var` (in slot_names() order), or nullptr before the first
  // update of var.
  static const std::vector<Variable>* slots(const Optimizer& o, const Variable& var) {
    const auto it = o.slots_.find(var.id());
    return it == o.slots_.end() ? nullptr : &it->second->slots;
  }
  // Makes them now, under var's strategy (a restore made before the first
  // apply_gradients), as TensorFlow makes a slot that a restore names.
  static const std::vector<Variable>& make_slots(Optimizer& o, const Variable& var) {
    auto scope = var.distribute_strategy().scope();
    return o.slots_of(var).slots;
  }
};
}  // namespace internal

namespace train {
namespace fmt = internal::checkpoint_format;
using internal::CheckpointAccess;
using nlohmann::json;

namespace {

constexpr std::string_view kValueSuffix = "/.ATTRIBUTES/VARIABLE_VALUE";
constexpr std::string_view kSlotEdge = "/.OPTIMIZER_SLOT/";
constexpr std::string_view kSaveCounterKey = "save_counter/.ATTRIBUTES/VARIABLE_VALUE";
constexpr std::string_view kIteratorSuffix = "/.ATTRIBUTES/ITERATOR_STATE";

double wall_clock() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// TF's escape_local_name for each '/'-separated part: '.' -> "..".
std::string object_path(const std::string& name) {
  if (name.empty() || name.front() == '/' || name.back() == '/' || name.find("//") != std::string::npos) {
    throw InvalidArgumentError("Checkpoint: object name '" + name +
                               "' is not a path of non-empty parts separated by '/'");
  }
  std::string out;
  for (const char c : name) {
    out += c;
    if (c == '.') out += '.';
  }
  return out;
}

// "model/w" -> "(root).model.w" (escaped parts back to names).
std::string pretty_path(std::string_view path) {
  std::string out = "(root)";
  std::string part;
  auto flush = [&] {
    out += "." + part;
    part.clear();
  };
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '/') {
      flush();
    } else if (path[i] == '.' && i + 1 < path.size() && path[i + 1] == '.') {
      part += '.';
      ++i;
    } else {
      part += path[i];
    }
  }
  flush();
  return out;
}

// A key as TF prints the object it belongs to.
std::string pretty_key(const std::string& key) {
  std::string_view k = key;
  if (k.ends_with(kValueSuffix)) k.remove_suffix(kValueSuffix.size());
  if (k.ends_with(kIteratorSuffix)) k.remove_suffix(kIteratorSuffix.size());
  const auto slot = k.find(kSlotEdge);
  if (slot == std::string_view::npos) return pretty_path(k);
  const std::string_view var = k.substr(0, slot);
  std::string_view rest = k.substr(slot + kSlotEdge.size());
  const auto last = rest.rfind('/');
  if (last == std::string_view::npos) return pretty_path(k);
  return pretty_path(rest.substr(0, last)) + "'s state '" + std::string(rest.substr(last + 1)) + "' for " +
         pretty_path(var);
}

std::string describe(DType d, const Shape& s) { return std::string(to_string(d)) + s.to_string(); }

void require_cross_replica(std::string_view api) {
  // (Outside any strategy the default one's replica context is current,
  // as in TF; only a run of a strategy is refused.)
  if (get_replica_context() != nullptr && has_strategy()) {
    throw FailedPreconditionError("Checkpoint." + std::string(api) +
                                  "() is called in a cross-replica context (outside Strategy::run), on every "
                                  "worker; it was called inside a replica function");
  }
}

// Runs fn on this worker, then the workers of `s` (if any) exchange what it
// returned; an error on any worker is raised by every worker.
std::vector<std::string> agree(Strategy* s, std::string_view api, const std::function<std::string()>& fn) {
  std::string payload;
  std::optional<Error> failure;
  try {
    payload = fn();
  } catch (const Error& e) {
    failure.emplace(e);
  } catch (const std::exception& e) {
    failure.emplace(InternalError(std::string(api) + ": " + e.what()));
  }
  if (s == nullptr) {
    if (failure) throw_error(failure->code(), failure->message());
    return {std::move(payload)};
  }
  return internal::exchange_across_workers(*s, std::move(payload), api, failure ? &*failure : nullptr);
}

// What a tracked object holds under one key.
struct Owned {
  enum class Kind { kVariable, kIterations, kSlot, kSaveCounter, kDataset };
  Kind kind;
  std::string key;
  const Variable* variable = nullptr;     // kVariable, kSlot: the model variable
  Optimizer* optimizer = nullptr;         // kIterations, kSlot
  std::size_t slot = 0;                   // kSlot: index in slot_names()
  DistributedDataset* dataset = nullptr;  // kDataset
  std::string name;                       // kDataset: as tracked, for errors
};

// A dataset's position as saved: int64 [pass, step, ended].
Tensor position_tensor(const internal::DatasetPosition& p) {
  return constant(std::vector<std::int64_t>{p.pass, p.steps, p.ended ? 1 : 0}, Shape{3});
}
internal::DatasetPosition position_of(const Tensor& t) {
  const auto v = t.flat<std::int64_t>();
  return {v[0], v[1], v[2] != 0};
}

struct WriteResult {
  std::string commit_payload;  // what the committing worker's hook returned
};

}  // namespace

// ---- Checkpoint ---------------------------------------------------------------

struct Checkpoint::State {
  struct Object {
    std::string name;
    std::string path;  // escaped
    Trackable object;
  };
  std::vector<Object> objects;
  std::int64_t save_counter = 0;

  struct Restore {
    std::uint64_t id = 0;
    std::string prefix;
    fmt::Manifest manifest;
    std::map<std::string, const CheckpointEntry*, std::less<>> by_key;
    std::set<std::string, std::less<>> consumed;
    bool expects_save_counter = false;
    bool expect_partial = false;
  };
  std::vector<std::unique_ptr<Restore>> restores;  // oldest first
  std::uint64_t next_restore_id = 1;
  // Which restore last gave a key its value.
  std::map<std::string, std::uint64_t, std::less<>> restored_by;

  // The strategy whose workers save together: the first multi-worker one
  // among the variables', or null.
  Strategy* coordinator() const {
    for (const Object& o : objects) {
      if (const Variable* v = o.object.variable()) {
        Strategy& s = v->distribute_strategy();
        if (internal::worker_place(s).count > 1) return &s;
      }
    }
    return nullptr;
  }

  // The layout that writes: the strategy of the most replicas among the
  // variables' (a step counter may live under the default strategy).
  std::string layout() const {
    Strategy* widest = nullptr;
    for (const Object& o : objects) {
      if (const Variable* v = o.object.variable()) {
        Strategy& s = v->distribute_strategy();
        if (widest == nullptr || s.num_replicas_in_sync() > widest->num_replicas_in_sync()) widest = &s;
      }
    }
    if (widest == nullptr) return "no variables";
    const int workers = internal::worker_place(*widest).count;
    const int local = widest->num_local_replicas();
    return std::string(widest->name()) + ", " + std::to_string(workers) +
           (workers == 1 ? " worker x " : " workers x ") + std::to_string(local) +
           (local == 1 ? " replica" : " replicas");
  }

  // Every key the tracked objects may hold; `with_counter` adds save_counter.
  std::vector<Owned> owned(bool with_counter) const {
    std::vector<Owned> out;
    for (const Object& o : objects) {
      if (const Variable* v = o.object.variable()) {
        out.push_back({Owned::Kind::kVariable, o.path + std::string(kValueSuffix), v});
      } else if (DistributedDataset* d = o.object.dataset()) {
        out.push_back({.kind = Owned::Kind::kDataset,
                       .key = o.path + std::string(kIteratorSuffix),
                       .dataset = d,
                       .name = o.name});
      } else if (Optimizer* opt = o.object.optimizer()) {
        out.push_back({Owned::Kind::kIterations, o.path + "/iter" + std::string(kValueSuffix), nullptr, opt});
        const std::vector<std::string> names = CheckpointAccess::slot_names(*opt);
        for (const Object& var_object : objects) {
          const Variable* var = var_object.object.variable();
          if (var == nullptr) continue;
          for (std::size_t j = 0; j < names.size(); ++j) {
            out.push_back(
                {Owned::Kind::kSlot,
                 var_object.path + std::string(kSlotEdge) + o.path + "/" + names[j] + std::string(kValueSuffix), var,
                 opt, j});
          }
        }
      }
    }
    if (with_counter) out.push_back({Owned::Kind::kSaveCounter, std::string(kSaveCounterKey)});
    return out;
  }

  // Whether the key holds a value now (a slot only once made).
  static bool exists(const Owned& o) {
    return o.kind != Owned::Kind::kSlot || CheckpointAccess::slots(*o.optimizer, *o.variable) != nullptr;
  }

  // The value saved for `o` (a collective for a SyncOnRead variable under
  // several workers), and its full name.
  std::pair<Tensor, std::string> value_of(const Owned& o) const {
    auto of_variable = [](const Variable& v) {
      // A SyncOnRead variable's aggregate (TF reads it through the strategy);
      // a mirrored one's first component, every component being equal.
      if (v.synchronization() == VariableSynchronization::kOnRead) return v.read_value();
      return v.values()[0];
    };
    switch (o.kind) {
      case Owned::Kind::kVariable: return {of_variable(*o.variable), o.variable->name()};
      case Owned::Kind::kIterations:
        return {constant(o.optimizer->iterations()), std::string(o.optimizer->name()) + "/iter"};
      case Owned::Kind::kSlot: {
        const Variable& slot = (*CheckpointAccess::slots(*o.optimizer, *o.variable))[o.slot];
        return {of_variable(slot), slot.name()};
      }
      case Owned::Kind::kSaveCounter: return {constant(save_counter), "save_counter"};
      case Owned::Kind::kDataset: return {position_tensor(internal::Access::dataset_position(*o.dataset)), o.name};
    }
    throw InternalError("Checkpoint: unknown kind of value");
  }

  // Checks `t` against what `o` holds now (InvalidArgumentError naming the key
  // and both); `t` comes from `prefix`.
  void check_fits(const Owned& o, const Tensor& t, const std::string& prefix) const {
    DType want = DType::kInt64;
    Shape shape;
    std::string what = "the step counter";
    if (o.kind == Owned::Kind::kVariable) {
      want = o.variable->dtype();
      shape = o.variable->shape();
      what = "variable '" + o.variable->name() + "'";
    } else if (o.kind == Owned::Kind::kSlot) {
      want = o.variable->dtype();
      shape = o.variable->shape();
      what =
          "slot '" + CheckpointAccess::slot_names(*o.optimizer)[o.slot] + "' of variable '" + o.variable->name() + "'";
    } else if (o.kind == Owned::Kind::kIterations) {
      what = std::string(o.optimizer->name()) + ".iterations";
    } else if (o.kind == Owned::Kind::kDataset) {
      shape = Shape{3};
      what = "the position of dataset '" + o.name + "'";
    }
    if (t.dtype() != want || t.shape() != shape) {
      throw InvalidArgumentError("Checkpoint.restore from " + prefix + ": '" + o.key + "' holds " +
                                 describe(t.dtype(), t.shape()) + ", but " + what + " is " + describe(want, shape));
    }
  }

  void assign(const Owned& o, const Tensor& t) {
    switch (o.kind) {
      case Owned::Kind::kVariable: const_cast<Variable&>(*o.variable).assign(t); return;
      case Owned::Kind::kIterations: o.optimizer->set_iterations(t.scalar<std::int64_t>()); return;
      case Owned::Kind::kSlot: {
        Variable slot = CheckpointAccess::make_slots(*o.optimizer, *o.variable)[o.slot];
        slot.assign(t);
        return;
      }
      case Owned::Kind::kSaveCounter: save_counter = t.scalar<std::int64_t>(); return;
      case Owned::Kind::kDataset: break;  // (resolve() moves a dataset, after every other object)
    }
  }

  // The newest restore, newer than `newer_than`, that holds a value for
  // `key` (save_counter only from restore(), not read()).
  Restore* newest_with(std::string_view key, std::uint64_t newer_than) {
    for (auto it = restores.rbegin(); it != restores.rend(); ++it) {
      if ((*it)->id <= newer_than) break;
      if (key == kSaveCounterKey && !(*it)->expects_save_counter) continue;
      if ((*it)->by_key.contains(key)) return it->get();
    }
    return nullptr;
  }

  // Saves `prefix`: at once, or (options.experimental_enable_async_checkpoint)
  // finished by a thread and finish_pending(). after_commit runs on worker 0
  // once the manifest is in place (its return value reaches on_saved on every
  // worker); on_saved and on_failed run on the caller's thread.
  struct Save;
  void write(const std::string& prefix, const CheckpointOptions& options, bool with_counter,
             std::function<std::string()> after_commit, std::function<void(const WriteResult&)> on_saved,
             std::function<void()> on_failed);
  std::unique_ptr<Save> prepare(const std::string& prefix, const CheckpointOptions& options, bool with_counter);
  Tensor host_copy(const std::string& key, const Tensor& value);
  static std::string write_mine(Save& sv);
  // Static: an asynchronous save's thread reads its Save alone.
  static WriteResult exchange_and_commit(Save& sv, const std::function<std::string()>& local);
  // The asynchronous save in flight (at most one): finish_pending() waits for
  // it, completes it (several workers: its exchange and commit) and raises
  // its error; join_pending() only waits for its thread.
  std::unique_ptr<Save> in_flight;
  std::map<const void*, std::function<void()>> before_write;  // Checkpoint::before_write
  std::map<std::string, Tensor, std::less<>> host_buffers;    // reused by asynchronous saves
  void finish_pending();
  void join_pending();
  ~State();

  // Restores every key of the tracked objects that a restore newer than its
  // value holds. Every tensor is read and checked before any object changes
  // (an error leaves every object as it was), then read again, from the page
  // cache, into one buffer that each tensor reuses and assigned: a restore
  // holds one tensor's bytes beside the objects, never a second copy of the
  // state, and touches no fresh memory per tensor. Under several workers
  // each pass is agreed, so that an error on one worker is raised by all.
  struct Pending {
    Owned owned;
    Restore* from;
    const CheckpointEntry* entry;
    std::string dir;
  };
  void mark_restored(const Pending& p) {
    p.from->consumed.insert(p.owned.key);
    restored_by[p.owned.key] = p.from->id;
  }
  void move_datasets(const std::vector<std::pair<const Pending*, internal::DatasetPosition>>& datasets);

  void resolve() {
    if (restores.empty()) return;
    std::vector<Pending> pending;
    std::uint64_t largest = 0;
    for (Owned& o : owned(true)) {
      const auto done = restored_by.find(o.key);
      Restore* from = newest_with(o.key, done == restored_by.end() ? 0 : done->second);
      if (from == nullptr) continue;
      const CheckpointEntry* e = from->by_key.find(o.key)->second;
      largest = std::max(largest, e->size);
      pending.push_back({std::move(o), from, e, fmt::dirname_of(from->prefix)});
    }
    if (pending.empty()) return;
    // The buffer, as a tensor of each entry's dtype and shape in turn.
    std::shared_ptr<std::byte> buffer(new std::byte[std::max<std::uint64_t>(largest, 1)],
                                      std::default_delete<std::byte[]>());
    auto in_buffer = [&](const Pending& p) { return Tensor::from_shared(buffer, p.entry->dtype, p.entry->shape); };
    std::map<std::string, fmt::TensorReader> readers;  // one per directory: each shard opened once
    auto read = [&](const Pending& p) {
      readers.try_emplace(p.dir, p.dir).first->second.read_into(*p.entry, buffer.get());
    };
    std::vector<std::pair<const Pending*, internal::DatasetPosition>> datasets;
    agree(coordinator(), "Checkpoint.restore", [&] {
      for (const Pending& p : pending) {
        check_fits(p.owned, in_buffer(p), p.from->prefix);
        read(p);
        if (p.owned.kind != Owned::Kind::kDataset) continue;
        const internal::DatasetPosition at = position_of(in_buffer(p));
        const std::string why = internal::Access::why_not_restorable(*p.owned.dataset, at);
        if (!why.empty()) {
          throw FailedPreconditionError("Checkpoint.restore from " + p.from->prefix + ": dataset '" + p.owned.name +
                                        "' cannot take its saved position: " + why);
        }
        datasets.emplace_back(&p, at);
      }
      return std::string();
    });
    // Only bytes changed on disk since the first pass fail here (checked
    // again: bytes that do not match their CRC are never assigned).
    agree(coordinator(), "Checkpoint.restore", [&] {
      for (const Pending& p : pending) {
        if (p.owned.kind == Owned::Kind::kDataset) continue;
        read(p);
        assign(p.owned, in_buffer(p));
        mark_restored(p);
      }
      return std::string();
    });
    move_datasets(datasets);
  }
};

// Datasets last: their passes may be collectives of their own, and a
// source that no longer gives its saved batches is found only by drawing
// them (the other objects then hold the checkpoint's values).
void Checkpoint::State::move_datasets(
    const std::vector<std::pair<const Pending*, internal::DatasetPosition>>& datasets) {
  // A dataset tracked under two names moves once; a failure is not tried
  // again by a later track() (the key counts as restored).
  std::map<const DistributedDataset*, internal::DatasetPosition> moved;
  for (const auto& [p, at] : datasets) {
    mark_restored(*p);
    const std::string what = "Checkpoint.restore from " + p->from->prefix + ": dataset '" + p->owned.name + "'";
    agree(coordinator(), "Checkpoint.restore", [&, p = p, at = at] {
      const auto [it, fresh] = moved.try_emplace(p->owned.dataset, at);
      if (!fresh) {
        const internal::DatasetPosition& first = it->second;
        if (first.pass != at.pass || first.steps != at.steps || first.ended != at.ended) {
          throw FailedPreconditionError(what + " is tracked under another name too, with another saved position");
        }
        return std::string();
      }
      // (Each pass of a pipeline is a collective of its own, that every
      // worker makes here alike.)
      internal::Access::restore_dataset_passes(*p->owned.dataset, at);
      internal::Access::restore_dataset_steps(*p->owned.dataset, at, what);
      return std::string();
    });
  }
}

Checkpoint::Checkpoint() : state_(std::make_unique<State>()) {}

Checkpoint::Checkpoint(std::initializer_list<std::pair<std::string, Trackable>> objects) : Checkpoint() {
  // TF sets keyword arguments in sorted order.
  std::vector<const std::pair<std::string, Trackable>*> sorted;
  for (const auto& o : objects) sorted.push_back(&o);
  std::sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i]->first == sorted[i - 1]->first) {
      throw InvalidArgumentError("Checkpoint: two objects are named '" + sorted[i]->first + "'");
    }
  }
  for (const auto* o : sorted) track(o->first, o->second);
}

Checkpoint::~Checkpoint() {
  // TF's warning when values of a restore were never used.
  for (const auto& r : state_->restores) {
    if (r->expect_partial) continue;
    std::string lines;
    for (const CheckpointEntry& e : r->manifest.entries) {
      if (r->consumed.contains(e.key) || (!r->expects_save_counter && e.key == kSaveCounterKey)) continue;
      lines += "  Value in checkpoint could not be found in the restored object: " + pretty_key(e.key) + "\n";
    }
    if (!lines.empty()) {
      std::cerr << "distribute: a Checkpoint is being destroyed with unrestored values of " << r->prefix
                << ". To silence this warning, call expect_partial() on the status that restore() returned.\n"
                << lines << std::flush;
    }
  }
}

Checkpoint& Checkpoint::track(const std::string& name, Trackable object) {
  const std::string path = object_path(name);
  if (path == "save_counter") {
    throw InvalidArgumentError("Checkpoint: the name 'save_counter' is the checkpoint's own counter");
  }
  // As TF's `ckpt.name = object`: a name tracked already now names this object.
  const auto same = std::find_if(state_->objects.begin(), state_->objects.end(),
                                 [&](const State::Object& o) { return o.name == name; });
  if (same != state_->objects.end()) {
    same->object = std::move(object);
  } else {
    state_->objects.push_back({name, path, std::move(object)});
  }
  if (!state_->restores.empty()) {
    require_cross_replica("track");
    state_->resolve();
  }
  return *this;
}

std::string Checkpoint::save(const std::string& file_prefix, const CheckpointOptions& options) {
  require_cross_replica("save");
  state_->finish_pending();
  const std::int64_t before = state_->save_counter;
  const std::int64_t number = before + 1;
  state_->save_counter = number;
  std::string prefix = file_prefix + "-" + std::to_string(number);
  // As TF's Checkpoint.save: the index names this checkpoint alone.
  auto write_index = [prefix] {
    fmt::Index index;
    index.model_checkpoint_path = fmt::basename_of(prefix);
    index.all_model_checkpoint_paths = {index.model_checkpoint_path};
    index.all_model_checkpoint_timestamps = {wall_clock()};
    fmt::write_index(fmt::dirname_of(prefix), index);
    return std::string();
  };
  State* st = state_.get();
  state_->write(prefix, options, /*with_counter=*/true, write_index, nullptr,
                [st, before] { st->save_counter = before; });
  return prefix;
}

std::string Checkpoint::write(const std::string& file_prefix, const CheckpointOptions& options) {
  require_cross_replica("write");
  state_->finish_pending();
  state_->write(file_prefix, options, /*with_counter=*/false, nullptr, nullptr, nullptr);
  return file_prefix;
}

Strategy* Checkpoint::coordinator() const { return state_->coordinator(); }

void Checkpoint::before_write(const void* owner, std::function<void()> fn) {
  if (fn) {
    state_->before_write[owner] = std::move(fn);
  } else {
    state_->before_write.erase(owner);
  }
}

void Checkpoint::sync() {
  require_cross_replica("sync");
  state_->finish_pending();
}

// ---- the save protocol ---------------------------------------------------------
//
// docs/checkpoints.md, "Across workers": (1) the workers agree on what they
// save; (2) each tensor goes to one worker; (3) every worker writes and syncs
// its shard and the workers exchange what they wrote; (4) worker 0 commits
// the manifest (and the caller's index) once every shard is on disk. Any
// failure is raised by every worker and the torn files are removed.
//
// An asynchronous save does (1) and (2) on the caller's thread, with the
// values copied into host buffers that the next save reuses; its shard is
// written on a thread of its own. With one worker that thread also does (3)
// and (4) (exchanges with nobody). With several, (3) and (4) are collectives
// on the strategy's link, which the training uses meanwhile: they run on the
// caller's thread at the next save, sync() or restore.

struct Checkpoint::State::Save {
  std::string prefix;
  std::string dir;
  CheckpointOptions options;
  std::int64_t save_counter = 0;  // as the manifest records it
  std::string layout;             // as the manifest records it (read of the objects: the caller's thread)
  const void* owner = nullptr;    // the CheckpointManager whose save this is, if one
  Strategy* coord = nullptr;
  internal::WorkerPlace place;
  std::vector<fmt::ShardTensor> all;   // every value, in key order
  std::vector<fmt::ShardTensor> mine;  // this worker's share
  std::string shard_path;
  bool wrote = false;
  std::function<std::string()> after_commit;         // worker 0, once the manifest is in place
  std::function<void(const WriteResult&)> on_saved;  // the caller's bookkeeping (its thread)
  std::function<void()> on_failed;
  // Asynchronous saves.
  std::thread thread;
  std::string shard_info;       // (3)'s local part, done by the thread
  std::exception_ptr error;     // of the thread
  bool done_by_thread = false;  // one worker: the thread did (3) and (4)
  WriteResult result;
  internal::checkpoint_io::ThreadFaults faults;  // the caller's fault injection, carried to the thread

  // Only worker 0 knows whether the checkpoint committed: it takes its shard
  // back on a failure before the commit. Another worker whose exchange
  // fails cannot tell (worker 0 may have committed a manifest naming its
  // shard before the exchange broke), so it leaves its shard; the next
  // commit of this prefix, or its removal, takes what no manifest names.
  void remove_mine() const {
    if (wrote && place.rank == 0) ::unlink(shard_path.c_str());
  }
};

std::unique_ptr<Checkpoint::State::Save> Checkpoint::State::prepare(const std::string& prefix,
                                                                    const CheckpointOptions& options,
                                                                    bool with_counter) {
  State& st = *this;
  if (prefix.empty() || prefix.back() == '/') {
    throw InvalidArgumentError("Checkpoint: the file prefix '" + prefix + "' names no file");
  }
  auto save = std::make_unique<Save>();
  Save& sv = *save;
  sv.prefix = prefix;
  sv.dir = fmt::dirname_of(prefix);
  sv.options = options;
  sv.save_counter = st.save_counter;
  sv.layout = st.layout();
  sv.coord = st.coordinator();
  sv.place = sv.coord ? internal::worker_place(*sv.coord) : internal::WorkerPlace{};
  const bool copy = options.experimental_enable_async_checkpoint;

  // 1. The values, in key order on every worker (reading a SyncOnRead
  //    variable is a collective), and the workers' agreement on them.
  std::set<std::string, std::less<>> keys;
  for (const Owned& o : st.owned(with_counter)) {
    if (!Checkpoint::State::exists(o)) continue;
    if (!keys.insert(o.key).second) {
      throw InvalidArgumentError("Checkpoint: two objects save under the key '" + o.key + "'");
    }
  }
  std::vector<Owned> owned = st.owned(with_counter);
  std::sort(owned.begin(), owned.end(), [](const Owned& a, const Owned& b) { return a.key < b.key; });
  std::string digest;
  for (const Owned& o : owned) {
    if (!Checkpoint::State::exists(o)) continue;
    auto [value, full_name] = st.value_of(o);
    digest += o.key + ' ' + describe(value.dtype(), value.shape());
    if (o.kind == Owned::Kind::kDataset) {
      // Every worker's dataset is at one position (get_next is a collective).
      for (const std::int64_t x : value.flat<std::int64_t>()) digest += ' ' + std::to_string(x);
    }
    digest += '\n';
    if (copy) value = st.host_copy(o.key, value);
    sv.all.push_back({o.key, std::move(full_name), std::move(value)});
  }
  const std::vector<std::string> digests = agree(sv.coord, "Checkpoint.save", [&] {
    fmt::make_directories(sv.dir);
    return digest;
  });
  for (std::size_t w = 1; w < digests.size(); ++w) {
    if (digests[w] != digests[0]) {
      throw InvalidArgumentError(
          "Checkpoint.save of " + prefix + ": worker " + std::to_string(w) +
          " saves other tensors than worker 0 (every worker must track the same objects, and their datasets "
          "be at one position)");
    }
  }

  // 2. Each tensor is written once: the largest first, each to the worker
  //    with the fewest bytes so far (the same choice on every worker).
  std::vector<std::size_t> order(sv.all.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return sv.all[a].value.nbytes() > sv.all[b].value.nbytes(); });
  std::vector<std::uint64_t> load(static_cast<std::size_t>(sv.place.count), 0);
  std::vector<int> writer(sv.all.size(), 0);
  for (const std::size_t i : order) {
    const auto least = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    writer[i] = static_cast<int>(least);
    load[least] += sv.all[i].value.nbytes();
  }
  for (std::size_t i = 0; i < sv.all.size(); ++i) {
    if (writer[i] == sv.place.rank) sv.mine.push_back(sv.all[i]);
  }
  char shard_name[64];
  std::snprintf(shard_name, sizeof shard_name, ".data-%05d-of-%05d.", sv.place.rank, sv.place.count);
  sv.shard_path = fmt::join_path(sv.dir, fmt::basename_of(prefix) + shard_name + fmt::new_token() + ".safetensors");
  return save;
}

// A host buffer for `key` that the next asynchronous save reuses (fresh
// memory costs a page fault per 4 KiB on first touch), holding `value`'s bytes.
Tensor Checkpoint::State::host_copy(const std::string& key, const Tensor& value) {
  auto it = host_buffers.find(key);
  if (it == host_buffers.end() || it->second.dtype() != value.dtype() || it->second.shape() != value.shape()) {
    it = host_buffers.insert_or_assign(key, Tensor::uninitialized(value.dtype(), value.shape())).first;
  }
  if (value.nbytes() > 0) std::memcpy(it->second.mutable_raw_data(), value.raw_data(), value.nbytes());
  return it->second;
}

// (3)'s local part: this worker's shard, written and synced; what the
// manifest needs of it.
std::string Checkpoint::State::write_mine(Save& sv) {
  if (sv.mine.empty()) return std::string();
  sv.wrote = true;
  const std::vector<CheckpointEntry> entries = fmt::write_shard(sv.shard_path, sv.mine);
  struct stat s {};
  if (::stat(sv.shard_path.c_str(), &s) != 0) {
    internal::checkpoint_io::throw_io_error("stat", sv.shard_path, errno);
  }
  json j;
  j["file"] = fmt::basename_of(sv.shard_path);
  j["size"] = static_cast<std::uint64_t>(s.st_size);
  json tensors = json::array();
  for (const CheckpointEntry& e : entries) tensors.push_back({e.key, e.offset, e.size, e.crc32c});
  j["tensors"] = std::move(tensors);
  return j.dump();
}

// (3)'s exchange, with `local` as this worker's part, and (4).
WriteResult Checkpoint::State::exchange_and_commit(Save& sv, const std::function<std::string()>& local) {
  std::vector<std::string> shards;
  try {
    shards = agree(sv.coord, "Checkpoint.save", local);
  } catch (...) {
    sv.remove_mine();
    throw;
  }

  std::vector<std::string> committed;
  bool stands = false;  // worker 0: the manifest and the caller's index are in place
  try {
    committed = agree(sv.coord, "Checkpoint.save", [&]() -> std::string {
      if (sv.place.rank != 0) {
        internal::checkpoint_io::protocol_point("await the commit", sv.prefix);
        return "";
      }
      fmt::Manifest m;
      m.save_counter = sv.save_counter;
      m.step = sv.options.step;
      m.layout = sv.layout;
      m.written_at = wall_clock();
      std::map<std::string, const fmt::ShardTensor*, std::less<>> by_key;
      for (const fmt::ShardTensor& t : sv.all) by_key[t.key] = &t;
      for (std::size_t w = 0; w < shards.size(); ++w) {
        if (shards[w].empty()) continue;
        const json j = json::parse(shards[w]);
        m.shards.push_back({j.at("file").get<std::string>(), j.at("size").get<std::uint64_t>(), static_cast<int>(w)});
        for (const json& t : j.at("tensors")) {
          CheckpointEntry e;
          e.key = t.at(0).get<std::string>();
          const fmt::ShardTensor& value = *by_key.at(e.key);
          e.full_name = value.full_name;
          e.dtype = value.value.dtype();
          e.shape = value.value.shape();
          e.file = m.shards.back().file;
          e.offset = t.at(1).get<std::uint64_t>();
          e.size = t.at(2).get<std::uint64_t>();
          e.crc32c = t.at(3).get<std::uint32_t>();
          m.entries.push_back(std::move(e));
        }
      }
      std::sort(m.entries.begin(), m.entries.end(),
                [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.key < b.key; });
      fmt::commit_manifest(sv.prefix, m);
      std::string payload;
      try {
        if (sv.after_commit) payload = sv.after_commit();
      } catch (...) {
        // The checkpoint is whole but not recorded: take it back, so that
        // a failed save leaves nothing behind.
        try {
          fmt::remove_checkpoint(sv.prefix);
        } catch (const Error&) {
        }
        throw;
      }
      stands = true;
      // The shards of a checkpoint of this prefix that this one replaces,
      // and those of failed saves of it, go once it is in place.
      std::vector<std::string> named;
      for (const auto& shard : m.shards) named.push_back(shard.file);
      fmt::remove_unnamed_shards(sv.prefix, named);
      return payload;
    });
  } catch (...) {
    // Worker 0 committed and then lost the others (a worker killed while it
    // awaited the outcome): the checkpoint is whole and stays; the error is
    // the lost worker's.
    if (!stands) sv.remove_mine();
    throw;
  }
  return {committed.empty() ? std::string() : committed[0]};
}

void Checkpoint::State::write(const std::string& prefix, const CheckpointOptions& options, bool with_counter,
                              std::function<std::string()> after_commit,
                              std::function<void(const WriteResult&)> on_saved, std::function<void()> on_failed) {
  std::unique_ptr<Save> save;
  try {
    for (const auto& [owner, fn] : before_write) fn();
    save = prepare(prefix, options, with_counter);
  } catch (...) {
    if (on_failed) on_failed();
    throw;
  }
  Save& sv = *save;
  sv.after_commit = std::move(after_commit);
  sv.on_saved = std::move(on_saved);
  sv.on_failed = std::move(on_failed);
  if (!options.experimental_enable_async_checkpoint) {
    WriteResult result;
    try {
      result = exchange_and_commit(sv, [&] { return write_mine(sv); });
    } catch (...) {
      if (sv.on_failed) sv.on_failed();
      throw;
    }
    if (sv.on_saved) sv.on_saved(result);
    return;
  }
  // The thread counts its file operations as the caller's (fault injection).
  sv.faults = internal::checkpoint_io::take_thread_faults();
  sv.thread = std::thread([&sv] {
    internal::checkpoint_io::put_thread_faults(sv.faults);
    try {
      if (sv.coord == nullptr) {
        sv.result = exchange_and_commit(sv, [&] { return write_mine(sv); });
        sv.done_by_thread = true;
      } else {
        sv.shard_info = write_mine(sv);
      }
    } catch (...) {
      sv.error = std::current_exception();
    }
    sv.faults = internal::checkpoint_io::take_thread_faults();
  });
  in_flight = std::move(save);
}

Checkpoint::State::~State() {
  if (!in_flight) return;
  join_pending();
  // Nothing can be raised from here: say what became of the save.
  if (!in_flight->done_by_thread) {
    std::cerr << "distribute: a Checkpoint is destroyed with its asynchronous save of " << in_flight->prefix
              << (in_flight->coord ? " not committed (several workers commit at sync(); call it before)" : " failed")
              << "\n"
              << std::flush;
    in_flight->remove_mine();
  }
}

void Checkpoint::State::join_pending() {
  if (!in_flight || !in_flight->thread.joinable()) return;
  in_flight->thread.join();
  internal::checkpoint_io::put_thread_faults(in_flight->faults);
}

void Checkpoint::State::finish_pending() {
  if (!in_flight) return;
  join_pending();
  std::unique_ptr<Save> save = std::move(in_flight);
  Save& sv = *save;
  try {
    if (!sv.done_by_thread) {
      if (sv.coord == nullptr) std::rethrow_exception(sv.error);
      // Several workers: the exchange and the commit, on this thread; a
      // worker whose write failed passes its error to every worker.
      sv.result = exchange_and_commit(sv, [&] {
        if (sv.error) std::rethrow_exception(sv.error);
        return sv.shard_info;
      });
    }
  } catch (...) {
    if (sv.on_failed) sv.on_failed();
    throw;
  }
  if (sv.on_saved) sv.on_saved(sv.result);
}

CheckpointLoadStatus Checkpoint::restore(const std::string& save_path) {
  require_cross_replica("restore");
  return load(save_path, /*expects_save_counter=*/true);
}

CheckpointLoadStatus Checkpoint::read(const std::string& save_path) {
  require_cross_replica("read");
  // As restore, without the save counter (write() saves none).
  return load(save_path, /*expects_save_counter=*/false);
}

CheckpointLoadStatus Checkpoint::load(const std::string& save_path, bool expects_save_counter) {
  state_->finish_pending();  // a save in flight first: it may be the one to restore
  std::string prefix = save_path;
  struct stat s {};
  if (::stat(save_path.c_str(), &s) == 0 && S_ISDIR(s.st_mode)) {
    const auto latest = latest_checkpoint(save_path);
    if (!latest) {
      throw NotFoundError("Error when restoring from checkpoint at " + save_path +
                          ": the directory holds no checkpoint");
    }
    prefix = *latest;
  }
  auto r = std::make_unique<State::Restore>();
  r->prefix = prefix;
  r->expects_save_counter = expects_save_counter;
  agree(state_->coordinator(), "Checkpoint.restore", [&] {
    r->manifest = fmt::read_manifest(prefix);
    return std::string();
  });
  for (const CheckpointEntry& e : r->manifest.entries) r->by_key.emplace(e.key, &e);
  r->id = state_->next_restore_id++;
  const std::uint64_t id = r->id;
  state_->restores.push_back(std::move(r));
  try {
    state_->resolve();
  } catch (...) {
    state_->restores.pop_back();
    throw;
  }
  return {this, id};
}

std::optional<Tensor> Checkpoint::initial_value(const std::string& name) const {
  const std::string key = object_path(name) + std::string(kValueSuffix);
  State::Restore* r = state_->newest_with(key, 0);
  if (r == nullptr) return std::nullopt;
  Tensor t = fmt::read_tensor(fmt::dirname_of(r->prefix), *r->by_key.find(key)->second);
  // The variable made from it holds this restore's value: tracking it later
  // restores nothing again (TF stamps it with the restore's uid).
  r->consumed.insert(key);
  state_->restored_by[key] = r->id;
  return t;
}

std::int64_t Checkpoint::save_counter() const { return state_->save_counter; }

// ---- CheckpointLoadStatus -----------------------------------------------------

namespace {

std::string listed(const std::vector<std::string>& names) {
  std::string out = "[";
  const std::size_t shown = std::min<std::size_t>(names.size(), 10);
  for (std::size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + names[i];
  return out + (shown < names.size() ? ", ...]" : "]");
}

}  // namespace

CheckpointLoadStatus& CheckpointLoadStatus::assert_existing_objects_matched() {
  Checkpoint::State& st = *checkpoint_->state_;
  const auto r = std::find_if(st.restores.begin(), st.restores.end(), [&](const auto& x) { return x->id == id_; });
  if (r == st.restores.end()) throw FailedPreconditionError("CheckpointLoadStatus: its restore failed");
  std::vector<std::string> unmatched;
  for (const Owned& o : st.owned((*r)->expects_save_counter)) {
    if (!Checkpoint::State::exists(o)) continue;
    const auto done = st.restored_by.find(o.key);
    if (done == st.restored_by.end() || done->second < id_) unmatched.push_back(pretty_key(o.key));
  }
  if (!unmatched.empty()) {
    throw FailedPreconditionError("Found " + std::to_string(unmatched.size()) +
                                  " objects that were not bound to checkpointed values in " + (*r)->prefix +
                                  ", likely due to changes in the program. Showing " +
                                  std::to_string(std::min<std::size_t>(unmatched.size(), 10)) + " of " +
                                  std::to_string(unmatched.size()) + " unmatched objects: " + listed(unmatched));
  }
  return *this;
}

CheckpointLoadStatus& CheckpointLoadStatus::assert_consumed() {
  assert_existing_objects_matched();
  Checkpoint::State& st = *checkpoint_->state_;
  const auto r = std::find_if(st.restores.begin(), st.restores.end(), [&](const auto& x) { return x->id == id_; });
  std::vector<std::string> unresolved;
  for (const CheckpointEntry& e : (*r)->manifest.entries) {
    if ((*r)->consumed.contains(e.key)) continue;
    if (!(*r)->expects_save_counter && e.key == kSaveCounterKey) continue;
    unresolved.push_back(pretty_key(e.key) + " ('" + e.key + "')");
  }
  if (!unresolved.empty()) {
    throw FailedPreconditionError("Unresolved objects in checkpoint " + (*r)->prefix + ": " +
                                  std::to_string(unresolved.size()) +
                                  " values were not restored into any object: " + listed(unresolved));
  }
  return *this;
}

CheckpointLoadStatus& CheckpointLoadStatus::assert_nontrivial_match() {
  Checkpoint::State& st = *checkpoint_->state_;
  const auto r = std::find_if(st.restores.begin(), st.restores.end(), [&](const auto& x) { return x->id == id_; });
  if (r == st.restores.end()) throw FailedPreconditionError("CheckpointLoadStatus: its restore failed");
  for (const std::string& key : (*r)->consumed) {
    if (key != kSaveCounterKey) return *this;
  }
  std::vector<std::string> objects;
  for (const Owned& o : st.owned(false)) {
    if (Checkpoint::State::exists(o)) objects.push_back(pretty_key(o.key));
  }
  if (objects.empty()) {
    throw FailedPreconditionError("Nothing to load from " + (*r)->prefix +
                                  ". No dependencies have been added to the Checkpoint yet.");
  }
  throw FailedPreconditionError("Nothing except the root object matched a checkpointed value in " + (*r)->prefix +
                                ". Typically this means that the checkpoint does not match the program. The "
                                "following objects have no matching checkpointed value: " +
                                listed(objects));
}

CheckpointLoadStatus& CheckpointLoadStatus::expect_partial() {
  Checkpoint::State& st = *checkpoint_->state_;
  for (const auto& r : st.restores) {
    if (r->id == id_) r->expect_partial = true;
  }
  return *this;
}

// ---- CheckpointReader ---------------------------------------------------------

struct CheckpointReader::State {
  std::string prefix;
  std::string dir;
  fmt::Manifest manifest;
};

CheckpointReader::CheckpointReader(const std::string& path) : state_(std::make_unique<State>()) {
  std::string prefix = path;
  struct stat s {};
  if (::stat(path.c_str(), &s) == 0 && S_ISDIR(s.st_mode)) {
    const auto latest = latest_checkpoint(path);
    if (!latest) throw NotFoundError("CheckpointReader: the directory '" + path + "' holds no checkpoint");
    prefix = *latest;
  }
  state_->prefix = prefix;
  state_->dir = fmt::dirname_of(prefix);
  state_->manifest = fmt::read_manifest(prefix);
}

CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;

const std::string& CheckpointReader::prefix() const { return state_->prefix; }
const std::vector<CheckpointEntry>& CheckpointReader::entries() const { return state_->manifest.entries; }

bool CheckpointReader::has_tensor(std::string_view key) const {
  const auto& e = state_->manifest.entries;
  return std::any_of(e.begin(), e.end(), [&](const CheckpointEntry& x) { return x.key == key; });
}

const CheckpointEntry& CheckpointReader::entry(std::string_view key) const {
  for (const CheckpointEntry& e : state_->manifest.entries) {
    if (e.key == key) return e;
  }
  throw NotFoundError("Key " + std::string(key) + " not found in checkpoint " + state_->prefix);
}

Tensor CheckpointReader::get_tensor(std::string_view key) const { return fmt::read_tensor(state_->dir, entry(key)); }

std::vector<std::string> CheckpointReader::verify() const {
  std::vector<std::string> problems;
  for (const auto& shard : state_->manifest.shards) {
    if (std::string p = fmt::check_shard(state_->dir, shard, state_->manifest.entries); !p.empty()) {
      problems.push_back(std::move(p));
    }
  }
  fmt::TensorReader reader(state_->dir);
  for (const CheckpointEntry& e : state_->manifest.entries) {
    try {
      reader.read(e);
    } catch (const Error& err) {
      problems.push_back(err.message());
    }
  }
  return problems;
}

std::optional<std::int64_t> CheckpointReader::step() const { return state_->manifest.step; }
std::int64_t CheckpointReader::save_counter() const { return state_->manifest.save_counter; }
const std::string& CheckpointReader::layout() const { return state_->manifest.layout; }

// ---- latest_checkpoint ----------------------------------------------------------

std::optional<std::string> latest_checkpoint(const std::string& directory) {
  const auto index = fmt::read_index(directory);
  if (!index) return std::nullopt;
  auto whole = [&](const std::string& name) {
    return internal::checkpoint_io::file_exists(fmt::join_path(directory, name) + std::string(fmt::kManifestSuffix));
  };
  if (!index->model_checkpoint_path.empty() && whole(index->model_checkpoint_path)) {
    return fmt::join_path(directory, index->model_checkpoint_path);
  }
  // The newest listed one that is whole (files removed by hand, or a crash
  // between a sweep's removal and the index that follows it).
  for (auto it = index->all_model_checkpoint_paths.rbegin(); it != index->all_model_checkpoint_paths.rend(); ++it) {
    if (whole(*it)) {
      std::cerr << "distribute: checkpoint " << fmt::join_path(directory, index->model_checkpoint_path)
                << " is missing; the latest whole one is " << fmt::join_path(directory, *it) << "\n"
                << std::flush;
      return fmt::join_path(directory, *it);
    }
  }
  return std::nullopt;
}

// ---- CheckpointManager ------------------------------------------------------------

struct CheckpointManager::State {
  Checkpoint* checkpoint = nullptr;
  std::string directory;
  std::optional<int> max_to_keep;
  CheckpointManagerOptions options;
  std::vector<std::string> checkpoints;  // full paths, oldest first
  std::vector<double> timestamps;
  double last_preserved = 0;
  std::optional<std::string> latest;
  std::optional<std::int64_t> last_save_step;
  int lock_fd = -1;

  double now() const { return options.clock ? options.clock() : wall_clock(); }

  std::int64_t step() const {
    const Tensor t = options.step_counter->read_value();
    if (t.num_elements() != 1) {
      throw InvalidArgumentError("CheckpointManager: step_counter '" + options.step_counter->name() +
                                 "' is not a scalar: " + describe(t.dtype(), t.shape()));
    }
    return static_cast<std::int64_t>(t.element_as_double(0));
  }

  fmt::Index index() const {
    fmt::Index index;
    if (latest) index.model_checkpoint_path = fmt::basename_of(*latest);
    for (const std::string& p : checkpoints) index.all_model_checkpoint_paths.push_back(fmt::basename_of(p));
    index.all_model_checkpoint_timestamps = timestamps;
    index.last_preserved_timestamp = last_preserved;
    return index;
  }
};

namespace {

// Holds `dir`'s lock for the manager's life (flock: released when the
// process dies, however it dies). Returns the descriptor.
int lock_directory(const std::string& dir) {
  const std::string path = fmt::join_path(dir, ".checkpoint.lock");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) internal::checkpoint_io::throw_io_error("CheckpointManager: open", path, errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char holder[256] = {};
    const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
    ::close(fd);
    throw FailedPreconditionError("CheckpointManager: the directory '" + dir +
                                  "' is in use by another CheckpointManager (" +
                                  (n > 0 ? std::string(holder, static_cast<std::size_t>(n)) : std::string("?")) +
                                  "): two jobs saving into one directory would mix their checkpoints");
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = "pid " + std::to_string(::getpid()) + " on " + host;
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) < 0) {
    // Only the message of a refused manager would miss it.
  }
  return fd;
}

// Creates and removes a file in `dir`: an unwritable directory is refused
// before training starts, not at the first save.
void probe_writable(const std::string& dir) {
  const std::string path = fmt::join_path(dir, ".probe-" + fmt::new_token());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    internal::checkpoint_io::throw_io_error("CheckpointManager: the checkpoint directory is not writable: create", path,
                                            errno);
  }
  ::close(fd);
  ::unlink(path.c_str());
}

}  // namespace

CheckpointManager::CheckpointManager(Checkpoint& checkpoint, std::string directory, std::optional<int> max_to_keep,
                                     CheckpointManagerOptions options)
    : state_(std::make_unique<State>()) {
  require_cross_replica("CheckpointManager");
  State& st = *state_;
  if (max_to_keep && *max_to_keep <= 0) {
    throw InvalidArgumentError("Expected a positive integer or `None` for `max_to_keep`, got " +
                               std::to_string(*max_to_keep) + ".");
  }
  if (options.checkpoint_interval && !options.step_counter) {
    throw InvalidArgumentError("`step_counter` should be passed if `checkpoint_interval` is not None.");
  }
  if (options.checkpoint_interval && *options.checkpoint_interval <= 0) {
    throw InvalidArgumentError("CheckpointManager: checkpoint_interval must be positive, got " +
                               std::to_string(*options.checkpoint_interval));
  }
  if (options.keep_checkpoint_every_n_hours && !(*options.keep_checkpoint_every_n_hours > 0)) {
    throw InvalidArgumentError("CheckpointManager: keep_checkpoint_every_n_hours must be positive");
  }
  if (directory.empty()) throw InvalidArgumentError("CheckpointManager: the directory is empty");
  object_path(options.checkpoint_name);  // a name without empty parts
  st.checkpoint = &checkpoint;
  st.directory = std::move(directory);
  st.max_to_keep = max_to_keep;
  st.options = std::move(options);
  Strategy* coord = checkpoint.state_->coordinator();
  const bool chief = coord == nullptr || internal::worker_place(*coord).rank == 0;
  agree(coord, "CheckpointManager", [&] {
    fmt::make_directories(st.directory);
    probe_writable(st.directory);
    if (chief) st.lock_fd = lock_directory(st.directory);
    return std::string();
  });
  const double now = st.now();
  const auto index = fmt::read_index(st.directory);
  st.last_preserved = index && index->last_preserved_timestamp ? *index->last_preserved_timestamp : now - 1;
  if (st.last_preserved > now) {
    std::cerr << "distribute: CheckpointManager: the clock is " << (st.last_preserved - now)
              << " seconds behind the last preserved checkpoint's timestamp\n"
              << std::flush;
    st.last_preserved = now;
  }
  if (index) {
    for (std::size_t i = 0; i < index->all_model_checkpoint_paths.size(); ++i) {
      const double t = std::min(index->all_model_checkpoint_timestamps[i], now);
      if (t > st.last_preserved) {
        st.checkpoints.push_back(fmt::join_path(st.directory, index->all_model_checkpoint_paths[i]));
        st.timestamps.push_back(t);
      }
    }
  }
  st.latest = train::latest_checkpoint(st.directory);
}

CheckpointManager::~CheckpointManager() {
  // An asynchronous save of this manager's: its thread ends before the
  // directory's lock goes; what it records is no longer this manager's.
  if (Checkpoint::State& ck = *state_->checkpoint->state_; ck.in_flight && ck.in_flight->owner == this) {
    ck.join_pending();
    ck.in_flight->on_saved = nullptr;
  }
  if (state_->lock_fd >= 0) ::close(state_->lock_fd);
}

void CheckpointManager::sync() {
  require_cross_replica("CheckpointManager.sync");
  state_->checkpoint->state_->finish_pending();
}

std::optional<std::string> CheckpointManager::save(std::optional<std::int64_t> checkpoint_number, bool check_interval,
                                                   const CheckpointOptions& options) {
  require_cross_replica("CheckpointManager.save");
  State& st = *state_;
  Checkpoint::State& ck = *st.checkpoint->state_;
  ck.finish_pending();  // the save before, recorded (or its error raised) first
  std::optional<std::int64_t> step;
  if (st.options.step_counter) step = st.step();
  if (st.options.checkpoint_interval) {
    if (st.last_save_step && *step == *st.last_save_step) return std::nullopt;
    if (check_interval && st.last_save_step && *step < *st.last_save_step + *st.options.checkpoint_interval) {
      return std::nullopt;
    }
  }
  const std::int64_t before = ck.save_counter;
  ck.save_counter = before + 1;
  const std::int64_t number = checkpoint_number ? *checkpoint_number : ck.save_counter;
  const std::string prefix = fmt::join_path(st.directory, st.options.checkpoint_name + "-" + std::to_string(number));
  // The new lists (worker 0's decision, applied on every worker), made now:
  // the commit may run on another thread, after this call.
  State view;
  view.latest = prefix;
  view.checkpoints = st.checkpoints;
  view.timestamps = st.timestamps;
  view.last_preserved = st.last_preserved;
  for (std::size_t i = 0; i < view.checkpoints.size(); ++i) {
    if (view.checkpoints[i] == prefix) {
      view.checkpoints.erase(view.checkpoints.begin() + static_cast<std::ptrdiff_t>(i));
      view.timestamps.erase(view.timestamps.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
  view.checkpoints.push_back(prefix);
  view.timestamps.push_back(st.now());
  auto after_commit = [view = std::move(view), prefix, directory = st.directory, max_to_keep = st.max_to_keep,
                       hours = st.options.keep_checkpoint_every_n_hours]() mutable {
    // The index names the new checkpoint before anything is swept; then
    // the sweep; then the index again (TF's order).
    fmt::write_index(directory, view.index());
    // The save stands from here: a failure of the sweep is said, not
    // raised (what it could not remove stays on disk, outside the index).
    try {
      bool swept = false;
      while (max_to_keep && view.checkpoints.size() > static_cast<std::size_t>(*max_to_keep)) {
        const std::string oldest = view.checkpoints.front();
        const double t = view.timestamps.front();
        view.checkpoints.erase(view.checkpoints.begin());
        view.timestamps.erase(view.timestamps.begin());
        swept = true;
        if (hours && t - *hours * 3600 >= view.last_preserved) {
          view.last_preserved = t;  // kept, and no longer managed
          continue;
        }
        fmt::remove_checkpoint(oldest);
      }
      if (swept) fmt::write_index(directory, view.index());
    } catch (const Error& e) {
      std::cerr << "distribute: CheckpointManager: " << prefix
                << " is saved, but removing older checkpoints failed: " << e.message() << "\n"
                << std::flush;
    }
    json j;
    j["paths"] = view.checkpoints;
    j["times"] = view.timestamps;
    j["last_preserved"] = view.last_preserved;
    return j.dump();
  };
  auto on_saved = [&st, prefix, step](const WriteResult& result) {
    const json j = json::parse(result.commit_payload);
    st.checkpoints = j["paths"].get<std::vector<std::string>>();
    st.timestamps = j["times"].get<std::vector<double>>();
    st.last_preserved = j["last_preserved"].get<double>();
    st.latest = prefix;
    if (st.options.checkpoint_interval) st.last_save_step = step;
  };
  CheckpointOptions with_step = options;
  with_step.step = step;
  ck.write(prefix, with_step, /*with_counter=*/true, std::move(after_commit), std::move(on_saved),
           [&ck, before] { ck.save_counter = before; });
  if (ck.in_flight) ck.in_flight->owner = this;
  return prefix;
}

std::optional<std::string> CheckpointManager::latest_checkpoint() const { return state_->latest; }
const std::vector<std::string>& CheckpointManager::checkpoints() const { return state_->checkpoints; }
const std::string& CheckpointManager::directory() const { return state_->directory; }
Checkpoint& CheckpointManager::checkpoint() const { return *state_->checkpoint; }

std::optional<std::string> CheckpointManager::restore_or_initialize() {
  State& st = *state_;
  st.checkpoint->state_->finish_pending();
  if (st.latest) {
    st.checkpoint->restore(*st.latest);
    if (st.options.checkpoint_interval) st.last_save_step = st.step();
    return st.latest;
  }
  if (st.options.init_fn) st.options.init_fn();
  return std::nullopt;
}

}  // namespace train
}  // namespace distribute
