#include "training/checkpoint_format.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "core/crc32c.h"
#include "distribute/errors.h"
#include "training/checkpoint_io.h"

namespace distribute::internal::checkpoint_format {
namespace io = checkpoint_io;
using nlohmann::json;

namespace {

// A safetensors header larger than this is taken as corruption (the Rust
// reader's limit is 100 MB too).
constexpr std::uint64_t kMaxHeaderBytes = 100ULL << 20;
// Bytes hashed and written at a time: large enough for full-speed writes,
// small enough that the CRC pass leaves them in cache for write(2).
constexpr std::size_t kChunkBytes = 4U << 20;

struct DTypeName {
  DType dtype;
  std::string_view name;
};
constexpr std::array<DTypeName, 10> kDTypeNames = {{{DType::kBool, "BOOL"},
                                                    {DType::kInt8, "I8"},
                                                    {DType::kUInt8, "U8"},
                                                    {DType::kInt16, "I16"},
                                                    {DType::kInt32, "I32"},
                                                    {DType::kInt64, "I64"},
                                                    {DType::kFloat16, "F16"},
                                                    {DType::kBFloat16, "BF16"},
                                                    {DType::kFloat32, "F32"},
                                                    {DType::kFloat64, "F64"}}};

std::string random_token() {
  std::random_device rd;
  std::uniform_int_distribution<std::uint32_t> d;
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", d(rd));
  return buf;
}

// Closes a read-only descriptor on every path out.
struct InFile {
  explicit InFile(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~InFile() {
    if (fd >= 0) ::close(fd);
  }
  InFile(const InFile&) = delete;
  InFile& operator=(const InFile&) = delete;
  int fd;
};

// pread of exactly n bytes; false if the file ends first.
bool read_at(int fd, void* out, std::size_t n, std::uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      io::throw_io_error("read", path, errno);
    }
    if (r == 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
  return true;
}

// json's destructor allocates (it flattens nesting onto a vector), which
// clang-tidy counts as a throw from this struct's implicit members.
// NOLINTNEXTLINE(bugprone-exception-escape)
struct ShardHeader {
  std::uint64_t header_bytes = 0;  // the JSON's length
  json tensors;                    // key -> {dtype, shape, data_offsets}
  std::uint64_t data_start() const { return 8 + header_bytes; }
};

ShardHeader read_shard_header(int fd, const std::string& path) {
  std::uint8_t len_bytes[8];
  if (!read_at(fd, len_bytes, 8, 0, path)) {
    throw DataLossError("checkpoint shard '" + path + "' is truncated: shorter than its 8-byte header length");
  }
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  struct stat st {};
  if (::fstat(fd, &st) != 0) io::throw_io_error("stat", path, errno);
  if (n == 0 || n > kMaxHeaderBytes || n > static_cast<std::uint64_t>(st.st_size) - 8) {
    throw DataLossError("checkpoint shard '" + path + "' has a bad header: its length field says " + std::to_string(n) +
                        " bytes in a file of " + std::to_string(st.st_size));
  }
  std::string text(n, '\0');
  if (!read_at(fd, text.data(), n, 8, path)) {
    throw DataLossError("checkpoint shard '" + path + "' is truncated inside its header");
  }
  ShardHeader h;
  h.header_bytes = n;
  try {
    h.tensors = json::parse(text);
  } catch (const json::exception& e) {
    throw DataLossError("checkpoint shard '" + path + "' has a bad header: " + e.what());
  }
  if (!h.tensors.is_object()) throw DataLossError("checkpoint shard '" + path + "' has a bad header: not an object");
  return h;
}

// The shard header's record of `e` agrees with the manifest's.
std::string header_disagreement(const ShardHeader& h, const CheckpointEntry& e) {
  const auto it = h.tensors.find(e.key);
  if (it == h.tensors.end()) return "the shard's header has no tensor '" + e.key + "'";
  try {
    const json& t = *it;
    const bool same_dtype = t.at("dtype").get<std::string>() == safetensors_dtype(e.dtype);
    const bool same_shape = t.at("shape").get<std::vector<std::int64_t>>() == e.shape.dims();
    const auto offsets = t.at("data_offsets").get<std::vector<std::uint64_t>>();
    const bool same_place = offsets.size() == 2 && offsets[0] == e.offset && offsets[1] == e.offset + e.size;
    if (same_dtype && same_shape && same_place) return "";
    return "the shard's header records tensor '" + e.key + "' as " + t.dump() + ", the manifest as " +
           std::string(safetensors_dtype(e.dtype)) + e.shape.to_string() + " at [" + std::to_string(e.offset) + ", " +
           std::to_string(e.offset + e.size) + ")";
  } catch (const json::exception& ex) {
    return "the shard's header entry for '" + e.key + "' is malformed: " + ex.what();
  }
}

// Replaces `path` with `text` crash-safely: a temporary file, fsync, rename
// over the old one, fsync of the directory. If that last fsync fails, the
// new file is removed again where `take_back_unless_durable`.
void replace_file(const std::string& path, const std::string& text, bool take_back_unless_durable) {
  const std::string temporary = path + ".tmp-" + random_token();
  io::OutFile out(temporary);
  out.write(text.data(), text.size());
  out.sync_and_close();
  try {
    io::rename_file(temporary, path);
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
  try {
    io::sync_directory(dirname_of(path));
  } catch (...) {
    if (take_back_unless_durable) ::unlink(path.c_str());
    throw;
  }
}

}  // namespace

std::string_view safetensors_dtype(DType dtype) {
  for (const auto& d : kDTypeNames) {
    if (d.dtype == dtype) return d.name;
  }
  return "?";
}

std::optional<DType> dtype_of_safetensors(std::string_view name) {
  for (const auto& d : kDTypeNames) {
    if (d.name == name) return d.dtype;
  }
  return std::nullopt;
}

std::string dirname_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string basename_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (!name.empty() && name[0] == '/') return name;
  if (dir.empty() || dir == ".") return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

void make_directories(const std::string& dir) {
  if (dir.empty() || dir == "." || dir == "/") return;
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) throw FailedPreconditionError("'" + dir + "' is not a directory");
    return;
  }
  make_directories(dirname_of(dir));
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) io::throw_io_error("mkdir", dir, errno);
}

std::vector<CheckpointEntry> write_shard(const std::string& path, const std::vector<ShardTensor>& tensors) {
  // The header first: every tensor's place is known from its size.
  json header = json::object();
  header["__metadata__"] = {{"format", "distribute.checkpoint"}, {"version", std::to_string(kVersion)}};
  std::vector<CheckpointEntry> entries;
  entries.reserve(tensors.size());
  std::uint64_t offset = 0;
  const std::string file = basename_of(path);
  for (const ShardTensor& t : tensors) {
    CheckpointEntry e;
    e.key = t.key;
    e.full_name = t.full_name;
    e.dtype = t.value.dtype();
    e.shape = t.value.shape();
    e.file = file;
    e.offset = offset;
    e.size = t.value.nbytes();
    header[t.key] = {
        {"dtype", safetensors_dtype(e.dtype)}, {"shape", e.shape.dims()}, {"data_offsets", {offset, offset + e.size}}};
    offset += e.size;
    entries.push_back(std::move(e));
  }
  std::string text = header.dump();
  // Padded with spaces, as the format allows, so that the data starts 8-aligned.
  text.append((8 - (text.size() % 8)) % 8, ' ');
  std::uint8_t len_bytes[8];
  std::uint64_t n = text.size();
  for (std::uint8_t& b : len_bytes) {
    b = static_cast<std::uint8_t>(n & 0xFF);
    n >>= 8;
  }
  io::OutFile out(path);
  out.write(len_bytes, 8);
  out.write(text.data(), text.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto* p = static_cast<const std::byte*>(tensors[i].value.raw_data());
    std::uint32_t crc = 0;
    for (std::uint64_t done = 0; done < entries[i].size;) {
      const std::size_t chunk = std::min<std::uint64_t>(kChunkBytes, entries[i].size - done);
      crc = crc32c_extend(crc, p + done, chunk);
      out.write(p + done, chunk);
      done += chunk;
    }
    entries[i].crc32c = crc;
  }
  out.sync_and_close();
  return entries;
}

std::string encode_manifest(const Manifest& m) {
  json j;
  j["format"] = "distribute.checkpoint";
  j["version"] = kVersion;
  j["save_counter"] = m.save_counter;
  j["step"] = m.step ? json(*m.step) : json(nullptr);
  j["layout"] = m.layout;
  j["written_at"] = m.written_at;
  json shards = json::array();
  for (const auto& s : m.shards) shards.push_back({{"file", s.file}, {"size", s.size}, {"worker", s.worker}});
  j["shards"] = std::move(shards);
  json tensors = json::object();
  for (const CheckpointEntry& e : m.entries) {
    std::size_t shard = 0;
    while (shard < m.shards.size() && m.shards[shard].file != e.file) ++shard;
    tensors[e.key] = {{"full_name", e.full_name}, {"dtype", safetensors_dtype(e.dtype)},
                      {"shape", e.shape.dims()},  {"shard", shard},
                      {"offset", e.offset},       {"size", e.size},
                      {"crc32c", e.crc32c}};
  }
  j["tensors"] = std::move(tensors);
  return j.dump(1) + "\n";
}

Manifest decode_manifest(const std::string& text, const std::string& path) {
  Manifest m;
  try {
    const json j = json::parse(text);
    if (j.at("format").get<std::string>() != "distribute.checkpoint") {
      throw DataLossError("'" + path + "' is not a distribute checkpoint manifest (format '" +
                          j.at("format").get<std::string>() + "')");
    }
    const int version = j.at("version").get<int>();
    if (version != kVersion) {
      throw UnimplementedError("checkpoint manifest '" + path + "' has version " + std::to_string(version) +
                               "; this library reads version " + std::to_string(kVersion));
    }
    m.save_counter = j.at("save_counter").get<std::int64_t>();
    if (!j.at("step").is_null()) m.step = j.at("step").get<std::int64_t>();
    m.layout = j.at("layout").get<std::string>();
    m.written_at = j.at("written_at").get<double>();
    for (const json& s : j.at("shards")) {
      Manifest::Shard shard{s.at("file").get<std::string>(), s.at("size").get<std::uint64_t>(),
                            s.at("worker").get<int>()};
      if (shard.file.empty() || shard.file.find('/') != std::string::npos) {
        throw DataLossError("checkpoint manifest '" + path + "' names a bad shard file '" + shard.file + "'");
      }
      m.shards.push_back(std::move(shard));
    }
    for (const auto& [key, t] : j.at("tensors").items()) {
      CheckpointEntry e;
      e.key = key;
      e.full_name = t.at("full_name").get<std::string>();
      const std::string dtype = t.at("dtype").get<std::string>();
      const auto d = dtype_of_safetensors(dtype);
      if (!d) throw DataLossError("checkpoint manifest '" + path + "': tensor '" + key + "' has dtype '" + dtype + "'");
      e.dtype = *d;
      const auto dims = t.at("shape").get<std::vector<std::int64_t>>();
      std::uint64_t elements = 1;
      for (const std::int64_t dim : dims) {
        if (dim < 0 ||
            (dim > 0 && elements > std::numeric_limits<std::uint64_t>::max() / static_cast<std::uint64_t>(dim))) {
          throw DataLossError("checkpoint manifest '" + path + "': tensor '" + key + "' has a bad shape");
        }
        elements *= static_cast<std::uint64_t>(dim);
      }
      e.shape = Shape(dims);
      const auto shard = t.at("shard").get<std::size_t>();
      if (shard >= m.shards.size()) {
        throw DataLossError("checkpoint manifest '" + path + "': tensor '" + key + "' names shard " +
                            std::to_string(shard) + " of " + std::to_string(m.shards.size()));
      }
      e.file = m.shards[shard].file;
      e.offset = t.at("offset").get<std::uint64_t>();
      e.size = t.at("size").get<std::uint64_t>();
      if (e.size != elements * size_of(e.dtype)) {
        throw DataLossError("checkpoint manifest '" + path + "': tensor '" + key + "' has " + std::to_string(e.size) +
                            " bytes for " + std::string(dtype) + e.shape.to_string());
      }
      e.crc32c = t.at("crc32c").get<std::uint32_t>();
      m.entries.push_back(std::move(e));
    }
  } catch (const json::exception& e) {
    throw DataLossError("checkpoint manifest '" + path + "' is malformed: " + e.what());
  }
  std::sort(m.entries.begin(), m.entries.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.key < b.key; });
  return m;
}

Manifest read_manifest(const std::string& prefix) {
  const std::string path = prefix + std::string(kManifestSuffix);
  if (!io::file_exists(path)) {
    throw NotFoundError("Error when restoring from checkpoint at " + prefix + ": there is no checkpoint there (no " +
                        path +
                        ")\nPlease double-check that the path is correct. You may be missing the checkpoint "
                        "suffix (e.g. the '-1' in 'path/to/ckpt-1').");
  }
  return decode_manifest(io::read_small_file(path, 1ULL << 30), path);
}

void commit_manifest(const std::string& prefix, const Manifest& m) {
  replace_file(prefix + std::string(kManifestSuffix), encode_manifest(m), /*take_back_unless_durable=*/true);
}

// The header of a shard just opened; DataLossError if the file is missing.
ShardHeader header_of_opened(const InFile& in, const std::string& path, const std::string& key) {
  if (in.fd < 0) {
    if (errno == ENOENT) throw DataLossError("checkpoint shard '" + path + "' of tensor '" + key + "' is missing");
    io::throw_io_error("open", path, errno);
  }
  return read_shard_header(in.fd, path);
}

struct TensorReader::Shard {
  Shard(const std::string& path, const std::string& key) : in(path), header(header_of_opened(in, path, key)) {}
  InFile in;
  const ShardHeader header;
};

TensorReader::TensorReader(std::string dir) : dir_(std::move(dir)) {}
TensorReader::~TensorReader() = default;

Tensor TensorReader::read(const CheckpointEntry& e) {
  Tensor t = Tensor::uninitialized(e.dtype, e.shape);
  read_into(e, t.mutable_raw_data());
  return t;
}

void TensorReader::read_into(const CheckpointEntry& e, void* dst) {
  const std::string path = join_path(dir_, e.file);
  auto it = shards_.find(e.file);
  if (it == shards_.end()) it = shards_.emplace(e.file, std::make_unique<Shard>(path, e.key)).first;
  const Shard& shard = *it->second;
  if (std::string problem = header_disagreement(shard.header, e); !problem.empty()) {
    throw DataLossError("checkpoint shard '" + path + "': " + problem);
  }
  if (!read_at(shard.in.fd, dst, e.size, shard.header.data_start() + e.offset, path)) {
    throw DataLossError("checkpoint shard '" + path + "' is truncated: tensor '" + e.key + "' ends past its end");
  }
  const std::uint32_t crc = crc32c(dst, e.size);
  if (crc != e.crc32c) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " (CRC32C 0x%08x, the manifest says 0x%08x)", crc, e.crc32c);
    throw DataLossError("checkpoint shard '" + path + "': the bytes of tensor '" + e.key + "' are corrupted" + buf);
  }
}

Tensor read_tensor(const std::string& dir, const CheckpointEntry& e) { return TensorReader(dir).read(e); }

std::string check_shard(const std::string& dir, const Manifest::Shard& shard,
                        const std::vector<CheckpointEntry>& entries) {
  const std::string path = join_path(dir, shard.file);
  InFile in(path);
  if (in.fd < 0) return "shard '" + path + "': " + std::strerror(errno);
  struct stat st {};
  if (::fstat(in.fd, &st) != 0) return "shard '" + path + "': " + std::strerror(errno);
  if (static_cast<std::uint64_t>(st.st_size) != shard.size) {
    return "shard '" + path + "' has " + std::to_string(st.st_size) + " bytes; the manifest says " +
           std::to_string(shard.size);
  }
  try {
    const ShardHeader h = read_shard_header(in.fd, path);
    std::size_t mine = 0;
    for (const CheckpointEntry& e : entries) {
      if (e.file != shard.file) continue;
      ++mine;
      if (std::string problem = header_disagreement(h, e); !problem.empty()) return "shard '" + path + "': " + problem;
    }
    const std::size_t in_header = h.tensors.size() - (h.tensors.contains("__metadata__") ? 1 : 0);
    if (in_header != mine) {
      return "shard '" + path + "' holds " + std::to_string(in_header) + " tensors; the manifest places " +
             std::to_string(mine) + " there";
    }
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

std::optional<Index> read_index(const std::string& dir) {
  const std::string path = join_path(dir, std::string(kIndexFile));
  if (!io::file_exists(path)) return std::nullopt;
  try {
    const json j = json::parse(io::read_small_file(path, 64ULL << 20));
    Index index;
    index.model_checkpoint_path = j.at("model_checkpoint_path").get<std::string>();
    index.all_model_checkpoint_paths = j.at("all_model_checkpoint_paths").get<std::vector<std::string>>();
    index.all_model_checkpoint_timestamps = j.at("all_model_checkpoint_timestamps").get<std::vector<double>>();
    if (j.contains("last_preserved_timestamp") && !j.at("last_preserved_timestamp").is_null()) {
      index.last_preserved_timestamp = j.at("last_preserved_timestamp").get<double>();
    }
    if (index.all_model_checkpoint_timestamps.size() != index.all_model_checkpoint_paths.size()) {
      throw DataLossError("timestamps and paths differ in number");
    }
    return index;
  } catch (const std::exception& e) {
    std::cerr << "distribute: " << path << ": checkpoint index ignored (" << e.what() << ")\n" << std::flush;
    return std::nullopt;
  }
}

void write_index(const std::string& dir, const Index& index) {
  json j;
  j["model_checkpoint_path"] = index.model_checkpoint_path;
  j["all_model_checkpoint_paths"] = index.all_model_checkpoint_paths;
  j["all_model_checkpoint_timestamps"] = index.all_model_checkpoint_timestamps;
  j["last_preserved_timestamp"] =
      index.last_preserved_timestamp ? json(*index.last_preserved_timestamp) : json(nullptr);
  // An index that is in place but not known durable is kept: it still names
  // whole checkpoints, and removing it would forget them all.
  replace_file(join_path(dir, std::string(kIndexFile)), j.dump(1) + "\n", /*take_back_unless_durable=*/false);
}

void remove_checkpoint(const std::string& prefix) {
  std::vector<std::string> shards;
  try {
    for (const auto& s : read_manifest(prefix).shards) shards.push_back(s.file);
  } catch (const Error&) {
    // No manifest, or a torn one: nothing of it is visible; its shards are
    // unnamed leftovers.
  }
  io::remove_file(prefix + std::string(kManifestSuffix));
  const std::string dir = dirname_of(prefix);
  for (const std::string& f : shards) io::remove_file(join_path(dir, f));
  remove_unnamed_shards(prefix, shards);
}

std::vector<std::string> shard_files_of(const std::string& prefix) {
  const std::string dir = dirname_of(prefix);
  const std::string start = basename_of(prefix) + ".data-";
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (name.starts_with(start) && name.ends_with(".safetensors")) out.emplace_back(name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

void remove_unnamed_shards(const std::string& prefix, const std::vector<std::string>& keep) {
  const std::string dir = dirname_of(prefix);
  for (const std::string& f : shard_files_of(prefix)) {
    if (std::find(keep.begin(), keep.end(), f) == keep.end()) ::unlink(join_path(dir, f).c_str());
  }
}

std::string new_token() { return random_token(); }

}  // namespace distribute::internal::checkpoint_format
