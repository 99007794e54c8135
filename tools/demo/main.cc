// distribute-demo: every example of the tf.distribute.ReplicaContext page (the
// seed, ../shared/seed/), written in C++ with distribute, run on
// MirroredStrategy({"CPU:0", "CPU:1"}), printing what TensorFlow prints.
//
// Started by an MPI launcher (mpirun -np 2 distribute-demo), it runs the same
// examples on MultiWorkerMirroredStrategy: every worker runs 2 local
// replicas, all of them in one sync group, and worker 0 prints what each
// worker saw.
#include <distribute/distribute.h>

#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#ifdef DISTRIBUTE_HAVE_MPI
#include <distribute/mpi.h>
#endif

using namespace distribute;

namespace {

// A nest shown as Python shows the tolist() of its values: {'a': [0, 1], ...}.
std::string values_of(const Nest<Tensor>& n) {
  switch (n.kind()) {
    case NestKind::kLeaf: return n.leaf().to_list_string();
    case NestKind::kDict: {
      std::string s = "{";
      for (const auto& [key, child] : n.dict_items())
        s += (s.size() > 1 ? ", '" : "'") + key + "': " + values_of(child);
      return s + "}";
    }
    default: {
      std::string s = "[";
      for (std::size_t i = 0; i < n.items().size(); ++i) s += (i ? ", " : "") + values_of(n.items()[i]);
      return s + "]";
    }
  }
}

std::ostream* out = &std::cout;

void section(const std::string& title) { *out << "\n== " << title << " ==\n"; }

// The page's examples, one function per method it shows, in the page's order.
void replica_id_example(Strategy& strategy) {
  std::ostream& cout = *out;
  section("ReplicaContext: replica_id_in_sync_group");
  auto func = [] {
    auto* replica_context = get_replica_context();
    return constant(replica_context->replica_id_in_sync_group());
  };
  cout << strategy.run(func) << "\n";
}

void all_gather_examples(Strategy& strategy) {
  std::ostream& cout = *out;
  section("all_gather: one tensor");
  auto gather_value = [] {
    auto* ctx = get_replica_context();
    auto local_value = constant({1, 2, 3});
    return ctx->all_gather(local_value, /*axis=*/0);
  };
  auto result = strategy.run(gather_value);
  cout << result << "\n";
  cout << repr_tuple(strategy.experimental_local_results(result)) << "\n";

  section("all_gather: a nested structure (list) of tensors");
  auto gather_nest = [] {
    auto* ctx = get_replica_context();
    auto value_1 = constant({1, 2, 3});
    auto value_2 = constant({{1, 2}, {3, 4}});
    // all_gather a nest of tensors
    return ctx->all_gather({value_1, value_2}, /*axis=*/0);
  };
  auto nest_result = strategy.run(gather_nest);
  for (const auto& local : strategy.experimental_local_results(nest_result)) {
    cout << repr(local) << "\n";
  }

  section("all_gather: different shapes on different replicas (ragged, nested dict)");
  using N = Nest<Tensor>;
  // Replica 0: {'a': [0], 'b': [[0, 1]]}, replica 1: {'a': [1], 'b': [[2, 3], [4, 5]]}, and so on.
  std::vector<N> values;
  for (int i = 0; i < strategy.num_local_replicas(); ++i) {
    const int g = strategy.first_replica_id() + i;
    values.push_back(N::dict({{"a", constant({g})}, {"b", iota(DType::kInt32, Shape{g + 1, 2}, g * (g + 1))}}));
  }
  PerReplica<N> per_replica_value(std::move(values));
  auto gather_ragged = [](ReplicaContext& ctx, const N& value) { return ctx.all_gather(value, /*axis=*/0); };
  auto ragged = strategy.run(gather_ragged, per_replica_value);
  for (std::size_t r = 0; r < ragged.size(); ++r) {
    cout << "replica " << strategy.first_replica_id() + static_cast<int>(r) << ": value "
         << values_of(per_replica_value[r]) << " -> all_gather " << values_of(ragged[r]) << "\n";
  }
}

void all_reduce_examples(Strategy& strategy) {
  std::ostream& cout = *out;
  section("all_reduce: SUM of a scalar");
  auto step_fn = [] {
    auto* ctx = get_replica_context();
    auto value = constant(1.f);
    return ctx->all_reduce(ReduceOp::kSum, value);
  };
  cout << repr_tuple(strategy.experimental_local_results(strategy.run(step_fn))) << "\n";

  section("all_reduce: a list of values (batched)");
  using N = Nest<Tensor>;
  auto step_fn_list = [] {
    auto* ctx = get_replica_context();
    auto value1 = constant(1.f);
    auto value2 = constant(2.f);
    return ctx->all_reduce(ReduceOp::kSum, {value1, value2});
  };
  std::string line = "(";
  for (const auto& local : strategy.experimental_local_results(strategy.run(step_fn_list))) {
    line += (line.size() > 1 ? ", " : "") + values_of(N::list({local[0], local[1]}));
  }
  cout << line << ")   # float32 scalars, one list per replica\n";
}

void merge_call_examples(Strategy& strategy) {
  std::ostream& cout = *out;
  section("merge_call: merge_fn runs once, in the cross-replica context");
  auto merge_step = [] {
    auto* ctx = get_replica_context();
    auto value = constant(static_cast<float>(ctx->replica_id_in_sync_group() + 1));
    return ctx->merge_call(
        [](Strategy& s, const PerReplica<Tensor>& v) {
          *out << "merge_fn sees " << v << "\n";
          return s.extended().reduce_to(ReduceOp::kSum, v, v);  // an all-reduce: destinations = the value
        },
        value);
  };
  cout << strategy.run(merge_step) << "\n";

  section("merge_call outside a distributed context");
  auto outside = get_replica_context()->merge_call(
      [](Strategy& s, const PerReplica<Tensor>& v) { return std::string(s.name()) + ": " + v[0].to_list_string(); },
      constant(7));
  cout << outside << "\n";
}

void run_examples(Strategy& strategy) {
  replica_id_example(strategy);
  all_gather_examples(strategy);
  all_reduce_examples(strategy);
  merge_call_examples(strategy);
}

// --list-devices: what tf.config.list_physical_devices and
// list_logical_devices show, with each GPU's details.
int list_devices() {
  for (const PhysicalDevice& d : list_physical_devices()) {
    std::cout << d;
    const DeviceDetails details = get_device_details(d);
    if (details.compute_capability) {
      std::cout << ": " << details.device_name << ", compute capability " << details.compute_capability->first << "."
                << details.compute_capability->second << ", " << (details.memory_bytes >> 20) << " MB";
    }
    std::cout << "\n";
  }
  if (list_physical_devices("GPU").empty()) std::cout << "no GPU: " << gpus_unavailable_reason() << "\n";
  for (const LogicalDevice& d : list_logical_devices()) std::cout << d << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string arg = argc > 1 ? argv[1] : "";
    if (arg == "--list-devices" && argc == 2) return list_devices();
    if (argc > 1) {
      std::cerr << "usage: distribute-demo [--list-devices]\n"
                   "  runs the seed's examples on MirroredStrategy({\"CPU:0\", \"CPU:1\"}) (under mpirun: on\n"
                   "  MultiWorkerMirroredStrategy, 2 replicas per worker); --list-devices lists the devices\n";
      return 2;
    }
#ifdef DISTRIBUTE_HAVE_MPI
    if (mpi::started_by_launcher()) {
      // strategy = tf.distribute.MultiWorkerMirroredStrategy(), 2 replicas per worker
      std::shared_ptr<Communicator> workers = mpi::cluster_from_launcher();
      MultiWorkerMirroredStrategy strategy(2, workers);
      std::ostringstream mine;
      out = &mine;
      run_examples(strategy);
      // Worker 0 prints every worker's output, in order.
      CollectiveCall call{.op = "distribute-demo output", .timeout_seconds = 60};
      const std::vector<std::string> all = workers->exchange(mine.str(), call);
      if (strategy.worker_rank() == 0) {
        std::cout << strategy.num_workers() << " workers x " << strategy.num_local_replicas()
                  << " local replicas = " << strategy.num_replicas_in_sync() << " replicas in sync\n";
        for (std::size_t w = 0; w < all.size(); ++w) {
          std::cout << "\n################ worker " << w << " ################\n" << all[w];
        }
      }
      return 0;
    }
#endif
    // strategy = tf.distribute.MirroredStrategy(['GPU:0', 'GPU:1'])  (CPU devices here)
    MirroredStrategy strategy({"CPU:0", "CPU:1"});
    run_examples(strategy);
    return 0;
  } catch (const Error& e) {
    std::cerr << "distribute-demo: " << to_string(e.code()) << ": " << e.what() << "\n";
    return 1;
  }
}
