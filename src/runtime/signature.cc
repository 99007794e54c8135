#include "runtime/signature.h"

#include <algorithm>
#include <cstring>
#include <optional>

namespace distribute::internal {
namespace {

class Writer {
 public:
  void u64(std::uint64_t v) { out_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void str(std::string_view s) {
    u64(s.size());
    out_.append(s);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  std::uint64_t u64() {
    need(sizeof(std::uint64_t));
    std::uint64_t v;
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string str() {
    const std::uint64_t n = u64();
    need(n);
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }

 private:
  void need(std::uint64_t n) const {
    if (pos_ + n > in_.size()) throw InternalError("collective signature truncated");
  }
  std::string_view in_;
  std::size_t pos_ = 0;
};

std::string replica_list(const std::vector<int>& members, int first) {
  std::string s;
  for (int m : members) s += (s.empty() ? "" : ", ") + std::to_string(first + m);
  return s;
}

// "replicas 0, 2: SUM; replica 1: MEAN" grouping members by value, in order of first appearance.
std::string describe_values(const std::vector<std::string>& values, int first, std::string_view member) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int m = 0; m < static_cast<int>(values.size()); ++m) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == values[static_cast<std::size_t>(m)]; });
    if (it == groups.end()) {
      groups.push_back({values[static_cast<std::size_t>(m)], {m}});
    } else {
      it->second.push_back(m);
    }
  }
  std::string s;
  for (const auto& [value, members] : groups) {
    s += (s.empty() ? "" : "; ") + std::string(member) + (members.size() > 1 ? "s " : " ") +
         replica_list(members, first) + ": " + value;
  }
  return s;
}

}  // namespace

std::optional<StructureDifference> first_structure_difference(std::string_view a, std::string_view b) {
  struct Open {
    std::size_t start;
    bool dict;
    std::string path;  // of this container
    std::string step;  // of the child being read: ['key'] or [i]
    std::size_t index = 0;
  };
  std::vector<Open> open;
  std::size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) {
    const char c = a[k];
    if (c == '{' || c == '[' || c == '(') {
      const std::string path = open.empty() ? std::string() : open.back().path + open.back().step;
      open.push_back({k, c == '{', path, c == '{' ? std::string() : "[0]"});
    } else if (c == '}' || c == ']' || c == ')') {
      if (!open.empty()) open.pop_back();
    } else if (c == ',' && !open.empty() && !open.back().dict) {
      open.back().step = "[" + std::to_string(++open.back().index) + "]";
    } else if (c == '\'' && !open.empty() && open.back().dict) {
      const std::size_t end = a.find("': ", k + 1);
      if (end == std::string_view::npos || b.compare(k, end + 3 - k, a.substr(k, end + 3 - k)) != 0) break;
      open.back().step = "['" + std::string(a.substr(k + 1, end - k - 1)) + "']";
      k = end + 3;
      continue;
    }
    ++k;
  }
  if (open.size() < 2) return std::nullopt;  // at the top: the whole structures say it
  // The container's text, from its opening bracket to the matching one.
  const auto container = [&](std::string_view text) {
    int depth = 0;
    bool quoted = false;
    for (std::size_t i = open.back().start; i < text.size(); ++i) {
      const char c = text[i];
      if (c == '\'') quoted = !quoted;
      if (quoted) continue;
      if (c == '{' || c == '[' || c == '(') ++depth;
      if ((c == '}' || c == ']' || c == ')') && --depth == 0)
        return std::string(text.substr(open.back().start, i + 1 - open.back().start));
    }
    return std::string(text.substr(open.back().start));
  };
  return StructureDifference{open.back().path, container(a), container(b)};
}

std::string dims_to_string(const std::vector<std::int64_t>& dims) {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  if (dims.size() == 1) s += ",";
  return s + ")";
}

std::string Signature::encode() const {
  Writer w;
  w.str(op);
  w.u64(sequence);
  w.u64(fields.size());
  for (const auto& [k, v] : fields) {
    w.str(k);
    w.str(v);
  }
  w.u64(leaves.size());
  for (const auto& leaf : leaves) {
    w.u64(static_cast<std::uint64_t>(leaf.dtype));
    w.u64(leaf.dims.size());
    for (std::int64_t d : leaf.dims) w.u64(static_cast<std::uint64_t>(d));
  }
  w.u64(error_code ? static_cast<std::uint64_t>(*error_code) + 1 : 0);
  w.str(error);
  return w.take();
}

Signature Signature::decode(std::string_view bytes) {
  Reader r(bytes);
  Signature s;
  s.op = r.str();
  s.sequence = r.u64();
  s.fields.resize(r.u64());
  for (auto& [k, v] : s.fields) {
    k = r.str();
    v = r.str();
  }
  s.leaves.resize(r.u64());
  for (auto& leaf : s.leaves) {
    leaf.dtype = static_cast<DType>(r.u64());
    leaf.dims.resize(r.u64());
    for (auto& d : leaf.dims) d = static_cast<std::int64_t>(r.u64());
  }
  const std::uint64_t code = r.u64();
  if (code) s.error_code = static_cast<ErrorCode>(code - 1);
  s.error = r.str();
  return s;
}

std::uint64_t TagHasher::finish(std::uint64_t sequence, bool local_error) const {
  TagHasher last = *this;
  last.word(sequence);
  std::uint64_t z = last.h_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (z & ~std::uint64_t{1}) | 2u | (local_error ? 1u : 0u);
}

std::uint64_t Signature::tag(bool with_leaves) const {
  TagHasher h(op);
  for (const auto& [k, v] : fields) h.field(k, v);
  if (with_leaves) {
    h.leaf_count(leaves.size());
    for (const auto& leaf : leaves) h.leaf(leaf.dtype, leaf.dims);
  }
  return h.finish(sequence, error_code.has_value());
}

namespace {

// Step 1 of check_signatures: a member that found its own arguments invalid raises its error.
void raise_own_errors(const std::vector<Signature>& sigs, int first, std::string_view member) {
  const int n = static_cast<int>(sigs.size());
  for (int m = 0; m < n; ++m) {
    const Signature& s = sigs[static_cast<std::size_t>(m)];
    if (s.error_code)
      throw_error(*s.error_code, s.op + " #" + std::to_string(s.sequence) + " on " + std::string(member) + " " +
                                     std::to_string(first + m) + ": " + s.error);
  }
}

// Step 2: every member called the same collective at the same point of the program.
void check_same_collective(const std::vector<Signature>& sigs, int first, std::string_view member,
                           const std::string& members) {
  std::vector<std::string> ops;
  bool ops_differ = false;
  for (const auto& s : sigs) {
    ops.push_back(s.op + " #" + std::to_string(s.sequence));
    ops_differ |= ops.back() != ops.front();
  }
  if (ops_differ) {
    throw FailedPreconditionError("Collective mismatch: the " + members + " called different collectives (" +
                                  describe_values(ops, first, member) + "). Every " + std::string(member) +
                                  " must call the same collectives in the same order.");
  }
}

// Step 3: the arguments that must be equal are.
void check_equal_fields(const std::vector<Signature>& sigs, int first, std::string_view member,
                        const std::string& members, const std::string& label) {
  const Signature& s0 = sigs.front();
  for (std::size_t f = 0; f < s0.fields.size(); ++f) {
    std::vector<std::string> values;
    bool differ = false;
    for (const auto& s : sigs) {
      values.push_back(f < s.fields.size() ? s.fields[f].second : std::string("(missing)"));
      differ |= values.back() != values.front();
    }
    if (differ) {
      const std::string& name = s0.fields[f].first;
      std::string msg = label + ": the " + members + " passed different " + name + " (" +
                        describe_values(values, first, member) + ").";
      if (name == "structure") {
        const auto m = static_cast<std::size_t>(
            std::find_if(values.begin(), values.end(), [&](const std::string& v) { return v != values[0]; }) -
            values.begin());
        if (const auto d = first_structure_difference(values[0], values[m])) {
          msg += " They first differ in value" + d->path + ": " + std::string(member) + " " + std::to_string(first) +
                 " has " + d->a + ", " + std::string(member) + " " + std::to_string(first + static_cast<int>(m)) +
                 " has " + d->b + ".";
        }
      }
      if (name == "merge_fn and argument types") throw FailedPreconditionError(msg);
      throw InvalidArgumentError(msg);
    }
  }
}

}  // namespace

void check_signatures(const std::vector<Signature>& sigs, int first, ShapeRule leaves_rule, int axis,
                      const LeafNamer& leaf_name, std::string_view member, const std::vector<ShapeRule>* leaf_rules) {
  const std::string members = std::string(member) + "s";
  const Signature& s0 = sigs.front();
  const std::string label = s0.op + " #" + std::to_string(s0.sequence);

  // 1. A replica found its own arguments invalid: everyone raises its error.
  raise_own_errors(sigs, first, member);
  // 2. Different collectives, or the same one at different points of the program.
  check_same_collective(sigs, first, member, members);
  // 3. Arguments that must be equal.
  check_equal_fields(sigs, first, member, members, label);
  // 4. Leaves: how many (equal structures give equal counts, so this is a
  // last guard before each leaf is read), then dtype and shape, one by one.
  {
    std::vector<std::string> counts;
    bool differ = false;
    for (const auto& s : sigs) {
      counts.push_back(std::to_string(s.leaves.size()));
      differ |= s.leaves.size() != s0.leaves.size();
    }
    if (differ) {
      throw InvalidArgumentError(label + ": the " + members + " passed different numbers of tensors (" +
                                 describe_values(counts, first, member) + ").");
    }
  }
  for (std::size_t i = 0; i < s0.leaves.size(); ++i) {
    const ShapeRule rule = leaf_rules != nullptr && i < leaf_rules->size() ? (*leaf_rules)[i] : leaves_rule;
    const std::string name = leaf_name ? leaf_name(i) : std::string();
    const std::string what = name.empty() ? std::string("the value") : "value " + name;
    std::vector<std::string> dtypes, shapes;
    bool dtype_differs = false, rank_differs = false;
    for (const auto& s : sigs) {
      const LeafSignature& leaf = s.leaves[i];
      dtypes.emplace_back(to_string(leaf.dtype));
      shapes.push_back(dims_to_string(leaf.dims));
      dtype_differs |= dtypes.back() != dtypes.front();
      rank_differs |= leaf.dims.size() != s0.leaves[i].dims.size();
    }
    if (dtype_differs) {
      throw InvalidArgumentError(label + ": " + what + " has different dtypes on different " + members + " (" +
                                 describe_values(dtypes, first, member) + ").");
    }
    if (rank_differs) {
      throw InvalidArgumentError(label + ": Ranks of all input tensors should match: " + what + " has shapes " +
                                 describe_values(shapes, first, member) + ".");
    }
    const auto& d0 = s0.leaves[i].dims;
    const int leaf_axis =
        axis < 0 ? axis + static_cast<int>(d0.size()) : axis;  // per leaf: ranks may differ between leaves
    for (std::size_t d = 0; d < d0.size(); ++d) {
      if (rule == ShapeRule::kAllButAxis && static_cast<int>(d) == leaf_axis) continue;
      if (rule == ShapeRule::kAllButFirst && d == 0) continue;
      bool differ = false;
      for (const auto& s : sigs) differ |= s.leaves[i].dims[d] != d0[d];
      if (!differ) continue;
      if (rule == ShapeRule::kEqual) {
        throw InvalidArgumentError(label + ": " + what + " has different shapes on different " + members + " (" +
                                   describe_values(shapes, first, member) + "); " + s0.op + " needs equal shapes.");
      }
      throw InvalidArgumentError(label + ": Shape mismatch: Dimension " + std::to_string(d) + " of " + what +
                                 " must be equal on every " + std::string(member) + " (" +
                                 describe_values(shapes, first, member) + "); only dimension " +
                                 std::to_string(rule == ShapeRule::kAllButAxis ? leaf_axis : 0) + " may differ.");
    }
  }
}

}  // namespace distribute::internal
