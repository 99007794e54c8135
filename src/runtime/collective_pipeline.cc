// What ReplicaContext's collectives share: their start (begin_collective), the
// agreement on their signatures (agree, explain_mismatch) and their results' views.
#include "runtime/collective_pipeline.h"

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distribute/communicator.h"
#include "distribute/errors.h"
#include "distribute/nest.h"
#include "distribute/options.h"
#include "distribute/replica_context.h"
#include "distribute/strategy.h"
#include "distribute/tensor.h"
#include "runtime/mode.h"
#include "runtime/replica_channel.h"
#include "runtime/runtime_util.h"
#include "runtime/signature.h"

namespace distribute::internal {

void check_agreed(ReplicaChannel& ch, const std::vector<Signature>& sigs, int first_replica, internal::ShapeRule rule,
                  int axis, const internal::LeafNamer& namer, const std::vector<internal::ShapeRule>* rules) {
  try {
    internal::check_signatures(sigs, first_replica, rule, axis, namer, "replica", rules);
  } catch (const Error&) {
    ch.agreed_failure = true;
    throw;
  }
}

[[noreturn]] void explain_mismatch(ReplicaChannel& ch, const Signature& sig, CollectiveCall call, int first_replica,
                                   internal::ShapeRule rule, int axis, const internal::LeafNamer& namer,
                                   const std::vector<internal::ShapeRule>* rules) {
  call.signature_tag = 0;
  std::vector<std::string> payloads = ch.comm->exchange(sig.encode(), call);
  std::vector<Signature> sigs;
  sigs.reserve(payloads.size());
  for (const auto& p : payloads) sigs.push_back(Signature::decode(p));
  check_agreed(ch, sigs, first_replica, rule, axis, namer, rules);
  throw InternalError(std::string(sig.op) + " #" + std::to_string(sig.sequence) +
                      ": signature tags differ but the signatures agree (a hash collision)");
}

std::vector<Signature> agree(ReplicaChannel& ch, const Signature& sig, CollectiveCall call, int first_replica,
                             internal::ShapeRule rule, int axis, const internal::LeafNamer& namer,
                             const std::vector<internal::ShapeRule>* rules) {
  call.signature_tag = sig.tag(/*with_leaves=*/false);
  std::vector<std::string> payloads;
  try {
    payloads = ch.comm->exchange(sig.encode(), call);
  } catch (const SignatureMismatch&) {
    explain_mismatch(ch, sig, call, first_replica, rule, axis, namer, rules);
  }
  std::vector<Signature> sigs;
  sigs.reserve(payloads.size());
  for (const auto& p : payloads) sigs.push_back(Signature::decode(p));
  check_agreed(ch, sigs, first_replica, rule, axis, namer, rules);
  return sigs;
}

CollectiveStart begin_collective(ReplicaContext& ctx, const char* op, const CommunicationOptions& options) {
  internal::require_replica_context(ctx, op);
  CollectiveStart start;
  start.options = ctx.strategy().communication_options().merge(options);
  internal::note_implementation(start.options);
  start.call = internal::next_call(internal::Access::channel(ctx), op, start.options);
  start.sig.op = op;
  start.sig.sequence = start.call.sequence;
  try {
    start.options.validate();
  } catch (const Error& e) {
    start.sig.set_error(e);
  }
  return start;
}

internal::LeafNamer namer_for(const std::vector<std::string>& paths) {
  return [&paths](std::size_t i) { return i < paths.size() ? paths[i] : std::string(); };
}

int first_replica_of_group(const ReplicaContext& ctx) {
  return ctx.replica_id_in_sync_group() - internal::Access::channel(ctx).comm->rank();
}

Tensor result_view(std::shared_ptr<std::byte> result, std::size_t offset, const Tensor& value,
                   const std::string& device) {
  std::byte* const at = result.get() + offset;
  std::shared_ptr<std::byte> view = value.nbytes() ? std::shared_ptr<std::byte>(std::move(result), at) : nullptr;
  return Tensor::from_shared(std::move(view), value.dtype(), value.shape(), device).as_read_only();
}

std::shared_ptr<std::byte> reference_for_views(std::shared_ptr<std::byte> result, std::size_t views) {
  if (views < 2 || result.use_count() < 2) return result;
  auto holder = std::make_shared<std::shared_ptr<std::byte>>(std::move(result));
  std::byte* const data = holder->get();
  return {std::move(holder), data};
}

const std::string& leaf_structure() {
  static const std::string structure = Nest<Tensor>(Tensor()).structure_string();
  return structure;
}

void add_field(Signature& sig, std::string_view key, std::string_view value) {
  sig.fields.emplace_back(std::string(key), std::string(value));
}

}  // namespace distribute::internal
