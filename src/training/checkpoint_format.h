// The files of a checkpoint: safetensors shards and the JSON manifest that
// names them (docs/checkpoints.md, "Format"), and the directory's index.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distribute/checkpoint.h"
#include "distribute/tensor.h"

namespace distribute::internal::checkpoint_format {

using train::CheckpointEntry;

inline constexpr std::string_view kManifestSuffix = ".index.json";
inline constexpr std::string_view kIndexFile = "checkpoint.json";
inline constexpr int kVersion = 1;

// safetensors' dtype names ("F32", "BF16", "I64", "BOOL", ...).
std::string_view safetensors_dtype(DType dtype);
// The DType of a safetensors name, or nullopt.
std::optional<DType> dtype_of_safetensors(std::string_view name);

// "dir/ckpt-3" -> "dir"; "ckpt-3" -> ".".
std::string dirname_of(const std::string& path);
// "dir/ckpt-3" -> "ckpt-3".
std::string basename_of(const std::string& path);
std::string join_path(const std::string& dir, const std::string& name);
// mkdir -p.
void make_directories(const std::string& dir);

// A tensor to write, under its key.
struct ShardTensor {
  std::string key;
  std::string full_name;
  Tensor value;
};

// Writes `tensors` (in order) as one safetensors file at `path` (which must
// not exist) and fsyncs it. Returns their entries (file = basename of path).
std::vector<CheckpointEntry> write_shard(const std::string& path, const std::vector<ShardTensor>& tensors);

struct Manifest {
  std::int64_t save_counter = 0;
  std::optional<std::int64_t> step;
  std::string layout;
  double written_at = 0;  // seconds since the epoch
  struct Shard {
    std::string file;
    std::uint64_t size = 0;  // the file's bytes
    int worker = 0;
  };
  std::vector<Shard> shards;
  std::vector<CheckpointEntry> entries;  // sorted by key
};
std::string encode_manifest(const Manifest& m);
// DataLossError naming `path` for anything malformed.
Manifest decode_manifest(const std::string& text, const std::string& path);
// Reads prefix + ".index.json"; NotFoundError if it does not exist.
Manifest read_manifest(const std::string& prefix);
// Writes prefix + ".index.json" crash-safely: a temporary file, fsync,
// rename over the old one, fsync of the directory.
void commit_manifest(const std::string& prefix, const Manifest& m);

// The tensor's bytes from its shard, checked against the shard's header and
// the CRC32C (DataLossError naming the file and the key).
Tensor read_tensor(const std::string& dir, const CheckpointEntry& e);
// read_tensor for many tensors of one directory: each shard is opened, and
// its header (which names every tensor of the shard) parsed, once.
class TensorReader {
 public:
  explicit TensorReader(std::string dir);
  ~TensorReader();
  TensorReader(const TensorReader&) = delete;
  TensorReader& operator=(const TensorReader&) = delete;
  Tensor read(const CheckpointEntry& e);
  // The bytes of `e` (e.size of them) into `dst`, checked against its CRC32C:
  // a restore reads into memory it touched before (fresh memory costs a page
  // fault per 4 KiB on first touch).
  void read_into(const CheckpointEntry& e, void* dst);

 private:
  struct Shard;
  std::string dir_;
  std::map<std::string, std::unique_ptr<Shard>> shards_;  // by file name
};
// Checks a shard's size and header against the manifest; "" if sound, else
// the problem.
std::string check_shard(const std::string& dir, const Manifest::Shard& shard,
                        const std::vector<CheckpointEntry>& entries);

// The directory's index (TF's "checkpoint" state file, as JSON).
struct Index {
  std::string model_checkpoint_path;                    // relative to the directory
  std::vector<std::string> all_model_checkpoint_paths;  // oldest first
  std::vector<double> all_model_checkpoint_timestamps;
  std::optional<double> last_preserved_timestamp;
};
// nullopt if the directory has no index; an unreadable one is reported on
// stderr and taken as none, as TF does.
std::optional<Index> read_index(const std::string& dir);
void write_index(const std::string& dir, const Index& index);

// Removes a checkpoint: its manifest first (so it is no longer visible),
// then its shards, and any shard file of the prefix that no manifest names
// (left by a save that failed). Missing files are fine.
void remove_checkpoint(const std::string& prefix);

// The shard files of `prefix` in its directory ("<base>.data-*.safetensors"),
// whether its manifest names them or not.
std::vector<std::string> shard_files_of(const std::string& prefix);
// Unlinks the shard files of `prefix` that `keep` does not name: what saves
// of the same prefix that failed left behind. Best effort: nothing visible
// depends on it.
void remove_unnamed_shards(const std::string& prefix, const std::vector<std::string>& keep);

// Eight random hex digits: names a save's files apart from any other's.
std::string new_token();

}  // namespace distribute::internal::checkpoint_format
