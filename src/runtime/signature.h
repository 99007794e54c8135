// The signature of one collective call: what every replica exchanges before
// any data moves (op, sequence number, reduce op / axis / structure, dtypes
// and shapes, and the replica's local verdict on its own arguments). Every
// replica runs the same checks on the same signatures, so a mismatch raises
// the same error, with the same message, on every replica.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "distribute/dtype.h"
#include "distribute/errors.h"

namespace distribute::internal {

struct LeafSignature {
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> dims;
};

struct Signature {
  std::string op;
  std::uint64_t sequence = 0;
  // Named values that must be equal on every replica ("reduce op", "axis", "structure", ...).
  std::vector<std::pair<std::string, std::string>> fields;
  std::vector<LeafSignature> leaves;
  // The replica's own verdict on its arguments, found before the exchange.
  std::optional<ErrorCode> error_code;
  std::string error;

  void set_error(const Error& e) {
    if (!error_code) {
      error_code = e.code();
      error = e.message();
    }
  }
  std::string encode() const;
  static Signature decode(std::string_view bytes);
  // A 64-bit hash of what must agree across replicas: op, sequence, fields
  // and, if `with_leaves`, every leaf's dtype and shape. Never 0; bit 0 is set
  // when this replica recorded a local error (so the tags can never agree).
  std::uint64_t tag(bool with_leaves) const;
};

// Signature::tag computed from the parts, without building a Signature: a
// collective's fast path hashes its arguments where they are, and builds the
// full Signature only to explain a mismatch. Feed it what Signature::tag
// reads, in the same order (op, fields, then the leaves); finish() mixes in
// the sequence last, so that the rest can be kept from call to call (CallMemo).
//
// Eight bytes at a time, each word mixed in by a multiply and a shift (as
// splitmix64's steps), then splitmix64's finaliser. A signature is about 150
// bytes; FNV-1a, byte by byte, spent a quarter of the API's fixed cost per
// collective on it (perf, 8-byte all_reduce). Inline, so that the constant
// keys of a call site fold into the code.
class TagHasher {
 public:
  explicit TagHasher(std::string_view op) { str(op); }
  // Goes on from a state() kept earlier.
  static TagHasher resume(std::uint64_t state) {
    TagHasher h;
    h.h_ = state;
    return h;
  }
  void field(std::string_view key, std::string_view value) {
    str(key);
    str(value);
  }
  void leaf_count(std::size_t n) { word(n); }
  void leaf(DType dtype, std::span<const std::int64_t> dims) {
    word(static_cast<std::uint64_t>(dtype));
    word(dims.size());
    bytes(dims.data(), dims.size_bytes());
  }
  std::uint64_t state() const { return h_; }
  // Never 0; bit 0 set if `local_error`.
  std::uint64_t finish(std::uint64_t sequence, bool local_error) const;

 private:
  TagHasher() = default;
  void word(std::uint64_t w) {
    h_ = (h_ ^ w) * 0xbf58476d1ce4e5b9ull;
    h_ ^= h_ >> 31;
  }
  void bytes(const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (; n >= 8; c += 8, n -= 8) {
      std::uint64_t w;
      std::memcpy(&w, c, 8);
      word(w);
    }
    if (n == 0) return;  // (the length was hashed before the bytes)
    std::uint64_t tail = 0;
    std::memcpy(&tail, c, n);
    word(tail);
  }
  void str(std::string_view s) {
    word(s.size());
    bytes(s.data(), s.size());
  }
  std::uint64_t h_ = 0x9e3779b97f4a7c15ull;
};

// What a collective of one value works out from its arguments before any
// data moves, kept from the last call: a replica issues the same collective
// step after step. `state` is the tag less the sequence (hashing the fields,
// about 150 bytes in one multiply chain, was a third of the API's own cost per
// call); `extra`, what else the call site keeps (all_gather: its layout).
// Keyed on the value's dtype and dims and on `Key`, the call site's other
// arguments (reduce op and bytes_per_pack, or axis): all that both depend on.
template <class Extra = std::monostate>
class CallMemo {
 public:
  using Key = std::array<std::int64_t, 2>;
  struct Entry {
    std::uint64_t state = 0;
    Extra extra{};
  };
  // The entry for these arguments, from make() where the memo has another.
  // Valid until the next get().
  template <class Make>
  const Entry& get(const Key& key, DType dtype, std::span<const std::int64_t> dims, Make&& make) {
    if (valid_ && key == key_ && dtype == dtype_ && std::ranges::equal(dims, dims_)) return entry_;
    valid_ = false;  // until the new key is whole (make() may throw)
    entry_ = make();
    key_ = key;
    dtype_ = dtype;
    dims_.assign(dims.begin(), dims.end());
    valid_ = true;
    return entry_;
  }

 private:
  bool valid_ = false;
  Key key_{};
  DType dtype_ = DType::kFloat32;
  std::vector<std::int64_t> dims_;
  Entry entry_;
};

// How leaf shapes must agree.
enum class ShapeRule {
  kEqual,        // all_reduce: identical shapes
  kAllButAxis,   // all_gather: same rank, equal except along `axis`
  kAllButFirst,  // IndexedSlices values: equal except dimension 0
};

// Names leaf i for messages, e.g. "['b'][1]" (empty for a single value).
using LeafNamer = std::function<std::string(std::size_t)>;

// Throws the agreed error if the signatures disagree or any replica reported a
// local error. `first_replica` is the global id of member 0, and `member`
// what a member is ("replica", or "worker" for cross-replica collectives of
// several processes), for messages.
// `axis` (kAllButAxis) may be negative: it is normalised by each leaf's rank.
// `leaf_rules`, if given, holds a rule per leaf in place of `rule` (a nest of
// dense tensors and IndexedSlices: kEqual for one, kAllButFirst for the other).
void check_signatures(const std::vector<Signature>& sigs, int first_replica, ShapeRule rule, int axis,
                      const LeafNamer& leaf_name, std::string_view member = "replica",
                      const std::vector<ShapeRule>* leaf_rules = nullptr);

std::string dims_to_string(const std::vector<std::int64_t>& dims);

// Where two structure strings (Nest::structure_string) first differ: the
// path of the innermost container around the difference (as flatten_paths
// writes paths) and that container's text in each. nullopt if they differ at
// the top level. Keys are read as written ('key': ...); a key holding "': "
// may mislead the path, never the check itself.
struct StructureDifference {
  std::string path, a, b;
};
std::optional<StructureDifference> first_structure_difference(std::string_view a, std::string_view b);

}  // namespace distribute::internal
