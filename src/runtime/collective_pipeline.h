// The pipeline that ReplicaContext's collectives share (all_reduce.cc,
// all_gather.cc, broadcast.cc, merge_call.cc). Each one follows the same pipeline:
//   1. validate locally (the verdict travels, it is not thrown yet);
//   2. exchange signatures and check them: any problem raises the same error on
//      every replica, before any data moves;
//   3. move the data through the communicator: all_reduce packs values of one
//      dtype into buffers of about bytes_per_pack (one collective per pack);
//      all_gather moves each value with one all_gather_v.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/storage.h"
#include "distribute/communicator.h"
#include "distribute/dtype.h"
#include "distribute/errors.h"
#include "distribute/options.h"
#include "distribute/replica_context.h"
#include "distribute/tensor.h"
#include "runtime/replica_channel.h"
#include "runtime/signature.h"

namespace distribute::internal {

// The slow path after a SignatureMismatch: every replica exchanges its full
// signature and the same check raises the same detailed error everywhere.
// Checks signatures that every replica of the group has; an error it raises is
// raised by every replica alike (ReplicaChannel::agreed_failure).
void check_agreed(ReplicaChannel& ch, const std::vector<Signature>& sigs, int first_replica, internal::ShapeRule rule,
                  int axis, const internal::LeafNamer& namer, const std::vector<internal::ShapeRule>* rules = nullptr);

[[noreturn]] void explain_mismatch(ReplicaChannel& ch, const Signature& sig, CollectiveCall call, int first_replica,
                                   internal::ShapeRule rule, int axis, const internal::LeafNamer& namer,
                                   const std::vector<internal::ShapeRule>* rules = nullptr);

// Exchanges full signatures (the first round, tagged by op, sequence and
// fields) and checks them; returns all signatures (all_gather needs the
// other replicas' shapes).
std::vector<Signature> agree(ReplicaChannel& ch, const Signature& sig, CollectiveCall call, int first_replica,
                             internal::ShapeRule rule, int axis, const internal::LeafNamer& namer,
                             const std::vector<internal::ShapeRule>* rules = nullptr);

// The common start of every collective: check the context, merge the options,
// take the next sequence number and begin the signature (with the local
// verdict on the options).
struct CollectiveStart {
  CommunicationOptions options;
  CollectiveCall call;
  Signature sig;
};

CollectiveStart begin_collective(ReplicaContext& ctx, const char* op, const CommunicationOptions& options);

internal::LeafNamer namer_for(const std::vector<std::string>& paths);

int first_replica_of_group(const ReplicaContext& ctx);

// A collective's output, which the communicator allocates: out of memory
// there is raised as ResourceExhaustedError naming the collective and the
// size, not a bare std::bad_alloc. The in-process and hierarchical
// backends raise it on every replica alike, before any input is read; the
// defaults of Communicator allocate on each rank alone, and a rank that
// raises it alone aborts the others (the run's abort).
template <class Make>
std::shared_ptr<std::byte> collective_output(const CollectiveCall& call, DType dtype, std::size_t elements,
                                             Make&& make) {
  try {
    return make();
  } catch (const std::bad_alloc&) {
    throw ResourceExhaustedError(
        std::string(call.op) + " #" + std::to_string(call.sequence) + ": out of memory allocating its result, " +
        internal::bytes_text(elements * size_of(dtype)) + " of " + std::string(to_string(dtype)));
  }
}

// The result for `value`, `offset` bytes into a reduced output. Takes its
// reference by value: the replicas share the output's control block, so each
// reference count change is a cache line bounced between cores, and a moved-in
// reference (the lone value's, a pack's last) changes none.
Tensor result_view(std::shared_ptr<std::byte> result, std::size_t offset, const Tensor& value,
                   const std::string& device);

// The reference the `views` views of a pack's output copy. If other
// replicas hold the output too (the engine shared it: a count above 1), one
// whose count is this replica's own: the views (a model's gradients:
// hundreds) copy it, and the output's own count, on a line every replica of
// the process writes, changes once. An output of this replica's own needs
// no second count.
std::shared_ptr<std::byte> reference_for_views(std::shared_ptr<std::byte> result, std::size_t views);

// The structure string of a lone Tensor (a one-leaf nest).
const std::string& leaf_structure();

void add_field(Signature& sig, std::string_view key, std::string_view value);

// A collective's tag hashed from its arguments in place, as the tag of the
// Signature that describes it: a Signature costs heap allocations per leaf
// (hundreds for a model's gradients), and is built only to explain a mismatch.
// `fields(add)` hands the collective's fields to `add`, as all_reduce_fields.
template <class Fields>
internal::TagHasher fields_and_leaves_hash(std::string_view op_name, const Fields& fields,
                                           std::span<const Tensor> leaves) {
  internal::TagHasher tag(op_name);
  fields([&](std::string_view key, std::string_view text) { tag.field(key, text); });
  tag.leaf_count(leaves.size());
  for (const Tensor& t : leaves) tag.leaf(t.dtype(), t.shape().dims_span());
  return tag;
}

}  // namespace distribute::internal
