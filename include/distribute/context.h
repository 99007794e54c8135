// File: context.h
//
// Which context the current thread is in, as tf.distribute's module-level
// functions report it. There are three modes (docs/semantics.md, "Contexts"):
//   default replica mode: no strategy entered; get_replica_context() is the
//     default replica context (replica 0 of 1);
//   cross-replica mode: inside strategy.scope() or a merge_fn;
//     get_replica_context() is nullptr;
//   replica mode: inside the function given to Strategy::run.
//
//   auto* ctx = distribute::get_replica_context();
//   if (ctx == nullptr) { /* cross-replica: use strategy.reduce / gather */ }
//
// The mode is per thread, as TensorFlow's mode stack is per thread.
#pragma once

#include <string>

namespace distribute {

class ReplicaContext;
class Strategy;

// The current replica context: the default one outside any strategy, the
// replica's own inside Strategy::run, nullptr in a cross-replica context.
ReplicaContext* get_replica_context();
// True in strategy.scope() and inside merge_fn.
bool in_cross_replica_context();
// The strategy of the cross-replica context, or nullptr (TensorFlow's
// deprecated get_cross_replica_context()).
Strategy* get_cross_replica_context();
// The current strategy; the default strategy when none was entered.
Strategy& get_strategy();
// True when get_strategy() is not the default strategy.
bool has_strategy();
// Makes `strategy` the current strategy of this thread outside any `scope()`
// (nullptr: back to the default). Inside a scope it throws
// FailedPreconditionError, as TensorFlow raises RuntimeError. Destroying
// the strategy on this thread unsets it, unless a scope of it is entered on
// top; on another thread, while it is set here, it ends the program
// (~Strategy).
void experimental_set_strategy(Strategy* strategy);

// tf.distribute.experimental.ValueContext: what a value function knows of
// the replica it makes a value for.
class ValueContext {
 public:
  explicit ValueContext(int replica_id_in_sync_group = 0, int num_replicas_in_sync = 1);
  int replica_id_in_sync_group() const { return replica_id_; }
  int num_replicas_in_sync() const { return num_replicas_; }
  // TensorFlow's str(): "tf.distribute.ValueContext(replica id 1,  total replicas in sync: 2)".
  std::string to_string() const;

 private:
  int replica_id_;
  int num_replicas_;
};

}  // namespace distribute
