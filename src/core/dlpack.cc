#include "distribute/dlpack.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor_internal.h"

namespace distribute {
namespace {

// DLPack 0.6 has no bool code; 0.8 added kDLBool = 6. We use that value so that
// newer consumers read our bools as bools.
constexpr std::uint8_t kDLBoolCode = 6;
// The most dimensions an import takes (numpy's limit).
constexpr std::int32_t kMaxImportRank = 64;

struct ExportContext {
  Tensor tensor;  // keeps the storage alive
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  DLManagedTensor managed{};
};

DType from_dl_dtype(const DLDataType& t) {
  auto fail = [&]() -> DType {
    throw InvalidArgumentError("from_dlpack: unsupported dtype (code " + std::to_string(t.code) + ", bits " +
                               std::to_string(t.bits) + ", lanes " + std::to_string(t.lanes) + ")");
  };
  if (t.lanes != 1) return fail();
  switch (t.code) {
    case kDLInt:
      if (t.bits == 8) return DType::kInt8;
      if (t.bits == 16) return DType::kInt16;
      if (t.bits == 32) return DType::kInt32;
      if (t.bits == 64) return DType::kInt64;
      return fail();
    case kDLUInt:
      if (t.bits == 8) return DType::kUInt8;
      return fail();
    case kDLFloat:
      if (t.bits == 16) return DType::kFloat16;
      if (t.bits == 32) return DType::kFloat32;
      if (t.bits == 64) return DType::kFloat64;
      return fail();
    case kDLBfloat:
      if (t.bits == 16) return DType::kBFloat16;
      return fail();
    case kDLBoolCode:
      if (t.bits == 8) return DType::kBool;
      return fail();
    default: return fail();
  }
}

}  // namespace

DLDataType to_dl_dtype(DType dtype) {
  const auto bits = static_cast<std::uint8_t>(size_of(dtype) * 8);
  switch (dtype) {
    case DType::kBool: return {kDLBoolCode, 8, 1};
    case DType::kInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64: return {kDLInt, bits, 1};
    case DType::kUInt8: return {kDLUInt, 8, 1};
    case DType::kFloat16:
    case DType::kFloat32:
    case DType::kFloat64: return {kDLFloat, bits, 1};
    case DType::kBFloat16: return {kDLBfloat, 16, 1};
  }
  throw InvalidArgumentError("to_dl_dtype: " + std::to_string(static_cast<int>(dtype)) + " is not a DType");
}

DLManagedTensor* to_dlpack(const Tensor& t) {
  auto ctx = std::make_unique<ExportContext>();
  // DLPack 0.6 cannot mark memory read-only and its consumers may write:
  // a read-only tensor goes out as a copy.
  ctx->tensor = t.is_read_only() ? t.clone() : t;
  ctx->shape = t.shape().dims();
  ctx->strides.assign(ctx->shape.size(), 1);
  for (int d = t.rank() - 2; d >= 0; --d) {
    ctx->strides[static_cast<std::size_t>(d)] =
        ctx->strides[static_cast<std::size_t>(d) + 1] * ctx->shape[static_cast<std::size_t>(d) + 1];
  }
  DLTensor& dl = ctx->managed.dl_tensor;
  dl.data = ctx->tensor.mutable_raw_data();
  dl.device = {kDLCPU, 0};
  dl.ndim = t.rank();
  dl.dtype = to_dl_dtype(t.dtype());
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  dl.byte_offset = 0;
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = [](DLManagedTensor* self) { delete static_cast<ExportContext*>(self->manager_ctx); };
  return &ctx.release()->managed;
}

Tensor from_dlpack(DLManagedTensor* managed) {
  if (managed == nullptr) throw InvalidArgumentError("from_dlpack: null DLManagedTensor");
  const DLTensor& dl = managed->dl_tensor;
  // Read as a plain integer: a newer DLPack's device types (kDLHexagon = 16
  // and up) are not values of this header's enum.
  std::int32_t device_type = 0;
  static_assert(sizeof device_type == sizeof dl.device.device_type);
  std::memcpy(&device_type, &dl.device.device_type, sizeof device_type);
  if (device_type != kDLCPU && device_type != kDLCUDAHost) {
    throw UnimplementedError("from_dlpack: device type " + std::to_string(device_type) +
                             " is not supported; this build handles CPU memory only");
  }
  // A bad ndim (a DLPack 1.x DLManagedTensorVersioned passed by mistake)
  // would size the dims vector from garbage.
  if (dl.ndim < 0 || dl.ndim > kMaxImportRank) {
    throw InvalidArgumentError("from_dlpack: ndim " + std::to_string(dl.ndim) + " is outside [0, " +
                               std::to_string(kMaxImportRank) + "]");
  }
  const DType dtype = from_dl_dtype(dl.dtype);
  if (dl.dtype.bits != size_of(dtype) * 8) throw InvalidArgumentError("from_dlpack: bit width does not match dtype");
  std::vector<std::int64_t> dims(static_cast<std::size_t>(dl.ndim));
  for (int d = 0; d < dl.ndim; ++d) {
    if (dl.shape == nullptr || dl.shape[d] < 0) {
      throw InvalidArgumentError("from_dlpack: missing or negative dimension " + std::to_string(d));
    }
    dims[static_cast<std::size_t>(d)] = dl.shape[d];
  }
  Shape shape(dims);
  if (dl.strides != nullptr && shape.num_elements() > 0) {
    std::int64_t expected = 1;
    for (int d = dl.ndim - 1; d >= 0; --d) {
      // A dimension of size 1 may carry any stride: it is never stepped over.
      if (dims[static_cast<std::size_t>(d)] != 1 && dl.strides[d] != expected) {
        throw InvalidArgumentError("from_dlpack: only compact row-major tensors are supported; dimension " +
                                   std::to_string(d) + " of shape " + shape.to_string() + " has stride " +
                                   std::to_string(dl.strides[d]) + ", expected " + std::to_string(expected));
      }
      expected *= dims[static_cast<std::size_t>(d)];
    }
  }
  if (dl.data == nullptr && shape.num_elements() > 0) throw InvalidArgumentError("from_dlpack: null data pointer");
  // (Null data is allowed for an empty tensor; no offset is added to it.)
  std::byte* data = dl.data == nullptr ? nullptr : static_cast<std::byte*>(dl.data) + dl.byte_offset;
  // The kernels read elements through typed pointers: a misaligned one is
  // undefined behaviour. (An empty tensor's pointer is never read.)
  if (shape.num_elements() > 0 && reinterpret_cast<std::uintptr_t>(data) % size_of(dtype) != 0) {
    throw InvalidArgumentError("from_dlpack: data + byte_offset " + std::to_string(dl.byte_offset) +
                               " is not aligned to the " + std::to_string(size_of(dtype)) + "-byte elements of " +
                               std::string(to_string(dtype)));
  }
  internal::checked_nbytes(dtype, shape);
  if (dtype == DType::kBool) {
    // A bool byte other than 0 and 1 is true to some kernels and not to
    // others (it printed True, its MIN was False, a cast kept the byte).
    // The memory is the producer's, shared, not copied: refused, not changed.
    const auto n = static_cast<std::size_t>(shape.num_elements());
    const auto* bytes = reinterpret_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) {
      if (bytes[i] > 1) {
        char held[8];
        std::snprintf(held, sizeof held, "0x%02x", bytes[i]);
        throw InvalidArgumentError("from_dlpack: bool element " + std::to_string(i) + " of shape " + shape.to_string() +
                                   " holds the byte " + held +
                                   "; a bool must be 0 or 1 (convert it, e.g. with != 0, before importing)");
      }
    }
  }
  // The Tensor takes `managed` only once it exists: if making it throws (out
  // of memory), nothing was taken and the caller still owns `managed`.
  struct Release {
    DLManagedTensor* owned = nullptr;
    void operator()(std::byte*) const noexcept {
      if (owned != nullptr && owned->deleter) owned->deleter(owned);
    }
  };
  std::shared_ptr<std::byte> storage(data, Release{});
  Tensor t = Tensor::from_shared(storage, dtype, std::move(shape));
  std::get_deleter<Release>(storage)->owned = managed;  // (built with RTTI: get_deleter needs it)
  return t;
}

}  // namespace distribute
