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
#include <cstring>
#include <string>
#include <tuple>
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
    const bool same =
        dtype == DType::kFloat16 ? float16(back).bits == float16(f).bits : bfloat16(back).bits == bfloat16(f).bits;
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

// numpy's array repr (FloatingFormat, IntegerFormat, BoolFormat and
// _formatArray of numpy/core/arrayprint.py, default options: precision 8,
// floatmode 'maxprec', linewidth 75, threshold 1000, edgeitems 3).
class ArrayFormatter {
 public:
  explicit ArrayFormatter(const Tensor& t) : t_(t), summarize_(t.num_elements() > kSummaryThreshold) {
    collect(0, 0);
    prepare();
  }

  std::string repr() const {
    const std::string prefix = "array(";
    // As numpy's array2string: continuation lines are indented past "array([",
    // and the width leaves room for the "," or ")" that follows.
    std::string body = format(0, std::string(prefix.size() + 1, ' '), kLineWidth - 1);
    std::string s = prefix + body + ",";
    const DType d = t_.dtype();
    if (d == DType::kFloat64 || d == DType::kInt64 || d == DType::kBool) {
      s.back() = ')';
      return s;
    }
    const std::string dtype = "dtype=" + std::string(to_string(d));
    const std::size_t last_line = s.size() - (s.rfind('\n') == std::string::npos ? 0 : s.rfind('\n') + 1);
    // numpy moves the dtype to its own line when the last line would pass the width.
    if (last_line + 1 + dtype.size() + 1 > static_cast<std::size_t>(kLineWidth)) {
      s += "\n" + std::string(prefix.size(), ' ');
    } else {
      s += " ";
    }
    return s + dtype + ")";
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
    if (d == DType::kBool) {
      for (double v : values_) texts_.push_back(v != 0 ? " True" : "False");
      return;
    }
    if (!is_floating(d)) {
      std::size_t width = 0;
      for (std::int64_t off : offsets_) {
        texts_.push_back(integer_text(t_, off));
        width = std::max(width, texts_.back().size());
      }
      for (auto& s : texts_) s = std::string(width - s.size(), ' ') + s;
      return;
    }
    prepare_floats();
  }

  // Digits of a finite value printed positionally as numpy's dragon4 does with
  // unique=True, precision=8: shortest round-trip digits, at most 8 after the
  // point (rounded), every digit before it.
  static std::pair<std::string, std::string> positional_parts(double v, DType d) {
    const Decimal dec = shortest(v, d);
    const int frac_len = std::max(0, static_cast<int>(dec.digits.size()) - 1 - dec.exp);
    char buf[400];
    if (frac_len == 0) {  // the value is an integer: print it exactly
      std::snprintf(buf, sizeof buf, "%.0f", v);
      return {buf, ""};
    }
    if (frac_len > 8) {
      std::snprintf(buf, sizeof buf, "%.8f", v);
      std::string text = buf;
      const auto dot = text.find('.');
      std::string frac = text.substr(dot + 1);
      while (!frac.empty() && frac.back() == '0') frac.pop_back();
      return {text.substr(0, dot), frac};
    }
    return positional(dec);
  }

  // Mantissa digits after the point that numpy's scientific form needs (<= 8).
  static int scientific_digits(double v, DType d) {
    const Decimal dec = shortest(v, d);
    if (dec.digits.size() - 1 <= 8) return static_cast<int>(dec.digits.size()) - 1;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.8e", v);
    std::string mant(buf, std::strchr(buf, 'e'));
    while (mant.back() == '0') mant.pop_back();
    return static_cast<int>(mant.size() - mant.find('.') - 1);
  }

  void prepare_floats() {
    const DType d = t_.dtype();
    double max_abs = 0, min_abs = 0;
    bool any_nonzero = false, any_finite = false, neg_inf = false, any_nonfinite = false;
    for (double v : values_) {
      if (!std::isfinite(v)) {
        any_nonfinite = true;
        neg_inf |= std::isinf(v) && v < 0;
        continue;
      }
      any_finite = true;
      if (v == 0) continue;
      const double a = std::fabs(v);
      max_abs = any_nonzero ? std::max(max_abs, a) : a;
      min_abs = any_nonzero ? std::min(min_abs, a) : a;
      any_nonzero = true;
    }
    const bool scientific = any_nonzero && (max_abs >= 1e8 || min_abs < 1e-4 || max_abs / min_abs > 1e3);
    std::vector<std::string> ints(values_.size()), fracs(values_.size()), exps(values_.size()), tails(values_.size());
    std::size_t pad_left = 0, pad_right = 0;
    if (scientific) {
      int precision = 0;
      int exp_size = 2;
      for (double v : values_) {
        if (std::isfinite(v)) precision = std::max(precision, scientific_digits(v, d));
      }
      for (std::size_t i = 0; i < values_.size(); ++i) {
        if (!std::isfinite(values_[i])) continue;
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.*e", precision, values_[i]);
        std::string text = buf;
        const auto e = text.find('e');
        const auto dot = text.find('.');
        ints[i] = text.substr(0, dot == std::string::npos ? e : dot);
        fracs[i] = dot == std::string::npos ? "" : text.substr(dot + 1, e - dot - 1);
        exps[i] = text.substr(e + 1);  // "+05", "-100"
        exp_size = std::max(exp_size, static_cast<int>(exps[i].size()) - 1);
      }
      for (std::size_t i = 0; i < values_.size(); ++i) {
        if (!std::isfinite(values_[i])) continue;
        std::string digits = exps[i].substr(1);
        exps[i] =
            "e" + exps[i].substr(0, 1) + std::string(static_cast<std::size_t>(exp_size) - digits.size(), '0') + digits;
        pad_left = std::max(pad_left, ints[i].size());
      }
      pad_right = static_cast<std::size_t>(exp_size + 2 + precision);
      for (std::size_t i = 0; i < values_.size(); ++i) tails[i] = "." + fracs[i] + exps[i];
      emit(ints, tails, pad_left, pad_right, any_nonfinite, neg_inf);
      return;
    }
    for (std::size_t i = 0; i < values_.size(); ++i) {
      if (!std::isfinite(values_[i])) continue;
      std::tie(ints[i], fracs[i]) = positional_parts(values_[i], d);
      pad_left = std::max(pad_left, ints[i].size());
      pad_right = std::max(pad_right, fracs[i].size());
    }
    if (!any_finite) pad_left = pad_right = 0;
    for (std::size_t i = 0; i < values_.size(); ++i)
      tails[i] = "." + fracs[i] + std::string(pad_right - fracs[i].size(), ' ');
    emit(ints, tails, pad_left, pad_right, any_nonfinite, neg_inf);
  }

  // Right-aligns every finite value's integer part to pad_left and prints
  // non-finite values right-aligned in the full width (numpy makes room for
  // "nan" and "-inf" by widening pad_left).
  void emit(const std::vector<std::string>& ints, const std::vector<std::string>& tails, std::size_t pad_left,
            std::size_t pad_right, bool any_nonfinite, bool neg_inf) {
    if (any_nonfinite) {
      const std::size_t offset = pad_right + 1;
      const std::size_t inf_len = 3 + (neg_inf ? 1 : 0);
      pad_left = std::max({pad_left, 3 > offset ? 3 - offset : 0, inf_len > offset ? inf_len - offset : 0});
    }
    for (std::size_t i = 0; i < values_.size(); ++i) {
      if (!std::isfinite(values_[i])) {
        const std::string special = special_text(values_[i]);
        const std::size_t width = pad_left + pad_right + 1;
        texts_.push_back(std::string(width > special.size() ? width - special.size() : 0, ' ') + special);
      } else {
        texts_.push_back(std::string(pad_left - ints[i].size(), ' ') + ints[i] + tails[i]);
      }
    }
  }

  // numpy's _extendLine_pretty for one-line words.
  static void extend_line(std::string& s, std::string& line, const std::string& word, std::size_t width,
                          const std::string& hanging_indent) {
    bool wrap = line.size() + word.size() > width;
    if (line.size() <= hanging_indent.size()) wrap = false;  // wrapping would not help
    if (wrap) {
      while (!line.empty() && line.back() == ' ') line.pop_back();
      s += line + "\n";
      line = hanging_indent;
    }
    line += word;
  }

  // numpy's _formatArray recurser, from the block at `axis` whose first value
  // is texts_[next_].
  std::string format(int axis, const std::string& hanging_indent, int width) const {
    const int axes_left = t_.rank() - axis;
    const std::string next_indent = hanging_indent + " ";
    const int next_width = width - 1;  // len(']')
    const auto idx = shown_indices(t_.shape()[axis], summarize_);
    std::string s;
    if (axes_left == 1) {
      const auto elem_width = static_cast<std::size_t>(width - 1);  // max(len(','), len(']'))
      std::string line = hanging_indent;
      for (std::size_t k = 0; k < idx.size(); ++k) {
        const std::string word = idx[k] < 0 ? std::string("...") : texts_[next_++];
        extend_line(s, line, word, elem_width, hanging_indent);
        if (k + 1 < idx.size()) line += ", ";
      }
      s += line;
    } else {
      const std::string line_sep = "," + std::string(static_cast<std::size_t>(axes_left - 1), '\n');
      for (std::size_t k = 0; k < idx.size(); ++k) {
        const std::string nested = idx[k] < 0 ? std::string("...") : format(axis + 1, next_indent, next_width);
        s += hanging_indent + nested;
        if (k + 1 < idx.size()) s += line_sep;
      }
    }
    return "[" + s.substr(hanging_indent.size()) + "]";
  }

  const Tensor& t_;
  bool summarize_;
  std::vector<double> values_;
  std::vector<std::int64_t> offsets_;
  std::vector<std::string> texts_;
  mutable std::size_t next_ = 0;
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
  // Python lists every empty row; past numpy's summary threshold (as for
  // shape (2^62, 0)) the rows between the first and last three are "...".
  const std::int64_t n = t.shape()[axis];
  const bool summarize = t.num_elements() == 0 && n > kSummaryThreshold;
  out += "[";
  for (std::int64_t i = 0; i < n; ++i) {
    if (i) out += ", ";
    if (summarize && i == kEdgeItems) {
      out += "...";
      i = n - kEdgeItems - 1;
      continue;
    }
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
  return "<tf.Tensor: shape=" + shape_.to_string() + ", dtype=" + std::string(to_string(dtype_)) + ", numpy=" + value +
         ">";
}

std::string Tensor::to_list_string() const {
  std::string out;
  list_text(*this, 0, 0, out);
  return out;
}

}  // namespace distribute
