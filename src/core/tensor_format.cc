// Printing of tensors the way TensorFlow's eager repr shows them, which is
// numpy's repr of the value: shortest round-trip digits per element, columns
// padded to a common width, scientific notation for wide magnitude ranges,
// lines wrapped at 75 characters and arrays of more than 1000 elements
// summarised with "..." (3 items at each edge).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "distribute/tensor.h"

namespace distribute {
namespace {

constexpr int kLineWidth = 75;
constexpr std::int64_t kSummaryThreshold = 1000;
constexpr std::int64_t kEdgeItems = 3;

// A finite nonzero value as digits d0.d1d2... x 10^exp (shortest round trip for its dtype).
struct Decimal {
  bool negative = false;
  std::string digits;  // no leading zeros; "0" for zero
  int exp = 0;
};

Decimal parse_scientific(const char* text) {
  Decimal d;
  const char* p = text;
  if (*p == '-') {
    d.negative = true;
    ++p;
  }
  for (; *p && *p != 'e' && *p != 'E'; ++p) {
    if (*p != '.') d.digits += *p;
  }
  if (*p) d.exp = std::atoi(p + 1);
  while (d.digits.size() > 1 && d.digits.back() == '0') d.digits.pop_back();
  if (d.digits == "0") d.exp = 0;
  return d;
}

Decimal shortest(double v, DType dtype) {
  char buf[64];
  if (dtype == DType::kFloat64) {
    auto r = std::to_chars(buf, buf + sizeof buf - 1, v, std::chars_format::scientific);
    *r.ptr = '\0';
    return parse_scientific(buf);
  }
  if (dtype == DType::kFloat32) {
    auto r = std::to_chars(buf, buf + sizeof buf - 1, static_cast<float>(v), std::chars_format::scientific);
    *r.ptr = '\0';
    return parse_scientific(buf);
  }
  // 16-bit floats: the fewest significant digits that convert back to the same bits.
  const float f = static_cast<float>(v);
  for (int precision = 1; precision <= 9; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision - 1, static_cast<double>(f));
    const float back = std::strtof(buf, nullptr);
    const bool same = dtype == DType::kFloat16 ? float16(back).bits == float16(f).bits
                                               : bfloat16(back).bits == bfloat16(f).bits;
    if (same) return parse_scientific(buf);
  }
  std::snprintf(buf, sizeof buf, "%.8e", static_cast<double>(f));
  return parse_scientific(buf);
}

// Integer part (with sign) and fraction digits of the positional form.
std::pair<std::string, std::string> positional(const Decimal& d) {
  std::string int_part;
  std::string frac;
  if (d.exp >= 0) {
    const auto n = static_cast<std::size_t>(d.exp) + 1;
    int_part = d.digits.substr(0, std::min(n, d.digits.size()));
    if (d.digits.size() < n) int_part.append(n - d.digits.size(), '0');
    if (d.digits.size() > n) frac = d.digits.substr(n);
  } else {
    int_part = "0";
    frac = std::string(static_cast<std::size_t>(-d.exp - 1), '0') + d.digits;
  }
  return {(d.negative ? "-" : "") + int_part, frac};
}

std::string exponent_text(int exp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return buf;
}

std::string special_text(double v) {
  if (std::isnan(v)) return "nan";
  return v < 0 ? "-inf" : "inf";
}

// Python's repr of a float scalar: 2.0, 0.1, 1e-05, 1.5e+16.
std::string float_scalar_text(double v, DType dtype) {
  if (!std::isfinite(v)) return special_text(v);
  const Decimal d = shortest(v, dtype);
  const double a = std::fabs(v);
  if (a != 0 && (a < 1e-4 || a >= 1e16)) {
    std::string s = (d.negative ? "-" : "") + d.digits.substr(0, 1);
    if (d.digits.size() > 1) s += "." + d.digits.substr(1);
    return s + exponent_text(d.exp);
  }
  auto [int_part, frac] = positional(d);
  return int_part + "." + (frac.empty() ? "0" : frac);
}

// An integer element, exactly (64-bit values do not pass through double).
std::string integer_text(const Tensor& t, std::int64_t offset) {
  return visit_dtype(t.dtype(), [&](auto tag) -> std::string {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      return std::to_string(static_cast<long long>(reinterpret_cast<const T*>(t.raw_data())[offset]));
    } else {
      return {};
    }
  });
}

// Which indices of an axis of length n are shown.
std::vector<std::int64_t> shown_indices(std::int64_t n, bool summarize) {
  std::vector<std::int64_t> idx;
  if (summarize && n > 2 * kEdgeItems) {
    for (std::int64_t i = 0; i < kEdgeItems; ++i) idx.push_back(i);
    idx.push_back(-1);  // "..."
    for (std::int64_t i = n - kEdgeItems; i < n; ++i) idx.push_back(i);
  } else {
    for (std::int64_t i = 0; i < n; ++i) idx.push_back(i);
  }
  return idx;
}

class ArrayFormatter {
 public:
  explicit ArrayFormatter(const Tensor& t) : t_(t), summarize_(t.num_elements() > kSummaryThreshold) {
    collect(0, 0);
    prepare();
  }

  // numpy's repr: array([...], dtype=...)
  std::string repr() const {
    const std::string prefix = "array(";
    std::string body;
    int line_len = static_cast<int>(prefix.size());
    format(0, 0, static_cast<int>(prefix.size()), body, line_len);
    std::string s = prefix + body;
    const DType d = t_.dtype();
    if (d != DType::kFloat64 && d != DType::kInt64 && d != DType::kBool) {
      s += ", dtype=" + std::string(to_string(d));
    }
    return s + ")";
  }

 private:
  void collect(int axis, std::int64_t offset) {
    if (axis == t_.rank()) {
      values_.push_back(t_.element_as_double(offset));
      offsets_.push_back(offset);
      return;
    }
    std::int64_t stride = 1;
    for (int d = axis + 1; d < t_.rank(); ++d) stride *= t_.shape()[d];
    for (std::int64_t i : shown_indices(t_.shape()[axis], summarize_)) {
      if (i >= 0) collect(axis + 1, offset + i * stride);
    }
  }

  void prepare() {
    const DType d = t_.dtype();
    if (!is_floating(d)) {
      for (std::size_t i = 0; i < values_.size(); ++i) {
        std::string s = d == DType::kBool ? (values_[i] != 0 ? "True" : "False") : integer_text(t_, offsets_[i]);
        width_ = std::max(width_, static_cast<int>(s.size()));
        texts_.push_back(s);
      }
      for (auto& s : texts_) s = std::string(static_cast<std::size_t>(width_) - s.size(), ' ') + s;
      return;
    }
    double max_abs = 0, min_abs = 0;
    bool any = false;
    for (double v : values_) {
      if (!std::isfinite(v) || v == 0) continue;
      const double a = std::fabs(v);
      max_abs = any ? std::max(max_abs, a) : a;
      min_abs = any ? std::min(min_abs, a) : a;
      any = true;
    }
    const bool scientific = any && (max_abs >= 1e8 || min_abs < 1e-4 || max_abs / min_abs > 1e3);
    std::vector<std::string> ints, fracs, exps;
    std::size_t int_w = 0, frac_w = 0;
    for (double v : values_) {
      if (!std::isfinite(v)) {
        ints.push_back(special_text(v));
        fracs.emplace_back();
        exps.emplace_back();
        continue;
      }
      const Decimal dec = shortest(v, d);
      if (scientific) {
        ints.push_back((dec.negative ? "-" : "") + dec.digits.substr(0, 1));
        fracs.push_back(dec.digits.substr(1));
        exps.push_back(exponent_text(dec.exp));
      } else {
        auto [ip, fp] = positional(dec);
        ints.push_back(ip);
        fracs.push_back(fp);
        exps.emplace_back();
      }
      int_w = std::max(int_w, ints.back().size());
      frac_w = std::max(frac_w, fracs.back().size());
    }
    for (std::size_t i = 0; i < values_.size(); ++i) {
      std::string s;
      if (!std::isfinite(values_[i])) {
        s = ints[i];
      } else {
        s = std::string(int_w - ints[i].size(), ' ') + ints[i] + "." + fracs[i];
        s += std::string(frac_w - fracs[i].size(), scientific ? '0' : ' ') + exps[i];
      }
      texts_.push_back(s);
    }
    for (const auto& s : texts_) width_ = std::max(width_, static_cast<int>(s.size()));
    for (auto& s : texts_) s = std::string(static_cast<std::size_t>(width_) - s.size(), ' ') + s;
  }

  // Appends the bracketed block of `axis`; returns the next value index.
  std::size_t format(int axis, std::size_t next, int indent, std::string& out, int& line_len) const {
    out += "[";
    ++line_len;
    const auto idx = shown_indices(t_.shape()[axis], summarize_);
    const bool last_axis = axis == t_.rank() - 1;
    for (std::size_t k = 0; k < idx.size(); ++k) {
      if (k > 0) {
        if (last_axis) {
          const std::size_t item_len = idx[k] < 0 ? 3 : texts_[next].size();
          if (line_len + 2 + static_cast<int>(item_len) + 1 > kLineWidth) {
            out += ",\n" + std::string(static_cast<std::size_t>(indent + 1), ' ');
            line_len = indent + 1;
          } else {
            out += ", ";
            line_len += 2;
          }
        } else {
          out += "," + std::string(static_cast<std::size_t>(t_.rank() - axis - 1), '\n') +
                 std::string(static_cast<std::size_t>(indent + 1), ' ');
          line_len = indent + 1;
        }
      }
      if (idx[k] < 0) {
        out += "...";
        line_len += 3;
      } else if (last_axis) {
        out += texts_[next];
        line_len += static_cast<int>(texts_[next].size());
        ++next;
      } else {
        next = format(axis + 1, next, indent + 1, out, line_len);
      }
    }
    out += "]";
    ++line_len;
    return next;
  }

  const Tensor& t_;
  bool summarize_;
  std::vector<double> values_;
  std::vector<std::int64_t> offsets_;
  std::vector<std::string> texts_;
  int width_ = 0;
};

std::string scalar_text(const Tensor& t, double v) {
  if (t.dtype() == DType::kBool) return v != 0 ? "True" : "False";
  if (is_floating(t.dtype())) return float_scalar_text(v, t.dtype());
  return {};
}

void list_text(const Tensor& t, int axis, std::int64_t offset, std::string& out) {
  if (axis == t.rank()) {
    out += is_integer(t.dtype()) ? integer_text(t, offset) : scalar_text(t, t.element_as_double(offset));
    return;
  }
  std::int64_t stride = 1;
  for (int d = axis + 1; d < t.rank(); ++d) stride *= t.shape()[d];
  out += "[";
  for (std::int64_t i = 0; i < t.shape()[axis]; ++i) {
    if (i) out += ", ";
    list_text(t, axis + 1, offset + i * stride, out);
  }
  out += "]";
}

}  // namespace

std::string Tensor::numpy_repr() const {
  if (rank() == 0) {
    return is_integer(dtype_) ? integer_text(*this, 0) : scalar_text(*this, element_as_double(0));
  }
  if (num_elements() == 0) {
    std::string s = "array([]";
    if (rank() != 1) s += ", shape=" + shape_.to_string();
    return s + ", dtype=" + std::string(to_string(dtype_)) + ")";
  }
  return ArrayFormatter(*this).repr();
}

std::string Tensor::repr() const {
  std::string value = numpy_repr();
  if (value.find('\n') != std::string::npos) value = "\n" + value;
  return "<tf.Tensor: shape=" + shape_.to_string() + ", dtype=" + std::string(to_string(dtype_)) +
         ", numpy=" + value + ">";
}

std::string Tensor::to_list_string() const {
  std::string out;
  list_text(*this, 0, 0, out);
  return out;
}

}  // namespace distribute
