#include "distribute/mirrored_strategy.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>

#include "core/ascii_case.h"
#include "core/device_registry.h"
#include "core/host_cpus.h"
#include "core/payload_list.h"
#include "core/recent_answers.h"
#include "distribute/multi_worker_mirrored_strategy.h"
#include "runtime/runtime_util.h"

namespace distribute {
namespace {

bool parse_index(std::string_view text, int& out) {
  if (text.empty() || text.size() > 9) return false;
  int v = 0;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    v = v * 10 + (c - '0');
  }
  out = v;
  return true;
}

// GPU names parse, and a GPU that is not there is named with those that
// are; replicas and tensors are not placed on GPUs yet.
[[noreturn]] void refuse_gpu(const std::string& original, int index, bool local) {
  std::string gpu = "a GPU of another worker";
  if (local) {
    gpu = internal::device_registry().describe_gpu(index, original);  // InvalidArgumentError if there is no such GPU
  }
  throw UnimplementedError("device '" + original + "' is " + gpu +
                           ": this version of distribute lists and configures GPUs (devices.h) but does not yet "
                           "place replicas or tensors on them; use CPU devices (\"CPU:0\", \"CPU:1\", ...)");
}

}  // namespace

namespace {
std::string parse_device_name(std::string_view device);
}  // namespace

std::string canonical_device_name(std::string_view device) {
  // The last names this thread asked about are answered without parsing.
  thread_local internal::RecentAnswers<std::string> recent;
  return recent.get(device, parse_device_name);
}

namespace {
std::string parse_device_name(std::string_view device) {
  const std::string original(device);
  auto bad = [&](const std::string& why) -> std::string {
    throw InvalidArgumentError("device '" + original + "': " + why +
                               ". Expected a CPU device such as \"CPU:0\", \"/cpu:1\" or "
                               "\"/job:localhost/replica:0/task:0/device:CPU:2\"");
  };
  std::string type;
  std::string job = "localhost";
  int task = 0;
  int index = -1;
  std::size_t pos = 0;
  while (pos <= device.size()) {
    std::size_t next = device.find('/', pos);
    if (next == std::string_view::npos) next = device.size();
    const std::string_view part = device.substr(pos, next - pos);
    pos = next + 1;
    if (part.empty()) continue;
    const std::size_t colon = part.find(':');
    if (colon == std::string_view::npos) return bad("'" + std::string(part) + "' is not a field of a device name");
    const std::string key = internal::ascii_lower(part.substr(0, colon));
    std::string_view rest = part.substr(colon + 1);
    int n = 0;
    if (key == "job") {
      if (rest != "localhost" && rest != "worker") {
        throw InvalidArgumentError("device '" + original + "': unknown job '" + std::string(rest) +
                                   "'; devices belong to job 'localhost' (this process) or 'worker' (a worker of "
                                   "MultiWorkerMirroredStrategy)");
      }
      job = std::string(rest);
    } else if (key == "replica" || key == "task") {
      if (!parse_index(rest, n)) return bad("bad " + key + " number");
      if (key == "task") task = n;
      if (n != 0 && key == "replica") {
        throw InvalidArgumentError("device '" + original + "': replica " + std::to_string(n) +
                                   " is another process; only replica:0 exists");
      }
    } else {
      std::string dev_type = key;
      if (key == "device") {
        const std::size_t c2 = rest.find(':');
        if (c2 == std::string_view::npos) return bad("'device:' needs TYPE:INDEX");
        dev_type = internal::ascii_lower(rest.substr(0, c2));
        rest = rest.substr(c2 + 1);
      }
      if (!parse_index(rest, n)) return bad("'" + std::string(rest) + "' is not a device index");
      if (dev_type != "cpu" && dev_type != "gpu") return bad("unknown device type '" + dev_type + "'");
      type = dev_type == "gpu" ? "GPU" : "CPU";
      index = n;
    }
  }
  if (type.empty()) return bad("no device type and index");
  if (job == "localhost" && task != 0) {
    throw InvalidArgumentError("device '" + original + "': task " + std::to_string(task) +
                               " is another process; only task:0 of job 'localhost' is local");
  }
  if (type == "GPU") refuse_gpu(original, index, job == "localhost");
  return "/job:" + job + "/replica:0/task:" + std::to_string(task) + "/device:" + type + ":" + std::to_string(index);
}
}  // namespace

namespace {
std::vector<std::string> canonical_devices(const std::vector<std::string>& devices) {
  if (devices.empty()) {
    throw InvalidArgumentError("Got an empty `devices` list and unable to recognize any local devices.");
  }
  std::vector<std::string> out;
  for (const auto& d : devices) {
    out.push_back(canonical_device_name(d));
    if (out.back().rfind("/job:localhost/", 0) != 0) {
      throw InvalidArgumentError("device '" + d +
                                 "' is a device of another worker; a strategy's devices are this process's own "
                                 "(\"CPU:0\", ...). MultiWorkerMirroredStrategy names the other workers' devices "
                                 "itself");
    }
  }
  std::vector<std::string> sorted = out;
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end()) {
    std::string list;
    for (const auto& d : devices) list += (list.empty() ? "" : ", ") + d;
    throw InvalidArgumentError("No duplicates allowed in `devices` argument: [" + list + "] names " + *dup + " twice");
  }
  return out;
}

std::vector<std::string> all_cpus() {
  const int n = internal::usable_cpus();  // the CPUs this process may use (taskset, a container's cpuset)
  std::vector<std::string> devices;
  devices.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) devices.push_back("CPU:" + std::to_string(i));
  return devices;
}
}  // namespace

DefaultStrategy::DefaultStrategy() : Strategy({std::string(kHostDevice)}, 1, 0, {}, /*checks_settings=*/false) {}

Strategy& default_strategy() {
  static DefaultStrategy* instance = new DefaultStrategy();  // never destroyed: threads may use it at exit
  return *instance;
}

bool is_default_strategy(const Strategy& s) { return &s == &default_strategy(); }

OneDeviceStrategy::OneDeviceStrategy(const std::string& device, CommunicationOptions options)
    : Strategy({canonical_device_name(device)}, 1, 0, options) {}

MirroredStrategy::MirroredStrategy() : MirroredStrategy(all_cpus()) {}

MirroredStrategy::MirroredStrategy(const std::vector<std::string>& devices, CommunicationOptions options)
    : Strategy(canonical_devices(devices), static_cast<int>(devices.size()), 0, options) {}

// ---- MultiWorkerMirroredStrategy -----------------------------------------------

namespace internal {
struct ClusterSetup {
  CommunicationOptions options;
  std::vector<std::string> devices;
  std::shared_ptr<Communicator> workers;  // null with one worker
  int rank = 0;
  int size = 1;
  // What this worker's own checks raised: brought to the meeting, then raised.
  std::exception_ptr error;
  bool met = false;  // the workers have met (once, in the strategy's constructor)
};

namespace {
// What this worker brings to the meeting: "R<local replicas>", or
// "E<code>:<message>" for the error its own creation raised.
std::string meeting_payload(std::size_t local_replicas, const std::exception_ptr& local_error) {
  if (local_error) {
    try {
      std::rethrow_exception(local_error);
    } catch (const Error& e) {
      return "E" + std::to_string(static_cast<int>(e.code())) + ":" + e.message();
    } catch (...) {  // not one of ours (std::bad_alloc, ...): an internal error to the others
      return "E" + std::to_string(static_cast<int>(ErrorCode::kInternal)) + ":" + describe_exception(local_error);
    }
  } else {
    return "R" + std::to_string(local_replicas);
  }
}

// Raises the first worker's error that `all` (every worker's payload, in
// rank order) holds, or a mismatch if the workers run different numbers of
// local replicas.
void check_meeting_replies(const std::vector<std::string>& all) {
  std::string list;
  bool differ = false;
  for (std::size_t w = 0; w < all.size(); ++w) {
    const std::string& m = all[w];
    if (!m.empty() && m[0] == 'E') {
      // "E<code>:<message>"; the message may hold colons of its own.
      const std::size_t colon = m.find(':');
      int peer_code = static_cast<int>(ErrorCode::kInternal);
      if (colon != std::string::npos) std::from_chars(m.data() + 1, m.data() + colon, peer_code);
      throw_error(static_cast<ErrorCode>(peer_code),
                  "MultiWorkerMirroredStrategy: worker " + std::to_string(w) +
                      " could not create its strategy: " + (colon == std::string::npos ? m : m.substr(colon + 1)));
    }
    differ |= m != all[0];
    list += (w ? ", " : "") + std::string("worker ") + std::to_string(w) + ": " + m.substr(1);
  }
  if (differ) {
    throw InvalidArgumentError(
        "MultiWorkerMirroredStrategy: every worker must run the same number of local replicas, but they run " + list);
  }
}

// The workers meet once, when they create the strategy: each brings its
// number of local replicas, or the error that its own creation raised (bad
// devices, options or settings; no thread for a replica), so that one
// worker's failure fails every worker at once instead of leaving the others
// waiting for it.
// `met` turns true just before the exchange: a failure before it (out of
// memory building the payload) leaves the meeting to the caller's handler.
void meet_the_workers(Communicator& workers, std::size_t local_replicas, const CommunicationOptions& options,
                      const std::exception_ptr& local_error, bool& met) {
  std::string payload = meeting_payload(local_replicas, local_error);
  constexpr std::string_view kMeeting = "MultiWorkerMirroredStrategy()";
  CollectiveCall call;
  call.op = kMeeting;
  call.sequence = 0;
  // A session of the workers' link begins here: a worker that destroyed its
  // last strategy just before is where it should be.
  call.starts_session = true;
  // Tagged like any collective, so that a worker still in a collective of a
  // strategy of its own meets a mismatch here, not a payload it misreads.
  Signature meeting;
  meeting.op = std::string(kMeeting);
  call.signature_tag = meeting.tag(/*with_leaves=*/false);
  if (options.timeout && options.timeout->count() >= 0) {  // (a NaN fails this too)
    call.timeout_seconds = options.timeout->count();       // 0: wait for ever, as the options say
  } else {
    // No timeout in the options, or an invalid one (this worker's own error,
    // which it raises after the meeting): the environment's, if it has one.
    try {
      call.timeout_seconds = env_seconds("DISTRIBUTE_COLLECTIVE_TIMEOUT");
    } catch (const Error&) {
      // This worker's own error too: it waits for the others without one.
    }
  }
  std::vector<std::string> all;
  try {
    met = true;
    try {
      all = workers.exchange(std::move(payload), call);
    } catch (const SignatureMismatch&) {
      // Another worker is in a collective of a strategy it still has (this
      // worker made a new one early): say which call this is, as that
      // collective does after a mismatch (one signature per local replica),
      // and raise what the check finds on every worker (a collective
      // mismatch, naming the replicas in each call).
      call.signature_tag = 0;
      const std::vector<std::string> explained = workers.exchange(
          encode_payload_list(std::vector<std::string>(std::max<std::size_t>(local_replicas, 1), meeting.encode())),
          call);
      std::vector<Signature> sigs;
      for (const std::string& p : explained) {
        for (const std::string& one : decode_payload_list(p)) sigs.push_back(Signature::decode(one));
      }
      check_signatures(sigs, 0, ShapeRule::kEqual, 0, nullptr);
      throw InternalError(std::string(kMeeting) + ": the workers' tags differ but their calls agree");
    }
  } catch (...) {
    if (local_error) std::rethrow_exception(local_error);  // the cause, rather than its echo
    throw;
  }
  if (local_error) std::rethrow_exception(local_error);
  check_meeting_replies(all);
}

// `local_devices` gives this worker's devices (it may throw: a bad count).
// What the strategy's creation would check is checked here, and a failure
// kept in `error`, for the constructor to bring to the workers' meeting.
ClusterSetup make_cluster_setup(const std::function<std::vector<std::string>()>& local_devices,
                                std::shared_ptr<Communicator> workers, CommunicationOptions options) {
  ClusterSetup setup;
  if (workers != nullptr && workers->size() > 1) {
    setup.rank = workers->rank();
    setup.size = workers->size();
    setup.workers = std::move(workers);
  }
  try {
    setup.devices = canonical_devices(local_devices());
    options.validate();
    checked_engine_settings();
    if (!options.timeout) env_seconds("DISTRIBUTE_COLLECTIVE_TIMEOUT");
    env_seconds("DISTRIBUTE_STALL_WARNING_SECONDS");
    if (setup.size > 1) {
      // TensorFlow's names for the devices of worker task k.
      const std::string local_prefix = "/job:localhost/replica:0/task:0/";
      for (std::string& d : setup.devices) {
        d = "/job:worker/replica:0/task:" + std::to_string(setup.rank) + "/" + d.substr(local_prefix.size());
      }
    }
  } catch (...) {
    setup.error = std::current_exception();
  }
  setup.options = options;
  return setup;
}

// The devices of a setup whose checks passed; its error otherwise.
const std::vector<std::string>& checked_devices(const ClusterSetup& setup) {
  if (setup.error) std::rethrow_exception(setup.error);
  return setup.devices;
}

std::vector<std::string> numbered_cpus(int n) {
  if (n < 1) {
    throw InvalidArgumentError("MultiWorkerMirroredStrategy needs at least one local replica, got " +
                               std::to_string(n));
  }
  std::vector<std::string> devices;
  devices.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) devices.push_back("CPU:" + std::to_string(i));
  return devices;
}
}  // namespace
}  // namespace internal

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(const std::vector<std::string>& local_devices,
                                                         std::shared_ptr<Communicator> workers,
                                                         CommunicationOptions options)
    : MultiWorkerMirroredStrategy(
          internal::make_cluster_setup([&local_devices] { return local_devices; }, std::move(workers), options)) {}

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(int local_replicas, std::shared_ptr<Communicator> workers,
                                                         CommunicationOptions options)
    : MultiWorkerMirroredStrategy(internal::make_cluster_setup(
          [local_replicas] { return internal::numbered_cpus(local_replicas); }, std::move(workers), options)) {}

// The workers meet once the strategy is made, or once its making failed (a
// bad argument, found by make_cluster_setup; no thread for a replica): in
// the handler, which then raises the failure. Every worker meets exactly
// once, so one that cannot make its strategy fails the others at once.
namespace internal {
// TensorFlow's users start workers with TF_CONFIG; this library starts them
// with an MPI launcher. A TF_CONFIG found where no workers link was given is
// said once per process, so a job of N "workers" does not silently run as N
// single-worker jobs.
void warn_if_tf_config_ignored(std::ostream& out) {
  static std::atomic<bool> warned{false};
  const char* tf_config = std::getenv("TF_CONFIG");
  if (tf_config == nullptr || *tf_config == '\0' || warned.exchange(true)) return;
  out << "distribute: TF_CONFIG is set, but this MultiWorkerMirroredStrategy has no other workers: it runs as "
         "a single worker. TF_CONFIG is not read yet; start the workers with an MPI launcher instead "
         "(mpirun -np N <program>), which gives each its rank.\n"
      << std::flush;
}
}  // namespace internal

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(internal::ClusterSetup setup) try
    : Strategy(internal::checked_devices(setup), static_cast<int>(setup.devices.size()) * setup.size,
               static_cast<int>(setup.devices.size()) * setup.rank, setup.options),
      workers_(setup.workers),
      worker_rank_(setup.rank),
      num_workers_(setup.size) {
  if (workers_ != nullptr) {
    set_workers(workers_);
    internal::meet_the_workers(*workers_, setup.devices.size(), setup.options, nullptr, setup.met);
    session_ = workers_->session();  // the session the meeting began
  } else {
    internal::warn_if_tf_config_ignored(std::cerr);
  }
} catch (...) {
  if (setup.workers != nullptr && !setup.met) {
    internal::meet_the_workers(*setup.workers, setup.devices.size(), setup.options, std::current_exception(),
                               setup.met);
  }
}  // (the handler rethrows)

MultiWorkerMirroredStrategy::~MultiWorkerMirroredStrategy() {
  // The other workers stop waiting for this one in the collectives of this
  // strategy; a worker that makes its next strategy is unaffected.
  if (workers_ != nullptr) workers_->end_session(session_, "its MultiWorkerMirroredStrategy was destroyed");
}

}  // namespace distribute
