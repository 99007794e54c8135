#include "blas.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "core/ascii_case.h"

// OpenBLAS's own entry points (cblas.h declares them in OpenBLAS builds; these
// declarations keep the file independent of which cblas.h is found).
extern "C" {
void openblas_set_num_threads(int num_threads);
char* openblas_get_config(void);
char* openblas_get_corename(void);
int openblas_get_num_threads(void);
}

namespace distribute::train {
namespace {

constexpr const char* kCoreType = "OPENBLAS_CORETYPE";
constexpr const char* kPicked = "DISTRIBUTE_BLAS_PICKED";
constexpr const char* kWhy = "DISTRIBUTE_BLAS_WHY";

struct CoreLevel {
  std::string_view core;
  SimdLevel level;
};

// OpenBLAS 0.3's x86-64 cores (driver/others/dynamic.c's names) by the
// widest instructions their SGEMM kernels use.
constexpr CoreLevel kCores[] = {
    {"Katmai", SimdLevel::kSse},        {"Coppermine", SimdLevel::kSse},
    {"Northwood", SimdLevel::kSse},     {"Prescott", SimdLevel::kSse},
    {"Banias", SimdLevel::kSse},        {"Atom", SimdLevel::kSse},
    {"Core2", SimdLevel::kSse},         {"Penryn", SimdLevel::kSse},
    {"Dunnington", SimdLevel::kSse},    {"Nehalem", SimdLevel::kSse},
    {"Athlon", SimdLevel::kSse},        {"Opteron", SimdLevel::kSse},
    {"Opteron_SSE3", SimdLevel::kSse},  {"Barcelona", SimdLevel::kSse},
    {"Nano", SimdLevel::kSse},          {"Bobcat", SimdLevel::kSse},
    {"SandyBridge", SimdLevel::kAvx},   {"Bulldozer", SimdLevel::kAvx},
    {"Piledriver", SimdLevel::kAvx},    {"Steamroller", SimdLevel::kAvx},
    {"Excavator", SimdLevel::kAvx2},    {"Haswell", SimdLevel::kAvx2},
    {"Zen", SimdLevel::kAvx2},          {"SkylakeX", SimdLevel::kAvx512},
    {"Cooperlake", SimdLevel::kAvx512}, {"SapphireRapids", SimdLevel::kAvx512},
};

const CoreLevel* find_core(std::string_view name) {
  for (const CoreLevel& c : kCores) {
    if (internal::ascii_lower(c.core) == internal::ascii_lower(name)) return &c;
  }
  return nullptr;
}

std::string_view core_for(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512: return "SkylakeX";
    case SimdLevel::kAvx2: return "Haswell";
    case SimdLevel::kAvx: return "SandyBridge";
    default: return {};
  }
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

}  // namespace

void set_blas_threads(int threads) { openblas_set_num_threads(threads); }

std::string_view to_string(SimdLevel level) {
  switch (level) {
    case SimdLevel::kSse: return "SSE";
    case SimdLevel::kAvx: return "AVX";
    case SimdLevel::kAvx2: return "AVX2";
    case SimdLevel::kAvx512: return "AVX-512";
    default: return "unknown";
  }
}

SimdLevel cpu_simd_level() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return SimdLevel::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdLevel::kAvx2;
  if (__builtin_cpu_supports("avx")) return SimdLevel::kAvx;
  return SimdLevel::kSse;
}

SimdLevel blas_core_level(std::string_view core) {
  const CoreLevel* c = find_core(core);
  return c != nullptr ? c->level : SimdLevel::kUnknown;
}

std::optional<std::string> better_blas_core(std::string_view picked, SimdLevel cpu) {
  const SimdLevel have = blas_core_level(picked);
  if (have == SimdLevel::kUnknown || cpu == SimdLevel::kUnknown || have >= cpu || core_for(cpu).empty()) {
    return std::nullopt;
  }
  return std::string(core_for(cpu));
}

std::string refuse_blas_core(std::string_view core, SimdLevel cpu) {
  const SimdLevel level = blas_core_level(core);
  if (level == SimdLevel::kUnknown) {
    std::string known;
    for (const CoreLevel& c : kCores) {
      if (!known.empty()) known += ", ";
      known += c.core;
    }
    std::string why(1, '\'');  // (built by appending: GCC 12 warns falsely on "'" + std::string)
    why.append(core).append("' is not an x86-64 OpenBLAS core known here (").append(known).append(")");
    return why;
  }
  if (level > cpu) {
    return std::string(core) + "'s kernels need " + std::string(to_string(level)) + "; this CPU runs " +
           std::string(to_string(cpu));
  }
  return {};
}

void fit_blas_to_cpu(char** argv, std::string_view requested) {
  if (env(kPicked) != nullptr) return;  // the run that follows a change
  const std::string picked = openblas_get_corename();
  std::optional<std::string> core;
  const bool asked = requested != "auto";
  if (asked) {
    const CoreLevel* c = find_core(requested);
    if (c != nullptr && internal::ascii_lower(picked) != internal::ascii_lower(c->core)) core = std::string(c->core);
  } else if (env(kCoreType) == nullptr) {  // a core the user set is kept
    core = better_blas_core(picked, cpu_simd_level());
  }
  if (!core) return;
  if (setenv(kCoreType, core->c_str(), 1) != 0 || setenv(kPicked, picked.c_str(), 1) != 0 ||
      setenv(kWhy, asked ? "asked" : "fit", 1) != 0) {
    return;
  }
  execv("/proc/self/exe", argv);
  std::cerr << "distribute-train: warning: could not run again with " << kCoreType << "=" << *core << " ("
            << std::strerror(errno) << "); going on with OpenBLAS's " << picked << " kernels\n";
  unsetenv(kCoreType);
  unsetenv(kPicked);
  unsetenv(kWhy);
}

std::string blas_description() {
  std::string s = openblas_get_config();
  const int threads = openblas_get_num_threads();
  const std::string core = openblas_get_corename();
  s += " (" + core + " kernels, " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
  const SimdLevel cpu = cpu_simd_level();
  if (const char* chosen = env(kCoreType)) {
    const char* picked = env(kPicked);
    const char* why = env(kWhy);
    if (picked != nullptr && why != nullptr && std::strcmp(why, "asked") == 0) {
      s += std::string("; ") + kCoreType + "=" + chosen +
           " set by distribute-train for --blas-core, where OpenBLAS ran " + picked;
    } else if (picked != nullptr) {
      s += std::string("; ") + kCoreType + "=" + chosen + " set by distribute-train: OpenBLAS picked " + picked + " (" +
           std::string(to_string(blas_core_level(picked))) + ") on a CPU with " + std::string(to_string(cpu));
    } else {
      s += std::string("; ") + kCoreType + "=" + chosen + ", as set";
    }
  } else {
    s += ", chosen by OpenBLAS for a CPU with " + std::string(to_string(cpu));
  }
  return s + ")";
}

}  // namespace distribute::train
