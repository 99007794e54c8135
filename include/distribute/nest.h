// File: nest.h
//
// Nest<T>: a nested structure of leaves of type T, as tf.nest sees Python
// values: a leaf, a list, a tuple, or a dict with string keys. flatten()
// visits leaves in TensorFlow's order: lists and tuples in order, dicts by
// sorted key. Structure mismatches throw InvalidArgumentError naming the path,
// e.g. "['b'][1]". A nest is at most kMaxDepth levels deep (a deeper one is
// refused with InvalidArgumentError when it is built): its walks recurse, and
// a replica thread's stack must hold them.
//
//   using N = Nest<Tensor>;
//   N v = N::dict({{"a", constant({0})}, {"b", N::list({constant({1}), constant({2})})}});
//   std::vector<Tensor> leaves = v.flatten();          // a, b[0], b[1]
//   N w = N::pack_sequence_as(v, leaves);              // same structure again
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "distribute/errors.h"
#include "distribute/internal/nest_format.h"  // IWYU pragma: export

namespace distribute {

enum class NestKind { kLeaf, kList, kTuple, kDict };

template <class T>
class Nest {
 public:
  using Items = std::vector<std::pair<std::string, Nest>>;  // sorted by key, unique
  // The most levels of lists, tuples and dicts one inside another (Python's
  // default recursion limit, which bounds tf.nest likewise).
  static constexpr std::size_t kMaxDepth = 1000;

  // A leaf.
  Nest(T leaf) : node_(std::move(leaf)) {}  // NOLINT: implicit, a leaf is a nest
  // A leaf of a type that converts to T: a Tensor or an IndexedSlices is a
  // leaf of a Nest<TensorOrSlices>.
  template <class U>
  requires(!std::is_same_v<std::decay_t<U>, T> && !std::is_same_v<std::decay_t<U>, Nest> && std::is_convertible_v<U, T>)
      Nest(U&& leaf)
      : node_(T(std::forward<U>(leaf))) {}  // NOLINT: implicit, as the leaf itself
  Nest() : depth_(1), node_(List{}) {}      // an empty list

  static Nest list(std::vector<Nest> items) { return Nest(List{std::move(items)}); }
  static Nest tuple(std::vector<Nest> items) { return Nest(Tuple{std::move(items)}); }
  // Keys are sorted; a repeated key throws InvalidArgumentError.
  static Nest dict(Items items) {
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (std::size_t i = 1; i < items.size(); ++i) {
      if (items[i].first == items[i - 1].first) {
        throw InvalidArgumentError("Nest::dict: key '" + items[i].first + "' appears twice");
      }
    }
    return Nest(Dict{std::move(items)});
  }

  NestKind kind() const { return static_cast<NestKind>(node_.index()); }
  // Levels of lists, tuples and dicts: 0 for a leaf, 1 for a list of leaves.
  std::size_t depth() const { return depth_; }
  bool is_leaf() const { return kind() == NestKind::kLeaf; }

  const T& leaf() const {
    if (!is_leaf()) throw InvalidArgumentError("Nest::leaf: this nest is a " + kind_name());
    return std::get<T>(node_);
  }
  // Children of a list or tuple.
  const std::vector<Nest>& items() const {
    if (kind() == NestKind::kList) return std::get<List>(node_).items;
    if (kind() == NestKind::kTuple) return std::get<Tuple>(node_).items;
    throw InvalidArgumentError("Nest::items: this nest is a " + kind_name());
  }
  // Key/value pairs of a dict, sorted by key.
  const Items& dict_items() const {
    if (kind() != NestKind::kDict) throw InvalidArgumentError("Nest::dict_items: this nest is a " + kind_name());
    return std::get<Dict>(node_).items;
  }
  // Number of direct children (1 for a leaf).
  std::size_t size() const {
    switch (kind()) {
      case NestKind::kLeaf: return 1;
      case NestKind::kDict: return dict_items().size();
      default: return items().size();
    }
  }
  const Nest& operator[](std::size_t i) const {
    const auto& v = items();
    if (i >= v.size()) {
      throw OutOfRangeError("Nest: index " + std::to_string(i) + " out of range for " + kind_name() + " of size " +
                            std::to_string(v.size()));
    }
    return v[i];
  }
  // An int overload, so that n[0] is not ambiguous with the const char* key.
  const Nest& operator[](int i) const {
    if (i < 0) throw OutOfRangeError("Nest: negative index " + std::to_string(i));
    return (*this)[static_cast<std::size_t>(i)];
  }
  const Nest& operator[](const std::string& key) const {
    const auto& d = dict_items();
    auto it = std::lower_bound(d.begin(), d.end(), key,
                               [](const auto& item, const std::string& k) { return item.first < k; });
    if (it == d.end() || it->first != key) throw NotFoundError("Nest: no key '" + key + "'");
    return it->second;
  }
  const Nest& operator[](const char* key) const { return (*this)[std::string(key)]; }

  std::vector<T> flatten() const {
    std::vector<T> out;
    out.reserve(num_leaves());
    for_each_leaf([&](const T& leaf) { out.push_back(leaf); });
    return out;
  }
  // The path of every leaf, in flatten() order: "['b'][1]" ("" for a lone leaf).
  std::vector<std::string> flatten_paths() const {
    std::vector<std::string> out;
    collect_paths("", out);
    return out;
  }
  std::size_t num_leaves() const {
    std::size_t n = 0;
    for_each_leaf([&](const T&) { ++n; });
    return n;
  }
  template <class F>
  void for_each_leaf(F&& f) const {
    switch (kind()) {
      case NestKind::kLeaf: f(std::get<T>(node_)); return;
      case NestKind::kDict:
        for (const auto& [key, child] : dict_items()) child.for_each_leaf(f);
        return;
      default:
        for (const auto& child : items()) child.for_each_leaf(f);
    }
  }

  // The same structure with f applied to every leaf.
  template <class F>
  auto map(F&& f) const -> Nest<std::decay_t<std::invoke_result_t<F&, const T&>>> {
    using U = std::decay_t<std::invoke_result_t<F&, const T&>>;
    switch (kind()) {
      case NestKind::kLeaf: return Nest<U>(f(std::get<T>(node_)));
      case NestKind::kDict: {
        typename Nest<U>::Items out;
        for (const auto& [key, child] : dict_items()) out.emplace_back(key, child.map(f));
        return Nest<U>::dict(std::move(out));
      }
      default: {
        std::vector<Nest<U>> out;
        out.reserve(items().size());
        for (const auto& child : items()) out.push_back(child.map(f));
        return kind() == NestKind::kList ? Nest<U>::list(std::move(out)) : Nest<U>::tuple(std::move(out));
      }
    }
  }

  // Rebuilds `structure` with the leaves `flat`, in flatten() order.
  template <class U>
  static Nest pack_sequence_as(const Nest<U>& structure, std::vector<T> flat) {
    if (flat.size() != structure.num_leaves()) {
      throw InvalidArgumentError("pack_sequence_as: structure has " + std::to_string(structure.num_leaves()) +
                                 " leaves but " + std::to_string(flat.size()) + " values were given");
    }
    std::size_t next = 0;
    return structure.map([&](const U&) { return std::move(flat[next++]); });
  }

  // A canonical text of the structure alone, e.g. "{'a': *, 'b': [*, *]}".
  std::string structure_string() const {
    std::string s;
    append_structure(s);
    return s;
  }
  // structure_string() of a list of `n` leaves, "[*, *, ...]", without the list.
  static std::string list_of_leaves_structure(std::size_t n) {
    std::string s = "[";
    s.reserve(3 * n + 2);
    for (std::size_t i = 0; i < n; ++i) s += i ? ", *" : "*";
    return s + "]";
  }

  std::string kind_name() const { return std::string(internal::nest_kind_name(kind())); }

  friend bool operator==(const Nest& a, const Nest& b) { return a.node_ == b.node_; }

 private:
  // Appends structure_string() to `s` (one string, no temporaries: a nest of
  // hundreds of gradients is described on every all_reduce of it).
  void append_structure(std::string& s) const {
    switch (kind()) {
      case NestKind::kLeaf: s += '*'; return;
      case NestKind::kDict: {
        s += '{';
        bool first = true;
        for (const auto& [key, child] : dict_items()) {
          s += first ? "'" : ", '";
          // A quote or backslash in a key is escaped, so that no two
          // structures print alike ({"a': *, 'b": x} is not {"a": x, "b": y}).
          for (const char ch : key) {
            if (ch == '\'' || ch == '\\') s += '\\';
            s += ch;
          }
          s += "': ";
          child.append_structure(s);
          first = false;
        }
        s += '}';
        return;
      }
      default: {
        const bool list = kind() == NestKind::kList;
        s += list ? '[' : '(';
        const auto& v = items();
        for (std::size_t i = 0; i < v.size(); ++i) {
          if (i) s += ", ";
          v[i].append_structure(s);
        }
        if (!list && v.size() == 1) s += ',';
        s += list ? ']' : ')';
        return;
      }
    }
  }

  // (Written out, not defaulted: clang checks a defaulted comparison when the
  // struct is complete, and Nest is not complete yet.)
  struct List {
    std::vector<Nest> items;
    friend bool operator==(const List& a, const List& b) { return a.items == b.items; }
  };
  struct Tuple {
    std::vector<Nest> items;
    friend bool operator==(const Tuple& a, const Tuple& b) { return a.items == b.items; }
  };
  struct Dict {
    Items items;
    friend bool operator==(const Dict& a, const Dict& b) { return a.items == b.items; }
  };
  void collect_paths(const std::string& prefix, std::vector<std::string>& out) const {
    switch (kind()) {
      case NestKind::kLeaf: out.push_back(prefix); return;
      case NestKind::kDict:
        for (const auto& [key, child] : dict_items()) child.collect_paths(prefix + internal::path_step(key), out);
        return;
      default:
        for (std::size_t i = 0; i < items().size(); ++i) items()[i].collect_paths(prefix + internal::path_step(i), out);
    }
  }
  explicit Nest(List l) : depth_(depth_over(l.items)), node_(std::move(l)) {}
  explicit Nest(Tuple t) : depth_(depth_over(t.items)), node_(std::move(t)) {}
  explicit Nest(Dict d) : depth_(depth_over(d.items)), node_(std::move(d)) {}
  // One more than the deepest child's; InvalidArgumentError past kMaxDepth.
  template <class Children>
  static std::size_t depth_over(const Children& children) {
    std::size_t deepest = 0;
    for (const auto& child : children) {
      if constexpr (requires { child.second; }) {
        deepest = std::max(deepest, child.second.depth_);
      } else {
        deepest = std::max(deepest, child.depth_);
      }
    }
    if (deepest + 1 > kMaxDepth) {
      throw InvalidArgumentError("Nest: more than " + std::to_string(kMaxDepth) +
                                 " levels of lists, tuples and dicts one inside another are not supported (the "
                                 "walks over a nest recurse, and a thread's stack must hold them)");
    }
    return deepest + 1;
  }

  std::size_t depth_ = 0;
  std::variant<T, List, Tuple, Dict> node_;
};

// Throws InvalidArgumentError if a and b differ in structure; the message names
// the first differing path ("['b'][1]") and what each side has there.
template <class A, class B>
void assert_same_structure(const Nest<A>& a, const Nest<B>& b, const std::string& path = "") {
  auto where = [&] { return path.empty() ? std::string("the top level") : path; };
  if (a.kind() != b.kind()) {
    throw InvalidArgumentError("The two structures don't have the same nested structure: at " + where() + " one is a " +
                               a.kind_name() + " and the other a " + b.kind_name());
  }
  if (a.kind() == NestKind::kLeaf) return;
  if (a.size() != b.size()) {
    throw InvalidArgumentError("The two structures don't have the same nested structure: at " + where() + " the " +
                               a.kind_name() + "s have " + std::to_string(a.size()) + " and " +
                               std::to_string(b.size()) + " elements");
  }
  if (a.kind() == NestKind::kDict) {
    const auto& da = a.dict_items();
    const auto& db = b.dict_items();
    for (std::size_t i = 0; i < da.size(); ++i) {
      if (da[i].first != db[i].first) {
        throw InvalidArgumentError("The two structures don't have the same nested structure: at " + where() +
                                   " the keys differ ('" + da[i].first + "' vs '" + db[i].first + "')");
      }
      assert_same_structure(da[i].second, db[i].second, path + internal::path_step(da[i].first));
    }
    return;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    assert_same_structure(a.items()[i], b.items()[i], path + internal::path_step(i));
  }
}

// Python-like printing: [a, b], (a,), {'k': v}; leaves with repr(leaf) if
// available, else operator<<.
template <class T>
std::string repr(const Nest<T>& n);

template <class T>
std::string repr(const Nest<T>& n) {
  switch (n.kind()) {
    case NestKind::kLeaf: return internal::leaf_repr(n.leaf());
    case NestKind::kDict: {
      std::string s = "{";
      bool first = true;
      for (const auto& [key, child] : n.dict_items()) {
        s += (first ? "'" : ", '") + key + "': " + repr(child);
        first = false;
      }
      return s + "}";
    }
    default: {
      const bool list = n.kind() == NestKind::kList;
      std::string s = list ? "[" : "(";
      const auto& v = n.items();
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + repr(v[i]);
      if (!list && v.size() == 1) s += ",";
      return s + (list ? "]" : ")");
    }
  }
}

template <class T>
std::ostream& operator<<(std::ostream& os, const Nest<T>& n) {
  return os << repr(n);
}

}  // namespace distribute
