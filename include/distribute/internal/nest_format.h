// File: internal/nest_format.h
//
// Not part of the API: how nest.h and distributed_values.h spell what they
// print (path steps in errors, kind names, leaves). Include nest.h, never
// this header.
#pragma once

#include <cstddef>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

namespace distribute {

enum class NestKind;  // nest.h

namespace internal {

// Formats one path step the way Python indexes: [1] or ['key'].
inline std::string path_step(std::size_t index) { return "[" + std::to_string(index) + "]"; }
inline std::string path_step(const std::string& key) { return "['" + key + "']"; }
// "leaf", "list", "tuple", "dict".
std::string_view nest_kind_name(NestKind kind);

// repr(leaf) where one exists (found by argument-dependent lookup where the
// leaf's type is declared: Tensor, Nest, IndexedSlices), Python's True/False
// for bool, else operator<<.
template <class T>
std::string leaf_repr(const T& leaf) {
  if constexpr (requires { repr(leaf); }) {
    return repr(leaf);
  } else if constexpr (std::is_same_v<T, bool>) {
    return leaf ? "True" : "False";
  } else {
    std::ostringstream os;
    os << leaf;
    return os.str();
  }
}

}  // namespace internal
}  // namespace distribute
