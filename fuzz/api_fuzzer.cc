// libFuzzer target: reads its input as a short program of API calls on a
// MirroredStrategy of 1 to 4 replicas, valid and invalid alike (bad axes,
// rank 0, empty tensors, nests that differ, a replica that passes another
// dtype or shape, skips a collective or calls another one, replicas mixing the
// one-Tensor overloads (hashed in place) with one-leaf nests, DLPack tensors
// with bad dtypes, strides or shapes), and checks what the library promises:
//  - only distribute's typed errors come out (anything else, a crash, a leak
//    or undefined behaviour stops the fuzzer; it runs under ASan and UBSan);
//  - every replica of a run ends alike: the same error (code and message), or
//    a result;
//  - a collective that succeeds gives the reference model's result, bit for
//    bit (tests/testing/reference_model.h), and one that every replica calls
//    alike with valid values succeeds;
//  - the strategy runs a correct step after whatever went before;
//  - from_dlpack calls the deleter exactly once when it accepts a tensor, and
//    never when it refuses one.
// Build and run: `make fuzz` (docs/reliability.md).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "distribute/distribute.h"
#include "testing/reference_model.h"

namespace distribute {
namespace {

using testing::bitwise_equal;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "api_fuzzer: %s\n", what.c_str());
  std::abort();
}

// One strategy per replica count, kept across inputs: a strategy must stay
// usable after any error, and making threads per input would be slow.
MirroredStrategy& strategy(int replicas) {
  static std::array<std::unique_ptr<MirroredStrategy>, 5> cache;
  auto& s = cache[static_cast<std::size_t>(replicas)];
  if (!s) {
    std::vector<std::string> devices;
    for (int i = 0; i < replicas; ++i) devices.push_back("CPU:" + std::to_string(i));
    CommunicationOptions options;
    options.timeout = std::chrono::seconds(10);
    s = std::make_unique<MirroredStrategy>(devices, options);
  }
  return *s;
}

// kMergeReduce: merge_call whose merge_fn reduce_to's the replicas' values
// back onto them (the optimizer's pattern). kCrossReplicaReduce: calls
// Strategy::reduce inside run, which must be refused on every replica.
// kBroadcast(Nest): ReplicaContext::broadcast from the replica that the
// step's axis names (a negative one, or one past the replicas, is invalid).
enum class Call {
  kAllReduce,
  kAllGather,
  kAllReduceNest,
  kAllGatherNest,
  kMergeReduce,
  kCrossReplicaReduce,
  kBroadcast,
  kBroadcastNest,
  kCount
};

// How one replica departs from the others in a call, if it does.
enum class Deviation { kNone, kOtherDType, kOtherShape, kSkip, kOtherCall, kCount };

struct Step {
  Call call = Call::kAllReduce;
  ReduceOp op = ReduceOp::kSum;
  int axis = 0;
  std::int64_t bytes_per_pack = 0;
  std::vector<DType> dtypes;                      // per leaf
  std::vector<std::vector<std::int64_t>> dims;    // per leaf
  std::vector<std::vector<std::int64_t>> ragged;  // per leaf, per replica: the size along axis
  int deviant = -1;
  Deviation deviation = Deviation::kNone;
  // Single-value calls: bit r set, replica r calls the nest overload with a
  // one-leaf nest instead of the Tensor overload (the same collective).
  std::uint8_t nest_overload = 0;
  std::vector<std::vector<Tensor>> inputs;  // [replica][leaf]
};

struct Outcome {
  int failed_at = -1;                     // the step that threw, -1 if none
  ErrorCode code = ErrorCode::kInternal;  // meaningful only when failed_at >= 0
  std::string message;
  std::vector<std::vector<Tensor>> results;  // per step, per leaf
};

Step decode_step(FuzzedDataProvider& in, int replicas, std::mt19937_64& gen) {
  Step s;
  s.call = static_cast<Call>(in.ConsumeIntegralInRange<int>(0, static_cast<int>(Call::kCount) - 1));
  s.op = kAllReduceOps[in.ConsumeIntegralInRange<std::size_t>(0, std::size(kAllReduceOps) - 1)];
  s.axis = in.ConsumeIntegralInRange<int>(-4, 3);
  static const std::int64_t kPacks[] = {0, 1, 16, 100, 1 << 20};
  s.bytes_per_pack = kPacks[in.ConsumeIntegralInRange<std::size_t>(0, std::size(kPacks) - 1)];
  const bool nest = s.call == Call::kAllReduceNest || s.call == Call::kAllGatherNest || s.call == Call::kBroadcastNest;
  const int leaves = nest ? in.ConsumeIntegralInRange<int>(0, 3) : 1;
  for (int l = 0; l < leaves; ++l) {
    s.dtypes.push_back(kAllDTypes[in.ConsumeIntegralInRange<std::size_t>(0, std::size(kAllDTypes) - 1)]);
    std::vector<std::int64_t> d(in.ConsumeIntegralInRange<std::size_t>(0, 3));
    for (auto& x : d) x = in.ConsumeIntegralInRange<std::int64_t>(0, 4);
    s.dims.push_back(d);
    std::vector<std::int64_t> sizes;
    for (int r = 0; r < replicas; ++r) sizes.push_back(in.ConsumeIntegralInRange<std::int64_t>(0, 3));
    s.ragged.push_back(sizes);
  }
  if (in.ConsumeBool()) {
    s.deviant = in.ConsumeIntegralInRange<int>(0, replicas - 1);
    s.deviation = static_cast<Deviation>(in.ConsumeIntegralInRange<int>(1, static_cast<int>(Deviation::kCount) - 1));
  }
  if (!nest) s.nest_overload = in.ConsumeIntegral<std::uint8_t>();
  const bool gather = s.call == Call::kAllGather || s.call == Call::kAllGatherNest;
  s.inputs.resize(static_cast<std::size_t>(replicas));
  for (int r = 0; r < replicas; ++r) {
    for (int l = 0; l < leaves; ++l) {
      std::vector<std::int64_t> d = s.dims[static_cast<std::size_t>(l)];
      DType dtype = s.dtypes[static_cast<std::size_t>(l)];
      const int rank = static_cast<int>(d.size());
      if (gather && rank > 0 && s.axis >= -rank && s.axis < rank) {
        d[static_cast<std::size_t>(s.axis < 0 ? s.axis + rank : s.axis)] =
            s.ragged[static_cast<std::size_t>(l)][static_cast<std::size_t>(r)];
      }
      if (r == s.deviant && s.deviation == Deviation::kOtherDType) {
        dtype = dtype == DType::kFloat32 ? DType::kInt32 : DType::kFloat32;
      }
      if (r == s.deviant && s.deviation == Deviation::kOtherShape) d.push_back(2);
      s.inputs[static_cast<std::size_t>(r)].push_back(testing::random_tensor(gen, dtype, Shape(d)));
    }
  }
  return s;
}

// DISTRIBUTE_FUZZ_VERBOSE=1: what an input decodes to, to read a finding.
void print_program(int replicas, const std::vector<Step>& steps) {
  static const char* kCalls[] = {"all_reduce",
                                 "all_gather",
                                 "all_reduce(nest)",
                                 "all_gather(nest)",
                                 "merge_call(reduce_to)",
                                 "Strategy::reduce in run",
                                 "broadcast (root: axis)",
                                 "broadcast(nest) (root: axis)"};
  static const char* kDeviations[] = {"none", "other dtype", "other shape", "skip", "other call"};
  std::fprintf(stderr, "%d replicas, %zu steps\n", replicas, steps.size());
  for (const Step& s : steps) {
    std::fprintf(stderr, "  %s op %s axis %d bytes_per_pack %lld deviant %d (%s) nest overload on 0x%02x\n",
                 kCalls[static_cast<int>(s.call)], std::string(to_string(s.op)).c_str(), s.axis,
                 static_cast<long long>(s.bytes_per_pack), s.deviant, kDeviations[static_cast<int>(s.deviation)],
                 static_cast<unsigned>(s.nest_overload));
    for (std::size_t r = 0; r < s.inputs.size(); ++r) {
      for (const Tensor& t : s.inputs[r]) std::fprintf(stderr, "    replica %zu: %s\n", r, repr(t).c_str());
    }
  }
}

// What one replica does for one step; returns the results per leaf.
std::vector<Tensor> perform(ReplicaContext& ctx, const Step& s, int replica) {
  const std::vector<Tensor>& mine = s.inputs[static_cast<std::size_t>(replica)];
  Call call = s.call;
  if (replica == s.deviant && s.deviation == Deviation::kSkip) return {};
  if (replica == s.deviant && s.deviation == Deviation::kOtherCall) {
    call = call == Call::kAllReduce ? Call::kAllGather : Call::kAllReduce;
  }
  CommunicationOptions options;
  options.bytes_per_pack = s.bytes_per_pack;
  const bool as_nest = ((s.nest_overload >> replica) & 1) != 0;
  switch (call) {
    case Call::kAllReduce: {
      const Tensor value = mine.empty() ? constant(0.f) : mine.front();
      return {as_nest ? ctx.all_reduce(s.op, Nest<Tensor>(value), options).leaf()
                      : ctx.all_reduce(s.op, value, options)};
    }
    case Call::kAllGather: {
      const Tensor value = mine.empty() ? constant(0.f) : mine.front();
      return {as_nest ? ctx.all_gather(Nest<Tensor>(value), s.axis, options).leaf()
                      : ctx.all_gather(value, s.axis, options)};
    }
    case Call::kAllReduceNest: return ctx.all_reduce(s.op, mine, options);
    case Call::kAllGatherNest: return ctx.all_gather(mine, s.axis, options);
    case Call::kMergeReduce: {
      const Tensor value = mine.empty() ? constant(0.f) : mine.front();
      const ReduceOp op = s.op;
      return {ctx.merge_call(
          [op, options](Strategy& strategy, const PerReplica<Tensor>& v) {
            return strategy.extended().reduce_to(op, v, v, options);
          },
          value)};
    }
    case Call::kCrossReplicaReduce:
      return {ctx.strategy().reduce(s.op, mine.empty() ? constant(0.f) : mine.front(), std::nullopt)};
    case Call::kBroadcast: {
      const Tensor value = mine.empty() ? constant(0.f) : mine.front();
      return {as_nest ? ctx.broadcast(Nest<Tensor>(value), s.axis, options).leaf()
                      : ctx.broadcast(value, s.axis, options)};
    }
    case Call::kBroadcastNest: return ctx.broadcast(mine, s.axis, options);
    case Call::kCount: break;
  }
  return {};
}

// The reference model's result of a step that succeeded.
void check_against_reference(const Step& s, const std::vector<Tensor>& got, int replica) {
  const bool gather = s.call == Call::kAllGather || s.call == Call::kAllGatherNest;
  const std::size_t leaves = s.inputs.front().size();
  if (got.size() != leaves)
    fail("a collective returned " + std::to_string(got.size()) + " leaves, not " + std::to_string(leaves));
  for (std::size_t l = 0; l < leaves; ++l) {
    std::vector<Tensor> column;
    for (const auto& per : s.inputs) column.push_back(per[l]);
    Tensor expected;
    if (gather) {
      const int rank = column.front().shape().rank();
      expected = testing::reference_gather(column, s.axis < 0 ? s.axis + rank : s.axis);
    } else if (s.call == Call::kBroadcast || s.call == Call::kBroadcastNest) {
      expected = column[static_cast<std::size_t>(s.axis)];  // it succeeded: the root is a replica
    } else {
      expected = testing::reference_reduce(s.op, column);
    }
    if (!bitwise_equal(got[l], expected)) {
      fail("replica " + std::to_string(replica) + ", leaf " + std::to_string(l) + ": got " + repr(got[l]) +
           ", the reference model gives " + repr(expected));
    }
  }
}

// Whether a step without a deviation must succeed on every replica: every
// all_reduce and merge_call(reduce_to) must; an all_gather must unless a value
// has rank 0 or the axis is out of its range; a broadcast unless its root is
// not a replica; Strategy::reduce inside run never does (refused where it is
// called).
bool must_succeed(const Step& s) {
  if (s.call == Call::kCrossReplicaReduce) return false;
  if (s.call == Call::kBroadcast || s.call == Call::kBroadcastNest) {
    return s.axis >= 0 && s.axis < static_cast<int>(s.inputs.size());
  }
  if (s.call != Call::kAllGather && s.call != Call::kAllGatherNest) return true;
  for (const auto& dims : s.dims) {
    const int rank = static_cast<int>(dims.size());
    if (rank == 0 || s.axis < -rank || s.axis >= rank) return false;
  }
  return true;
}

std::size_t first_deviation(const std::vector<Step>& steps) {
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].deviation != Deviation::kNone) return i;
  }
  return steps.size();
}

// A step that must work after anything: every replica's id, summed.
void check_still_usable(MirroredStrategy& s) {
  const int n = s.num_replicas_in_sync();
  const PerReplica<Tensor> sums = s.run(
      [](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kSum, constant(ctx.replica_id_in_sync_group())); });
  for (const Tensor& t : s.experimental_local_results(sums)) {
    if (t.scalar<int>() != n * (n - 1) / 2) fail("the strategy gave a wrong sum after an earlier input");
  }
}

// Strategy::reduce and Strategy::gather in the cross-replica context, on
// per-replica values whose shapes may differ (ragged, or wrongly).
void fuzz_cross_replica(FuzzedDataProvider& in, MirroredStrategy& s, std::mt19937_64& gen) {
  if (!in.ConsumeBool()) return;
  const bool gather = in.ConsumeBool();
  const ReduceOp op = kAllReduceOps[in.ConsumeIntegralInRange<std::size_t>(0, std::size(kAllReduceOps) - 1)];
  const int axis = in.ConsumeIntegralInRange<int>(-4, 3);
  const bool with_axis = in.ConsumeBool();
  const DType dtype = kAllDTypes[in.ConsumeIntegralInRange<std::size_t>(0, std::size(kAllDTypes) - 1)];
  std::vector<std::int64_t> dims(in.ConsumeIntegralInRange<std::size_t>(0, 3));
  for (auto& d : dims) d = in.ConsumeIntegralInRange<std::int64_t>(0, 4);
  std::vector<Tensor> values;
  for (int r = 0; r < s.num_replicas_in_sync(); ++r) {
    std::vector<std::int64_t> mine = dims;
    // Each replica's own size along one dimension (ragged for gather, wrong for reduce).
    if (!mine.empty() && in.ConsumeBool())
      mine[in.ConsumeIntegralInRange<std::size_t>(0, mine.size() - 1)] = in.ConsumeIntegralInRange<std::int64_t>(0, 3);
    values.push_back(testing::random_tensor(gen, dtype, Shape(mine)));
  }
  const PerReplica<Tensor> per_replica(values);
  Tensor got;
  try {
    if (gather) {
      got = s.gather(per_replica, axis);
    } else {
      got = with_axis ? s.reduce(op, per_replica, axis) : s.reduce(op, per_replica, std::nullopt);
    }
  } catch (const Error&) {
    return;  // a typed error: refused as documented
  }
  Tensor expected;
  if (gather) {
    const int rank = static_cast<int>(dims.size());
    if (rank == 0 || axis < -rank || axis >= rank)
      fail("gather accepted axis " + std::to_string(axis) + " for rank " + std::to_string(rank));
    expected = testing::reference_gather(values, axis < 0 ? axis + rank : axis);
  } else if (!with_axis) {
    expected = testing::reference_reduce(op, values);
  } else {
    return;  // reduced along an axis too: float order differs from a plain reference
  }
  if (!bitwise_equal(got, expected)) {
    fail(std::string(gather ? "Strategy::gather" : "Strategy::reduce") + " gave " + repr(got) +
         ", the reference model gives " + repr(expected));
  }
}

void fuzz_collectives(FuzzedDataProvider& in) {
  const int replicas = in.ConsumeIntegralInRange<int>(1, 4);
  std::mt19937_64 gen(in.ConsumeIntegral<std::uint64_t>());
  std::vector<Step> steps;
  const int count = in.ConsumeIntegralInRange<int>(0, 4);
  for (int i = 0; i < count; ++i) steps.push_back(decode_step(in, replicas, gen));

  if (std::getenv("DISTRIBUTE_FUZZ_VERBOSE") != nullptr) print_program(replicas, steps);

  MirroredStrategy& s = strategy(replicas);
  std::vector<Outcome> outcomes(static_cast<std::size_t>(replicas));
  s.run([&](ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    Outcome& mine = outcomes[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < steps.size(); ++i) {
      try {
        mine.results.push_back(perform(ctx, steps[i], r));
      } catch (const Error& e) {
        mine.failed_at = static_cast<int>(i);
        mine.code = e.code();
        mine.message = e.what();
        return;  // a collective failed: the replica stops, as a step function would
      }
    }
  });

  // The same error on every replica (a replica that skipped a call counts its
  // calls differently, so the step index may differ; the error may not), with
  // the two differences docs/errors.md gives: a replica whose merge_fn threw
  // has that exception while the others have AbortedError naming it; and a
  // replica left waiting in a collective that another replica will never call
  // (it skipped it, or stopped at an error of its own) is told so. A call
  // that is refused where it is made (Strategy::reduce inside run) is checked
  // on its own.
  const auto is_abort_of = [](const Outcome& aborted, const Outcome& original) {
    return aborted.code == ErrorCode::kAborted && original.code != ErrorCode::kAborted &&
           aborted.message.find(original.message) != std::string::npos;
  };
  const auto left_behind = [](const Outcome& o) {
    return o.failed_at >= 0 && o.code == ErrorCode::kFailedPrecondition &&
           o.message.find("returned from the replica function") != std::string::npos;
  };
  // Strategy::reduce inside run is refused where it is called, not collectively.
  const auto refused_locally = [&](const Outcome& o) {
    if (o.failed_at < 0 || o.code != ErrorCode::kFailedPrecondition ||
        o.message.find("requires being in cross-replica context") == std::string::npos) {
      return false;
    }
    if (steps[static_cast<std::size_t>(o.failed_at)].call != Call::kCrossReplicaReduce) {
      fail("a replica was refused as if it called Strategy::reduce in run: " + o.message);
    }
    return true;
  };
  const Outcome* reference = nullptr;
  for (const Outcome& o : outcomes) {
    if (left_behind(o) || refused_locally(o)) continue;
    if (reference == nullptr || (reference->code == ErrorCode::kAborted && o.failed_at >= 0)) reference = &o;
  }
  for (int r = 0; reference != nullptr && r < replicas; ++r) {
    const Outcome& o = outcomes[static_cast<std::size_t>(r)];
    if (left_behind(o) || refused_locally(o) || is_abort_of(o, *reference)) continue;
    const Outcome& first = *reference;
    if ((o.failed_at < 0) != (first.failed_at < 0) || o.code != first.code || o.message != first.message) {
      const auto describe = [](const Outcome& x) {
        return x.failed_at < 0
                   ? std::string("no error")
                   : "step " + std::to_string(x.failed_at) + ": " + std::string(to_string(x.code)) + ": " + x.message;
      };
      fail("replica " + std::to_string(r) + " ended differently from another: " + describe(o) + " vs " +
           describe(first));
    }
  }
  const std::size_t deviation = first_deviation(steps);
  for (int r = 0; r < replicas; ++r) {
    const Outcome& o = outcomes[static_cast<std::size_t>(r)];
    const auto failed_at = static_cast<std::size_t>(o.failed_at);
    if (o.failed_at >= 0 && failed_at < deviation && must_succeed(steps[failed_at])) {
      fail("replica " + std::to_string(r) + ": step " + std::to_string(failed_at) +
           " is valid on every replica but raised " + std::string(to_string(o.code)) + ": " + o.message);
    }
    for (std::size_t i = 0; i < o.results.size(); ++i) {
      // From the first deviant step on, there is no reference: collectives
      // pair up by their order, so after a skip a replica's next call may meet
      // the others' previous one, of the same kind, dtypes and shapes, and
      // succeed (the run then fails when the skipping replica returns early).
      if (deviation <= i) break;
      check_against_reference(steps[i], o.results[i], r);
    }
  }
  check_still_usable(s);
  fuzz_cross_replica(in, s, gen);
}

// ---- DLPack -------------------------------------------------------------------

struct Owned {
  DLManagedTensor managed{};
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::vector<std::byte> data;
  int* deleted = nullptr;
};

void fuzz_dlpack(FuzzedDataProvider& in) {
  int deleted = 0;
  auto owned = std::make_unique<Owned>();
  owned->deleted = &deleted;
  DLTensor& t = owned->managed.dl_tensor;
  // Device types of newer DLPacks are not values of this header's enum: store the bytes.
  const std::int32_t device_type = in.ConsumeIntegralInRange<std::int32_t>(0, 20);
  std::memcpy(&t.device.device_type, &device_type, sizeof device_type);
  t.device.device_id = in.ConsumeIntegralInRange<int>(-1, 2);
  t.dtype.code = in.ConsumeIntegral<std::uint8_t>() % 8;
  t.dtype.bits = in.PickValueInArray<std::uint8_t>({0, 1, 8, 16, 32, 64, 128, 7});
  t.dtype.lanes = in.PickValueInArray<std::uint16_t>({1, 1, 1, 0, 2, 4});
  // Past 64 dimensions an import must refuse before it reads the shape.
  const bool too_many = in.ConsumeIntegralInRange<int>(0, 15) == 0;
  t.ndim = too_many ? in.PickValueInArray<std::int32_t>({65, 1 << 20, std::numeric_limits<std::int32_t>::max()})
                    : in.ConsumeIntegralInRange<int>(-1, 4);
  const int rank = too_many ? 0 : std::max(t.ndim, 0);
  // Dimensions are small (the buffer below holds them) or absurd: negative,
  // or so large that the byte count overflows int64.
  static constexpr std::int64_t kAbsurd[] = {-1, -5, std::numeric_limits<std::int64_t>::min(),
                                             std::numeric_limits<std::int64_t>::max(), std::int64_t{1} << 62};
  for (int i = 0; i < rank; ++i) {
    owned->shape.push_back(in.ConsumeBool() ? in.ConsumeIntegralInRange<std::int64_t>(0, 5)
                                            : kAbsurd[in.ConsumeIntegralInRange<std::size_t>(0, 4)]);
  }
  const int stride_kind = in.ConsumeIntegralInRange<int>(0, 2);  // none, row-major, fuzzed
  if (stride_kind == 1) {
    owned->strides.resize(static_cast<std::size_t>(rank));
    std::int64_t step = 1;
    for (int i = rank - 1; i >= 0; --i) {
      owned->strides[static_cast<std::size_t>(i)] = step;
      step *= std::max<std::int64_t>(1, std::min<std::int64_t>(owned->shape[static_cast<std::size_t>(i)], 5));
    }
  } else if (stride_kind == 2) {
    for (int i = 0; i < rank; ++i) owned->strides.push_back(in.ConsumeIntegralInRange<std::int64_t>(-2, 30));
  }
  t.byte_offset = in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<std::uint64_t>(0, 16);
  // Enough bytes for any accepted small tensor (5^4 elements of 16 bytes, plus the offset).
  owned->data.resize(5 * 5 * 5 * 5 * 16 + 16 + 8);
  // Null data: allowed for an empty tensor only. The base may be misaligned
  // (the offset can align it again).
  const std::size_t base = in.ConsumeIntegralInRange<std::size_t>(0, 7);
  t.data = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? nullptr : owned->data.data() + base;
  t.shape = rank > 0 ? owned->shape.data() : nullptr;
  t.strides = owned->strides.empty() ? nullptr : owned->strides.data();
  owned->managed.manager_ctx = owned.get();
  owned->managed.deleter = [](DLManagedTensor* self) {
    auto* o = static_cast<Owned*>(self->manager_ctx);
    ++*o->deleted;
    delete o;
  };
  // What a correct import must refuse: a negative dimension, or a size whose
  // byte count does not fit in int64. What the fuzzer may read: small shapes.
  bool small = true;
  bool negative = false;
  bool overflows = false;
  std::int64_t bytes = std::max<std::int64_t>(1, (t.dtype.bits + 7) / 8);
  for (std::int64_t d : owned->shape) {
    small = small && d >= 0 && d <= 5;
    negative = negative || d < 0;
  }
  for (std::int64_t d : owned->shape) {
    if (!negative && __builtin_mul_overflow(bytes, d, &bytes)) overflows = true;
  }
  const bool has_zero = std::find(owned->shape.begin(), owned->shape.end(), 0) != owned->shape.end();
  // An import of bools reads every element (a byte other than 0 and 1 is
  // refused): a bool tensor of a large shape would read past the buffer,
  // where a real producer's memory holds every element. Small ones only.
  if (t.dtype.code == 6 && t.dtype.bits == 8 && !small && !negative && !overflows && !has_zero) {
    for (std::int64_t& d : owned->shape) d = std::min<std::int64_t>(std::max<std::int64_t>(d, 0), 5);
    small = true;
  }
  // Now and then a bool byte that is neither 0 nor 1, which must be refused.
  const bool stray_bool = t.dtype.code == 6 && t.dtype.bits == 8 && in.ConsumeIntegralInRange<int>(0, 3) == 0;
  if (stray_bool && t.data != nullptr) static_cast<unsigned char*>(t.data)[t.byte_offset] = 2;
  const std::vector<std::int64_t> shape = owned->shape;
  Owned* raw = owned.release();
  try {
    Tensor imported = from_dlpack(&raw->managed);
    if (too_many) fail("from_dlpack accepted ndim " + std::to_string(t.ndim));
    if (negative) fail("from_dlpack accepted a negative dimension");
    if (imported.num_elements() > 0 &&
        reinterpret_cast<std::uintptr_t>(imported.raw_data()) % size_of(imported.dtype()) != 0) {
      fail("from_dlpack accepted elements that are not aligned to their size");
    }
    if (overflows && !has_zero) fail("from_dlpack accepted a shape whose byte count overflows int64");
    if (imported.shape().dims() != shape) fail("from_dlpack changed the shape");
    if (stray_bool && t.data != nullptr && imported.num_elements() > 0) fail("from_dlpack accepted a bool byte of 2");
    if (small) {
      // Reading every byte lets ASan check that the tensor stays inside the buffer.
      std::size_t sum = 0;
      const auto* p = static_cast<const unsigned char*>(imported.raw_data());
      for (std::size_t i = 0; i < imported.nbytes(); ++i) sum += p[i];
      // The buffer is zeroed (a stray bool byte is refused above).
      if (sum != 0) fail("from_dlpack's tensor holds bytes it was not given");
    }
    Tensor copy = imported;
    if (deleted != 0) fail("from_dlpack's tensor called the deleter while still alive");
  } catch (const Error&) {
    if (deleted != 0) fail("from_dlpack refused a tensor but called its deleter");
    raw->managed.deleter(&raw->managed);
    return;
  }
  if (deleted != 1) fail("from_dlpack called the deleter " + std::to_string(deleted) + " times, not once");
}

}  // namespace
}  // namespace distribute

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  if (in.ConsumeBool()) {
    distribute::fuzz_dlpack(in);
  } else {
    distribute::fuzz_collectives(in);
  }
  return 0;
}
