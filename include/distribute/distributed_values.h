// File: distributed_values.h
//
// DistributedValues: one value per local replica. PerReplica<T> holds values
// that may differ; Mirrored<T> holds values known to be identical (the result
// of an all-reduce or a broadcast). Strategy::run returns PerReplica<R>;
// a PerReplica or Mirrored argument to run is split so that replica i sees its
// own component, as tf.distribute's select_replica does.
//
//   PerReplica<Tensor> r = strategy.run(fn);
//   std::cout << r;            // PerReplica:{
//                              //   0: <tf.Tensor: ...>,
//                              //   1: <tf.Tensor: ...>
//                              // }
//   auto locals = strategy.experimental_local_results(r);  // std::vector<Tensor>
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "distribute/errors.h"
#include "distribute/indexed_slices.h"
#include "distribute/nest.h"
#include "distribute/tensor.h"

namespace distribute {

template <class T>
class DistributedValues {
 public:
  using value_type = T;
  DistributedValues() = default;
  explicit DistributedValues(std::vector<T> values) : values_(std::move(values)) {}

  // One value per local replica, in local replica order.
  const std::vector<T>& values() const { return values_; }
  std::vector<T>& mutable_values() { return values_; }
  std::size_t size() const { return values_.size(); }
  const T& operator[](std::size_t i) const { return component(i); }
  const T& component(std::size_t i) const {
    if (i >= values_.size()) {
      throw OutOfRangeError("DistributedValues: replica " + std::to_string(i) + " out of range; there are " +
                            std::to_string(values_.size()) + " components");
    }
    return values_[i];
  }
  // The first component, as tf's `_primary`.
  const T& primary() const { return component(0); }

  friend bool operator==(const DistributedValues& a, const DistributedValues& b) { return a.values_ == b.values_; }

 private:
  std::vector<T> values_;
};

// Values that may differ between replicas.
template <class T>
class PerReplica : public DistributedValues<T> {
 public:
  using DistributedValues<T>::DistributedValues;
  static constexpr const char* kName = "PerReplica";
};

// Values known to be the same on every replica.
template <class T>
class Mirrored : public DistributedValues<T> {
 public:
  using DistributedValues<T>::DistributedValues;
  static constexpr const char* kName = "Mirrored";
};

template <class T>
inline constexpr bool is_distributed_values_v = false;
template <class T>
inline constexpr bool is_distributed_values_v<PerReplica<T>> = true;
template <class T>
inline constexpr bool is_distributed_values_v<Mirrored<T>> = true;

// ---- select_replica: what replica i sees of a value -----------------------
// A PerReplica/Mirrored gives its i-th component; std::tuple, std::pair,
// std::vector, std::optional and std::map (its values) are mapped
// element-wise, as TensorFlow's select_replica maps tuples, lists and dicts;
// a Tensor, a Nest<Tensor>'s leaves and an IndexedSlices' tensors are shared
// read-only; anything else is shared unchanged.
template <class T>
struct ReplicaSelection {
  using type = T;
  static const T& select(std::size_t, const T& v) { return v; }
  static constexpr bool kDistributed = false;
};
template <class T>
struct ReplicaSelection<PerReplica<T>> {
  using type = T;
  static const T& select(std::size_t i, const PerReplica<T>& v) { return v.component(i); }
  static constexpr bool kDistributed = true;
};
template <class T>
struct ReplicaSelection<Mirrored<T>> {
  using type = T;
  static const T& select(std::size_t i, const Mirrored<T>& v) { return v.component(i); }
  static constexpr bool kDistributed = true;
};
// A Tensor every replica receives (an argument of run, a merge_fn's result)
// is one storage for all of them: each gets it read-only, as an all_reduce
// result, so that a write by one replica cannot race with the others' reads
// (TensorFlow's tensors are immutable). clone() gives a writable copy.
template <>
struct ReplicaSelection<Tensor> {
  using type = Tensor;
  static Tensor select(std::size_t, const Tensor& v) { return v.as_read_only(); }
  static constexpr bool kDistributed = false;
};
template <>
struct ReplicaSelection<Nest<Tensor>> {
  using type = Nest<Tensor>;
  static Nest<Tensor> select(std::size_t, const Nest<Tensor>& v) {
    return v.map([](const Tensor& leaf) { return leaf.as_read_only(); });
  }
  static constexpr bool kDistributed = false;
};
// (Elements are selected and held by value, their types decayed: an element
// that is a reference, to a Tensor say, gets the replica's own read-only
// copy, never a reference to a temporary.)
template <class... Ts>
struct ReplicaSelection<std::tuple<Ts...>> {
  using type = std::tuple<typename ReplicaSelection<std::decay_t<Ts>>::type...>;
  static type select(std::size_t i, const std::tuple<Ts...>& v) {
    return std::apply(
        [i](const auto&... e) { return type(ReplicaSelection<std::decay_t<decltype(e)>>::select(i, e)...); }, v);
  }
  static constexpr bool kDistributed = (ReplicaSelection<std::decay_t<Ts>>::kDistributed || ...);
};
template <class A, class B>
struct ReplicaSelection<std::pair<A, B>> {
  using type =
      std::pair<typename ReplicaSelection<std::decay_t<A>>::type, typename ReplicaSelection<std::decay_t<B>>::type>;
  static type select(std::size_t i, const std::pair<A, B>& v) {
    return type(ReplicaSelection<std::decay_t<A>>::select(i, v.first),
                ReplicaSelection<std::decay_t<B>>::select(i, v.second));
  }
  static constexpr bool kDistributed =
      ReplicaSelection<std::decay_t<A>>::kDistributed || ReplicaSelection<std::decay_t<B>>::kDistributed;
};
template <class T>
struct ReplicaSelection<std::vector<T>> {
  using type = std::vector<typename ReplicaSelection<T>::type>;
  static type select(std::size_t i, const std::vector<T>& v) {
    type out;
    out.reserve(v.size());
    for (const auto& e : v) out.push_back(ReplicaSelection<T>::select(i, e));
    return out;
  }
  static constexpr bool kDistributed = ReplicaSelection<T>::kDistributed;
};

// (The element types of an optional and a map's values are taken without
// const, as a tuple's are decayed: a const Tensor is a Tensor here too.)
template <class T>
struct ReplicaSelection<std::optional<T>> {
  using Element = ReplicaSelection<std::remove_cv_t<T>>;
  using type = std::optional<typename Element::type>;
  static type select(std::size_t i, const std::optional<T>& v) {
    if (!v) return std::nullopt;
    return type(std::in_place, Element::select(i, *v));
  }
  static constexpr bool kDistributed = Element::kDistributed;
};
template <class K, class V, class Compare>
struct ReplicaSelection<std::map<K, V, Compare>> {
  using Element = ReplicaSelection<std::remove_cv_t<V>>;
  using type = std::map<K, typename Element::type, Compare>;
  static type select(std::size_t i, const std::map<K, V, Compare>& v) {
    type out(v.key_comp());
    for (const auto& [key, value] : v) out.emplace_hint(out.end(), key, Element::select(i, value));
    return out;
  }
  static constexpr bool kDistributed = Element::kDistributed;
};
// Its values and indices, read-only, as a Tensor's.
template <>
struct ReplicaSelection<IndexedSlices> {
  using type = IndexedSlices;
  static IndexedSlices select(std::size_t, const IndexedSlices& v) { return v.as_read_only(); }
  static constexpr bool kDistributed = false;
};

template <class T>
using select_replica_t = typename ReplicaSelection<std::decay_t<T>>::type;

template <class T>
decltype(auto) select_replica(std::size_t replica, const T& value) {
  return ReplicaSelection<T>::select(replica, value);
}

// ---- printing ---------------------------------------------------------------

// TensorFlow's layout: "PerReplica:{\n  0: ...,\n  1: ...\n}".
template <class D>
requires is_distributed_values_v<D> std::string repr(const D& d) {
  std::string s = std::string(D::kName) + ":{\n";
  for (std::size_t i = 0; i < d.size(); ++i) {
    s += "  " + std::to_string(i) + ": " + internal::leaf_repr(d.values()[i]);
    s += i + 1 < d.size() ? ",\n" : "\n";
  }
  return s + "}";
}

template <class D>
requires is_distributed_values_v<D> std::ostream& operator<<(std::ostream& os, const D& d) { return os << repr(d); }

// Python's repr of a list of values: "[a, b]".
template <class T>
std::string repr(const std::vector<T>& values) {
  std::string s = "[";
  for (std::size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + internal::leaf_repr(values[i]);
  return s + "]";
}

// Python's repr of a tuple, laid out as TensorFlow prints local results:
// "(a,\n b)"; a one-element tuple is "(a,)".
template <class T>
std::string repr_tuple(const std::vector<T>& values) {
  std::string s = "(";
  for (std::size_t i = 0; i < values.size(); ++i) s += (i ? ",\n " : "") + internal::leaf_repr(values[i]);
  if (values.size() == 1) s += ",";
  return s + ")";
}

}  // namespace distribute
