// File: internal/variable_update.h
//
// Not part of the API: how update() writes a distributed variable's
// components (StrategyExtended::update, optimizers). variables.h includes it
// after its classes, whose members these templates call; include
// variables.h, never this header.
#pragma once

#include <cstddef>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "distribute/distributed_values.h"
#include "distribute/errors.h"
#include "distribute/internal/access.h"
#include "distribute/nest.h"
#include "distribute/tensor.h"

namespace distribute {

class Variable;

namespace internal {

// Throws unless every replica passed the same variable to `api` (merge_fn side).
void check_same_variable(const PerReplica<Variable>& vars, std::string_view api);
// `value`, or a copy of it when its bytes overlap a component of `var` (a
// view of w.value()): a write of every component must read the value as it
// was before the first component changed.
Tensor value_apart_from(const Variable& var, const Tensor& value);
template <class T>
const T& value_apart_from(const Variable&, const T& value) {
  return value;
}
inline Nest<Tensor> value_apart_from(const Variable& var, const Nest<Tensor>& value) {
  return value.map([&var](const Tensor& leaf) { return value_apart_from(var, leaf); });
}
// Writes `fn`'s effect into every component of `var`, component i seeing
// select_replica(i, args)..., under the component's device.
template <class Fn, class... Args>
auto update_variable_components(Variable& var, Fn& fn, const Args&... given) {
  using R = std::decay_t<std::invoke_result_t<Fn&, Tensor&, select_replica_t<Args>...>>;
  // update(w, fn, w.value()): every component sees the value from before fn
  // changed component 0.
  const std::tuple<decltype(value_apart_from(var, given))...> held(value_apart_from(var, given)...);
  // fn on component i. A component fn replaced with a tensor of another
  // dtype or shape gets its own tensor back (check_component), also when fn
  // then throws.
  auto one = [&](std::size_t i, const Tensor& before) {
    DeviceScope device(var.values()[i].device());
    try {
      return std::apply(
          [&](const auto&... args) { return fn(Access::mutable_component(var, i), select_replica(i, args)...); }, held);
    } catch (...) {
      try {
        Access::check_component(var, i, "update", before);
      } catch (const Error&) {
      }
      throw;  // fn's own exception
    }
  };
  if constexpr (std::is_void_v<R>) {
    for (std::size_t i = 0; i < var.size(); ++i) {
      const Tensor before = var.values()[i];
      one(i, before);
      Access::check_component(var, i, "update", before);
    }
  } else {
    std::vector<R> out;
    out.reserve(var.size());
    for (std::size_t i = 0; i < var.size(); ++i) {
      const Tensor before = var.values()[i];
      R result = one(i, before);
      if constexpr (std::is_same_v<R, Tensor>) {
        Access::check_component(var, i, "update", before, &result);  // fn may return the component it installed
      } else {
        Access::check_component(var, i, "update", before);
      }
      out.push_back(std::move(result));
    }
    return Mirrored<R>(std::move(out));
  }
}
}  // namespace internal
}  // namespace distribute
