// Output files of the tools (metrics, plots, CSV tables): a path that cannot
// be written is found before the work, not after it, and a write that fails
// (a full disk) is an error naming the file, never a silent loss.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "distribute/errors.h"
#include "flags.h"

namespace distribute::tools {

// UsageError unless `path` (if not empty) can be written: the file if it
// exists, else its folder. (As root, access() grants what permissions deny;
// a full disk is found at the write.)
inline void check_writable(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) throw UsageError(flag + " " + path + ": is a folder, not a file");
  if (access(path.c_str(), F_OK) == 0) {
    if (access(path.c_str(), W_OK) != 0) throw UsageError(flag + " " + path + ": " + std::strerror(errno));
    return;
  }
  const std::string folder = std::filesystem::path(path).parent_path().string();
  if (access(folder.empty() ? "." : folder.c_str(), W_OK | X_OK) != 0) {
    throw UsageError(flag + " " + path + ": cannot create it in " + (folder.empty() ? "." : folder) + ": " +
                     std::strerror(errno));
  }
}

// Writes `text` to `path` whole, or raises an error naming the file and why
// (ENOSPC at the write or at the close, say). `what`: "metrics file", ...
inline void write_file(const std::string& what, const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw NotFoundError("cannot write the " + what + " " + path + ": " + std::strerror(errno));
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
  const int error = errno;
  if (std::fclose(f) != 0 || !written) {
    throw InvalidArgumentError("could not write the " + what + " " + path + ": " +
                               std::strerror(written ? errno : error));
  }
}

}  // namespace distribute::tools
