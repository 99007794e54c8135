// File: internal/merge_types.h
//
// Not part of the API: what ReplicaContext::merge_call's template hands the
// runtime about its instantiation. Include replica_context.h, never this
// header.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <typeinfo>
#include <vector>

namespace distribute::internal {

// The types of a merge_fn and its arguments, which the replicas of one
// merge_call must agree on: readable, for errors, and as a digest, for the
// check of every call, and the types themselves: two types of one name
// (lambdas, or types in unnamed namespaces, of different files) have the
// same names and digest. Made once per merge_call instantiation.
struct MergeTypes {
  std::string names;
  std::uint64_t digest = 0;
  std::vector<const std::type_info*> types;
};
MergeTypes merge_types(std::initializer_list<const std::type_info*> types);

}  // namespace distribute::internal
