// File: internal/run_on_replicas.h
//
// Not part of the API: the templates behind Strategy::run,
// StrategyExtended::call_for_each_replica and update (how a replica function
// is called, how per-replica results are checked and regrouped). strategy.h
// includes it after its classes, whose members these templates call; include
// strategy.h, never this header.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "distribute/distributed_values.h"
#include "distribute/internal/access.h"
#include "distribute/nest.h"
#include "distribute/replica_context.h"

namespace distribute {

class Strategy;

namespace internal {
// Returns by value: an argument may reach fn as a temporary (a Tensor every
// replica receives is the replica's read-only copy), and a reference fn
// returns to it must not outlive this call.
template <class Fn, class... Args>
auto invoke_replica_fn(ReplicaContext& ctx, Fn& fn, const Args&... args) {
  const auto i = static_cast<std::size_t>(ctx.local_replica_id());
  if constexpr (std::is_invocable_v<Fn&, ReplicaContext&, select_replica_t<Args>...>) {
    return fn(ctx, select_replica(i, args)...);
  } else {
    static_assert(std::is_invocable_v<Fn&, select_replica_t<Args>...>,
                  "the replica function must be callable as fn(args...) or fn(ReplicaContext&, args...)");
    return fn(select_replica(i, args)...);
  }
}

template <class Fn, class... Args>
using replica_result_t = std::decay_t<decltype(invoke_replica_fn(std::declval<ReplicaContext&>(), std::declval<Fn&>(),
                                                                 std::declval<const Args&>()...))>;

void check_components(std::size_t given, const Strategy& s, std::string_view what);

// Calls count(components) for every PerReplica/Mirrored in `value`, at its
// top or inside the tuples, pairs, vectors, optionals and maps that
// select_replica maps; a type it does not know is not looked into.
template <class T, class Count>
void for_each_component_count([[maybe_unused]] const T& value, [[maybe_unused]] Count& count) {
  if constexpr (!ReplicaSelection<T>::kDistributed) {
    return;
  } else if constexpr (is_distributed_values_v<T>) {
    count(value.size());
  } else if constexpr (requires { std::tuple_size<T>::value; }) {  // std::tuple, std::pair
    std::apply([&](const auto&... e) { (for_each_component_count(e, count), ...); }, value);
  } else if constexpr (requires { value.has_value(); }) {  // std::optional
    if (value) for_each_component_count(*value, count);
  } else if constexpr (requires { typename T::mapped_type; }) {  // std::map
    for (const auto& entry : value) for_each_component_count(entry.second, count);
  } else if constexpr (std::ranges::range<T>) {  // std::vector
    for (const auto& e : value) for_each_component_count(e, count);
  }
}

// Checks every distributed value among `args`, nested ones too, for one
// component per local replica of `s` (check_components, naming `api`).
template <class... Args>
void check_component_counts(const Strategy& s, std::string_view api, const Args&... args) {
  [[maybe_unused]] auto count = [&](std::size_t components) { check_components(components, s, api); };
  (for_each_component_count(args, count), ...);
}

// The structure of a replica function's result, for the check that every
// replica returned the same one (TensorFlow's regroup refuses results of
// different structures): a Nest's structure_string(); vectors as lists,
// tuples and pairs as tuples, maps as dicts (keys as operator<< prints
// them), an optional as its value or None; "*" for anything else.
template <class T>
struct ResultStructure {
  static constexpr bool kNested = false;
  static void append(std::string& s, const T&) { s += '*'; }
};
template <class T>
constexpr bool kNestedResult = ResultStructure<T>::kNested;
template <class T>
struct ResultStructure<Nest<T>> {
  static constexpr bool kNested = true;
  static void append(std::string& s, const Nest<T>& v) { s += v.structure_string(); }
};
template <class T>
struct ResultStructure<std::vector<T>> {
  static constexpr bool kNested = true;
  static void append(std::string& s, const std::vector<T>& v) {
    s += '[';
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) s += ", ";
      ResultStructure<T>::append(s, v[i]);
    }
    s += ']';
  }
};
template <class... Ts>
struct ResultStructure<std::tuple<Ts...>> {
  static constexpr bool kNested = true;
  static void append(std::string& s, const std::tuple<Ts...>& v) {
    s += '(';
    std::size_t i = 0;
    std::apply(
        [&](const auto&... e) {
          ((s += (i++ ? ", " : ""), ResultStructure<std::decay_t<decltype(e)>>::append(s, e)), ...);
        },
        v);
    s += sizeof...(Ts) == 1 ? ",)" : ")";
  }
};
template <class A, class B>
struct ResultStructure<std::pair<A, B>> {
  static constexpr bool kNested = true;
  static void append(std::string& s, const std::pair<A, B>& v) {
    s += '(';
    ResultStructure<A>::append(s, v.first);
    s += ", ";
    ResultStructure<B>::append(s, v.second);
    s += ')';
  }
};
template <class T>
struct ResultStructure<std::optional<T>> {
  static constexpr bool kNested = true;
  static void append(std::string& s, const std::optional<T>& v) {
    if (v) {
      ResultStructure<T>::append(s, *v);
    } else {
      s += "None";
    }
  }
};
template <class K, class V, class Compare>
struct ResultStructure<std::map<K, V, Compare>> {
  static constexpr bool kNested = true;
  static void append(std::string& s, const std::map<K, V, Compare>& v) {
    s += '{';
    bool first = true;
    for (const auto& [key, value] : v) {
      s += first ? "'" : ", '";
      if constexpr (requires(std::ostream & os, const K& k) { os << k; }) {
        std::ostringstream k;
        k << key;
        s += k.str();
      } else {
        s += '?';  // a key that cannot be printed: the keys' count is compared still
      }
      s += "': ";
      ResultStructure<V>::append(s, value);
      first = false;
    }
    s += '}';
  }
};
// InvalidArgumentError: the replicas (from `first_replica`) returned results
// of these different structures; names them and the first difference.
[[noreturn]] void throw_different_result_structures(std::string_view api, int first_replica,
                                                    const std::vector<std::string>& structures);
template <class R>
void check_result_structures(std::string_view api, int first_replica, const std::vector<R>& values) {
  if constexpr (kNestedResult<R>) {
    std::vector<std::string> structures(values.size());
    bool differ = false;
    for (std::size_t i = 0; i < values.size(); ++i) {
      ResultStructure<R>::append(structures[i], values[i]);
      differ = differ || structures[i] != structures[0];
    }
    if (differ) throw_different_result_structures(api, first_replica, structures);
  }
}

template <class Fn, class... Args>
auto run_on_replicas(Strategy& s, std::string_view api, Fn& fn, const Args&... args) {
  // Before any replica starts: a value with too few components would fail
  // in some replicas only, and one with too many would pass unnoticed.
  check_component_counts(s, api, args...);
  using R = replica_result_t<Fn, Args...>;
  if constexpr (std::is_void_v<R>) {
    internal::Access::run_replicas(
        s, [&](ReplicaContext& ctx) { invoke_replica_fn(ctx, fn, args...); }, api);
  } else {
    std::vector<std::optional<R>> results(static_cast<std::size_t>(s.num_local_replicas()));
    internal::Access::run_replicas(
        s,
        [&](ReplicaContext& ctx) {
          results[static_cast<std::size_t>(ctx.local_replica_id())].emplace(invoke_replica_fn(ctx, fn, args...));
        },
        api);
    std::vector<R> values;
    values.reserve(results.size());
    for (auto& r : results) values.push_back(std::move(*r));
    check_result_structures(api, s.first_replica_id(), values);
    return PerReplica<R>(std::move(values));
  }
}

// What update() in a replica context hands each replica: the whole result,
// its own copy, with every tensor in it a read-only view, as select_replica
// makes them (alone, as a Nest<Tensor>'s leaf, in a tuple, pair, vector,
// optional or map, an IndexedSlices' tensors). The components are one
// storage for every replica (and often the variable's own), so a write
// through one replica's result would race with the others' reads; clone()
// to write.
template <class R>
Mirrored<R> replica_copy_of_update_result(const Mirrored<R>& whole) {
  if constexpr (!ReplicaSelection<R>::kDistributed && std::is_same_v<select_replica_t<R>, R>) {
    std::vector<R> values;
    values.reserve(whole.size());
    for (std::size_t i = 0; i < whole.size(); ++i) values.push_back(select_replica(i, whole.component(i)));
    return Mirrored<R>(std::move(values));
  } else {
    return whole;  // a type select_replica would change: shared as it is
  }
}
}  // namespace internal

}  // namespace distribute
