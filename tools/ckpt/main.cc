// distribute-ckpt: what a checkpoint holds, and whether its bytes are sound,
// as TensorFlow's inspect_checkpoint.
//
//   distribute-ckpt inspect PATH          tensors, dtypes, shapes, sizes; every CRC checked
//   distribute-ckpt inspect PATH --tensor KEY   also the tensor's values
//   distribute-ckpt list DIR              a directory's checkpoints, newest last
//
// PATH is a checkpoint prefix (dir/ckpt-3) or a directory (its latest).
// Exit status: 0 sound, 1 a checkpoint that fails its checks (each problem
// printed), 2 bad usage or no checkpoint there.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "distribute/checkpoint.h"
#include "distribute/errors.h"
#include "flags.h"

namespace {

using distribute::tools::grouped;
using distribute::tools::UsageError;
namespace train = distribute::train;

constexpr const char* kUsage =
    "usage: distribute-ckpt inspect PATH [--tensor KEY]\n"
    "       distribute-ckpt list DIR\n"
    "PATH: a checkpoint prefix (dir/ckpt-3) or a directory (its latest checkpoint).\n";

std::string dims(const distribute::Shape& s) {
  std::string out = "[";
  for (int i = 0; i < s.rank(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

int inspect(const std::string& path, const std::string& tensor) {
  const train::CheckpointReader reader(path);
  std::printf("checkpoint   %s\n", reader.prefix().c_str());
  std::printf("written by   %s\n", reader.layout().c_str());
  std::printf("save_counter %" PRId64 "\n", reader.save_counter());
  if (reader.step()) std::printf("step         %" PRId64 "\n", *reader.step());
  std::size_t key_width = 3;
  for (const auto& e : reader.entries()) key_width = std::max(key_width, e.key.size());
  std::printf("\n%-*s  %-8s  %-16s  %14s  %-10s  %s\n", static_cast<int>(key_width), "key", "dtype", "shape", "bytes",
              "crc32c", "shard");
  std::uint64_t total = 0;
  for (const auto& e : reader.entries()) {
    std::printf("%-*s  %-8s  %-16s  %14s  0x%08x  %s\n", static_cast<int>(key_width), e.key.c_str(),
                std::string(distribute::to_string(e.dtype)).c_str(), dims(e.shape).c_str(),
                grouped(static_cast<std::int64_t>(e.size)).c_str(), e.crc32c, e.file.c_str());
    total += e.size;
  }
  std::printf("\n%zu tensors, %s bytes\n", reader.entries().size(), grouped(static_cast<std::int64_t>(total)).c_str());
  if (!tensor.empty()) {
    const distribute::Tensor t = reader.get_tensor(tensor);
    std::printf("\n%s = %s\n", tensor.c_str(), t.numpy_repr().c_str());
  }
  const std::vector<std::string> problems = reader.verify();
  if (problems.empty()) {
    std::printf("verified: every shard's size and header, and every tensor's CRC32C\n");
    return 0;
  }
  for (const std::string& p : problems) std::printf("PROBLEM: %s\n", p.c_str());
  std::printf("%zu problems: this checkpoint would not restore\n", problems.size());
  return 1;
}

int list(const std::string& dir) {
  const auto latest = train::latest_checkpoint(dir);
  if (!latest) throw distribute::NotFoundError("no checkpoint in '" + dir + "' (no whole checkpoint in its index)");
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const std::string suffix = ".index.json";
    if (name.size() > suffix.size() && name.ends_with(suffix))
      names.push_back(name.substr(0, name.size() - suffix.size()));
  }
  std::vector<train::CheckpointReader> readers;
  readers.reserve(names.size());
  for (const std::string& name : names) readers.emplace_back((std::filesystem::path(dir) / name).string());
  std::sort(readers.begin(), readers.end(),
            [](const auto& x, const auto& y) { return x.save_counter() < y.save_counter(); });
  for (const train::CheckpointReader& reader : readers) {
    const std::string& prefix = reader.prefix();
    std::uint64_t bytes = 0;
    for (const auto& e : reader.entries()) bytes += e.size;
    std::printf("%s  save_counter %" PRId64 "%s  %zu tensors  %s bytes%s\n", prefix.c_str(), reader.save_counter(),
                reader.step() ? ("  step " + std::to_string(*reader.step())).c_str() : "", reader.entries().size(),
                grouped(static_cast<std::int64_t>(bytes)).c_str(), prefix == *latest ? "  (latest)" : "");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty() || args[0] == "--help" || args[0] == "-h") {
      std::fputs(kUsage, args.empty() ? stderr : stdout);
      return args.empty() ? 2 : 0;
    }
    if (args[0] == "inspect") {
      std::string path;
      std::string tensor;
      for (std::size_t i = 1; i < args.size(); ++i) {
        if (args[i] == "--tensor") {
          if (i + 1 == args.size()) throw UsageError("--tensor needs a key");
          tensor = args[++i];
        } else if (path.empty() && !args[i].starts_with("--")) {
          path = args[i];
        } else {
          throw UsageError("unknown argument '" + args[i] + "'");
        }
      }
      if (path.empty()) throw UsageError("inspect needs a PATH");
      return inspect(path, tensor);
    }
    if (args[0] == "list") {
      if (args.size() != 2) throw UsageError("list needs one DIR");
      return list(args[1]);
    }
    throw UsageError("unknown command '" + args[0] + "'");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "distribute-ckpt: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const distribute::NotFoundError& e) {
    std::fprintf(stderr, "distribute-ckpt: %s\n", e.what());
    return 2;
  } catch (const distribute::DataLossError& e) {
    std::fprintf(stderr, "distribute-ckpt: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distribute-ckpt: %s\n", e.what());
    return 2;
  }
}
