// Randomized fault injection: a random program of collectives on 2 to 8
// replicas, one replica of which misbehaves at a random step (throws, skips
// the collective, calls another one, passes another dtype or shape, or is
// slow). Each run must end with the documented error (docs/errors.md) raised
// by Strategy::run, well within the collective timeout (no hang), and the
// strategy must run a correct step afterwards. Seeded as randomized_test.cc:
// a failure prints its seed; DISTRIBUTE_TEST_SEED=<seed>
// DISTRIBUTE_RANDOMIZED_CASES=1 reruns it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "testing/faults.h"
#include "testing/reference_model.h"
#include "testing/strategies.h"

namespace distribute {
namespace {

using testing::uniform;

using testing::Fault;
using testing::kFaultNames;
using testing::Kind;

TEST(FaultInjectionTest, EveryFaultEndsInTheDocumentedErrorAndTheStrategyRecovers) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  constexpr std::uint64_t kCases = 30;
#else
  constexpr std::uint64_t kCases = 200;
#endif
  for (std::uint64_t seed : testing::test_seeds(7202611, kCases)) {
    std::mt19937_64 gen(seed);
    const int n = uniform(gen, 2, 8);
    std::vector<Kind> program(static_cast<std::size_t>(uniform(gen, 1, 6)));
    for (Kind& k : program) k = static_cast<Kind>(uniform(gen, 0, 2));
    const int faulty = uniform(gen, 0, n - 1);
    const auto step = static_cast<std::size_t>(uniform(gen, 0, static_cast<int>(program.size()) - 1));
    auto fault = static_cast<Fault>(uniform(gen, 0, 5));
    // A merge_call has no dtype or shape to get wrong: it throws instead.
    if ((fault == Fault::kOtherDtype || fault == Fault::kOtherShape) && program[step] == Kind::kMergeCall) {
      fault = Fault::kThrow;
    }
    SCOPED_TRACE(testing::rerun_hint(seed) + ": " + std::to_string(n) + " replicas, " + std::to_string(program.size()) +
                 " collectives; replica " + std::to_string(faulty) + " " + kFaultNames[static_cast<int>(fault)] +
                 " at collective " + std::to_string(step));
    auto s = testing::mirrored(n);
    const auto start = std::chrono::steady_clock::now();
    std::string kind = "none";
    std::string message;
    try {
      s->run([&](ReplicaContext& ctx) {
        const bool me = ctx.replica_id_in_sync_group() == faulty;
        for (std::size_t i = 0; i < program.size(); ++i) {
          if (me && i == step) {
            switch (fault) {
              case Fault::kThrow: throw std::runtime_error("injected fault");
              case Fault::kSkip: continue;
              case Fault::kOtherCollective:
                testing::call(ctx, static_cast<Kind>((static_cast<int>(program[i]) + 1) % 3), DType::kFloat32, false);
                continue;
              case Fault::kOtherDtype: testing::call(ctx, program[i], DType::kInt32, false); continue;
              case Fault::kOtherShape: testing::call(ctx, program[i], DType::kFloat32, true); continue;
              case Fault::kSlow: std::this_thread::sleep_for(std::chrono::milliseconds(30)); break;
            }
          }
          testing::call(ctx, program[i], DType::kFloat32, false);
        }
      });
    } catch (const InvalidArgumentError& e) {
      kind = "InvalidArgumentError";
      message = e.what();
    } catch (const FailedPreconditionError& e) {
      kind = "FailedPreconditionError";
      message = e.what();
    } catch (const Error& e) {
      kind = std::string(to_string(e.code()));
      message = e.what();
    } catch (const std::runtime_error& e) {
      kind = "runtime_error";
      message = e.what();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const char* want = "none";
    switch (fault) {
      case Fault::kThrow: want = "runtime_error"; break;  // the replica's own exception, rethrown by run
      case Fault::kSkip:
      case Fault::kOtherCollective: want = "FailedPreconditionError"; break;
      case Fault::kOtherDtype:
      case Fault::kOtherShape: want = "InvalidArgumentError"; break;
      case Fault::kSlow: want = "none"; break;
    }
    EXPECT_EQ(kind, want) << message;
    if (fault == Fault::kThrow) {
      EXPECT_EQ(message, "injected fault");
    }
    // Far inside the 20 s collective timeout: found, not waited out.
    EXPECT_LT(seconds, 5.0);
    // The strategy runs a correct step afterwards.
    const auto after = s->run([](ReplicaContext& ctx) { return ctx.all_reduce(ReduceOp::kSum, constant(1.f)); });
    for (const Tensor& t : after.values()) ASSERT_EQ(t.scalar<float>(), static_cast<float>(n));
    if (::testing::Test::HasFailure()) return;  // one seed's story is enough
  }
}

}  // namespace
}  // namespace distribute
