#include "distribute/options.h"

#include <cstdio>
#include <string>

#include "core/ascii_case.h"
#include "distribute/errors.h"
#include "distribute/reduce_op.h"

namespace distribute {
namespace {
std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

}  // namespace

std::string_view to_string(CommunicationImplementation impl) {
  switch (impl) {
    case CommunicationImplementation::kAuto: return "AUTO";
    case CommunicationImplementation::kRing: return "RING";
    case CommunicationImplementation::kNccl: return "NCCL";
  }
  return "UNKNOWN";
}

CommunicationImplementation communication_implementation_from_string(std::string_view name) {
  const std::string u = internal::ascii_upper(name);
  if (u == "AUTO") return CommunicationImplementation::kAuto;
  if (u == "RING") return CommunicationImplementation::kRing;
  if (u == "NCCL") return CommunicationImplementation::kNccl;
  throw InvalidArgumentError(
      "Argument `implementation` must be instance of "
      "`tf.distribute.experimental.CommunicationImplementation` (AUTO, RING or NCCL), got '" +
      std::string(name) + "'");
}

CommunicationOptions CommunicationOptions::merge(const CommunicationOptions& other) const {
  CommunicationOptions merged = *this;
  if (other.bytes_per_pack != 0) merged.bytes_per_pack = other.bytes_per_pack;
  if (other.timeout.has_value()) merged.timeout = other.timeout;
  if (other.implementation != CommunicationImplementation::kAuto) merged.implementation = other.implementation;
  return merged;
}

void CommunicationOptions::validate() const {
  if (bytes_per_pack < 0) {
    throw InvalidArgumentError("Argument `bytes_per_pack` must be >=0, Received " + std::to_string(bytes_per_pack) +
                               ".");
  }
  if (timeout && !(timeout->count() >= 0)) {  // (NaN fails this too)
    throw InvalidArgumentError(
        "Argument `timeout` must be a number of seconds >= 0 (0 or infinity: no limit), Received " +
        seconds_text(timeout->count()) + ".");
  }
  switch (implementation) {
    case CommunicationImplementation::kAuto:
    case CommunicationImplementation::kRing:
    case CommunicationImplementation::kNccl: return;
  }
  throw InvalidArgumentError(
      "Argument `implementation` must be instance of `tf.distribute.experimental.CommunicationImplementation`.");
}

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "SUM";
    case ReduceOp::kMean: return "MEAN";
    case ReduceOp::kMin: return "MIN";
    case ReduceOp::kMax: return "MAX";
    case ReduceOp::kProduct: return "PRODUCT";
  }
  return "UNKNOWN";
}

ReduceOp reduce_op_from_string(std::string_view name) {
  const std::string u = internal::ascii_upper(name);
  for (ReduceOp op : kAllReduceOps) {
    if (to_string(op) == u) return op;
  }
  throw InvalidArgumentError("'" + std::string(name) +
                             "' is not a valid ReduceOp; expected SUM, MEAN, MIN, MAX or PRODUCT");
}

}  // namespace distribute
