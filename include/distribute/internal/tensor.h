// File: internal/tensor.h
//
// Not part of the API: what tensor.h's templates and the strategies'
// templates need of the tensor layer (the device scope new tensors are
// placed in, the untyped constructor behind constant()). Include tensor.h,
// never this header.
#pragma once

#include <string>

#include "distribute/dtype.h"

namespace distribute {

class Shape;
class Tensor;

namespace internal {

// The device new tensors are placed on when none is given, as TensorFlow's
// `with tf.device(...)` scope: kHostDevice, or the replica's device inside
// Strategy::run (the runtime sets it on each replica thread).
const std::string& default_device();
class DeviceScope {
 public:
  explicit DeviceScope(const std::string& device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  const std::string* previous_;
};

// constant(values, shape) once the values are bytes of `dtype`.
Tensor make_constant(DType dtype, Shape shape, const void* data);

}  // namespace internal
}  // namespace distribute
