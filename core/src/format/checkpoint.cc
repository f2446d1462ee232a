// safetensors reading (mmap) and atomic writing.
#include "dcr/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "dcr/format.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "internal/atomic_file.h"
#include "internal/mapped_file.h"
#include "internal/phase_progress.h"
#include "internal/safetensors.h"

namespace dcr {
namespace {

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

}  // namespace

std::string Hash128::ToHex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

bool Hash128::FromHex(std::string_view hex, Hash128* h) {
  if (hex.size() != 32) return false;
  uint64_t parts[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    const char c = hex[i];
    const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0) return false;
    parts[i / 16] = parts[i / 16] << 4 | static_cast<uint64_t>(v);
  }
  *h = Hash128{parts[1], parts[0]};
  return true;
}

Checkpoint::~Checkpoint() {
  for (const Mapping& m : maps_) {
    if (m.map != nullptr) ::munmap(m.map, m.size);
  }
}

std::string CheckpointFile::header_json() const {
  return std::string(reinterpret_cast<const char*>(data + 8), data_section_offset - 8);
}

namespace {

bool EndsWith(const std::string& s, const char* suffix) {
  const size_t k = std::strlen(suffix);
  return s.size() >= k && s.compare(s.size() - k, k, suffix) == 0;
}

// Upper bound on the shards of one checkpoint (the largest public checkpoints have ~200).
constexpr size_t kMaxShards = 100000;

// Parses JSON text refusing duplicate keys in any object (nlohmann keeps the last of them, so a
// duplicate would silently replace the first). kDataLoss: "malformed <what>: ..." or "<whose>
// names 'key' twice".
Status ParseJsonStrict(const char* text, size_t n, const char* what, const char* whose,
                       nlohmann::json* out) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string duplicate;
  auto callback = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) {
      keys.emplace_back();
    } else if (event == E::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (event == E::key && !keys.empty() && duplicate.empty()) {
      std::string k = parsed.get<std::string>();
      if (!keys.back().insert(k).second) duplicate = k;
    }
    return true;
  };
  try {
    *out = nlohmann::json::parse(text, text + n, callback);
  } catch (const std::exception& e) {
    return DataLossError(std::string("malformed ") + what + ": " + e.what());
  }
  if (!duplicate.empty())
    return DataLossError(std::string(whose) + " names '" + duplicate + "' twice");
  return Status::OK();
}

}  // namespace

namespace internal {

bool IsPlainFileName(const std::string& n) {
  return !n.empty() && n.size() <= 255 && n.find('/') == std::string::npos &&
         n.find('\0') == std::string::npos && n[0] != '.';
}

}  // namespace internal

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& path) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->path_ = path;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    Status s = ck->OpenDirectory(path, "");
    if (!s.ok()) return s;
    return ck;
  }
  if (EndsWith(path, ".safetensors.index.json")) {
    size_t slash = path.find_last_of('/');
    std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
    if (dir.empty()) dir = "/";
    ck->path_ = dir;
    Status s = ck->OpenDirectory(dir, path);
    if (!s.ok()) return s;
    return ck;
  }
  Mapping m;
  DCR_RETURN_IF_ERROR(internal::MapReadOnly(path, &m.map, &m.size));
  ck->maps_.push_back(m);
  CheckpointFile f;
  f.data = static_cast<const uint8_t*>(m.map);
  f.size = m.size;
  ck->files_.push_back(f);
  Status s = ck->ParseFile(0, &ck->metadata_);
  if (!s.ok()) return s.WithContext(path);
  DCR_RETURN_IF_ERROR(ck->BuildIndex());
  return ck;
}

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::FromBytes(std::vector<uint8_t> bytes) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->owned_ = std::move(bytes);
  CheckpointFile f;
  f.data = ck->owned_.data();
  f.size = ck->owned_.size();
  ck->files_.push_back(f);
  DCR_RETURN_IF_ERROR(ck->ParseFile(0, &ck->metadata_));
  DCR_RETURN_IF_ERROR(ck->BuildIndex());
  return ck;
}

Status Checkpoint::OpenDirectory(const std::string& dir, const std::string& index_path) {
  sharded_ = true;
  // The directory's entries: safetensors files and index files.
  std::vector<std::string> shards, indexes;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoError("open directory " + dir, errno);
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.empty() || n[0] == '.') continue;
    if (EndsWith(n, ".safetensors")) shards.push_back(n);
    if (EndsWith(n, ".safetensors.index.json")) indexes.push_back(n);
    if (shards.size() > kMaxShards) {
      ::closedir(d);
      return InvalidArgumentError(dir + ": more than " + std::to_string(kMaxShards) +
                                  " safetensors files");
    }
  }
  ::closedir(d);
  std::sort(shards.begin(), shards.end());
  std::sort(indexes.begin(), indexes.end());
  std::string index_file;
  if (!index_path.empty()) {
    size_t slash = index_path.find_last_of('/');
    index_file = slash == std::string::npos ? index_path : index_path.substr(slash + 1);
  } else if (std::find(indexes.begin(), indexes.end(), kIndexFileName) != indexes.end()) {
    index_file = kIndexFileName;
  } else if (indexes.size() == 1) {
    index_file = indexes[0];
  } else if (indexes.size() > 1) {
    return InvalidArgumentError(dir + " holds several index files (" + indexes[0] + ", " +
                                indexes[1] + ", ...) and no " + kIndexFileName +
                                ": give the index file to open instead of the directory");
  }
  ShardIndex index;
  std::vector<std::string> names = shards;
  if (!index_file.empty()) {
    const std::string ipath = dir + "/" + index_file;
    struct stat st;
    if (::stat(ipath.c_str(), &st) != 0) return ErrnoError("open " + ipath, errno);
    if (!S_ISREG(st.st_mode)) return InvalidArgumentError(ipath + ": not a regular file");
    if (static_cast<uint64_t>(st.st_size) > internal::kMaxSafetensorsHeaderBytes) {
      return DataLossError(ipath + ": index of " + std::to_string(st.st_size) +
                           " bytes exceeds the 100 MiB limit");
    }
    DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(ipath));
    index_name_ = index_file;
    index_json_.assign(bytes.begin(), bytes.end());
    auto parsed = ParseShardIndex(index_json_);
    if (!parsed.ok()) return parsed.status().WithContext(ipath);
    index = std::move(*parsed);
    names = index.shards;
    for (const std::string& n : names) {
      if (!std::binary_search(shards.begin(), shards.end(), n)) {
        std::string tensor;
        for (const auto& [t, f] : index.weight_map) {
          if (f == n) {
            tensor = t;
            break;
          }
        }
        return NotFoundError(ipath + " maps tensor '" + tensor + "' to shard " + n +
                             ", which is not in " + dir);
      }
    }
  }
  if (names.empty()) {
    return InvalidArgumentError(dir +
                                " is a directory without safetensors files; a checkpoint "
                                "is a .safetensors file or a directory of shards");
  }
  for (const std::string& n : names) {
    const std::string fpath = dir + "/" + n;
    Mapping m;
    DCR_RETURN_IF_ERROR(internal::MapReadOnly(fpath, &m.map, &m.size));
    maps_.push_back(m);
    CheckpointFile f;
    f.name = n;
    f.data = static_cast<const uint8_t*>(m.map);
    f.size = m.size;
    files_.push_back(f);
    std::map<std::string, std::string> meta;
    Status s = ParseFile(static_cast<uint32_t>(files_.size() - 1), &meta);
    if (!s.ok()) return s.WithContext(fpath);
    if (files_.size() == 1) metadata_ = std::move(meta);
  }
  // A tensor in two files.
  {
    std::map<std::string, uint32_t> seen;
    for (const TensorInfo& t : tensors_) {
      auto [it, fresh] = seen.emplace(t.name, t.file);
      if (!fresh) {
        return DataLossError(dir + ": tensor '" + t.name + "' is in two shards, " +
                             files_[it->second].name + " and " + files_[t.file].name);
      }
    }
  }
  if (!index_name_.empty()) {
    Status s = CheckShardIndex(index, names, tensors_);
    if (!s.ok()) return s.WithContext(dir + "/" + index_name_);
  }
  return BuildIndex();
}

Status Checkpoint::BuildIndex() {
  index_.clear();
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  return Status::OK();
}

StatusOr<ShardIndex> ParseShardIndex(const std::string& json) {
  nlohmann::json j;
  DCR_RETURN_IF_ERROR(
      ParseJsonStrict(json.data(), json.size(), "checkpoint index JSON", "checkpoint index", &j));
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return DataLossError("checkpoint index has no \"weight_map\" object");
  }
  ShardIndex out;
  std::set<std::string> files;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) {
      return DataLossError("checkpoint index: weight_map entry '" + it.key() +
                           "' is not a file name");
    }
    std::string f = it.value().get<std::string>();
    if (!internal::IsPlainFileName(f)) {
      return InvalidArgumentError("checkpoint index maps tensor '" + it.key() + "' to '" + f +
                                  "', which is not a plain file name in the checkpoint directory");
    }
    out.weight_map[it.key()] = f;
    files.insert(f);
    if (files.size() > kMaxShards) return DataLossError("checkpoint index names too many shards");
  }
  out.shards.assign(files.begin(), files.end());
  return out;
}

Status CheckShardIndex(const ShardIndex& index, const std::vector<std::string>& files,
                       const std::vector<TensorInfo>& tensors) {
  std::set<std::string> present;
  for (const TensorInfo& t : tensors) {
    present.insert(t.name);
    auto it = index.weight_map.find(t.name);
    if (it == index.weight_map.end()) {
      return DataLossError("tensor '" + t.name + "' is in shard " + files[t.file] +
                           " but the index does not name it");
    }
    if (it->second != files[t.file]) {
      return DataLossError("tensor '" + t.name + "' is in shard " + files[t.file] +
                           " but the index maps it to " + it->second);
    }
  }
  for (const auto& [name, file] : index.weight_map) {
    if (!present.count(name)) {
      return DataLossError("the index maps tensor '" + name + "' to shard " + file +
                           ", which does not hold it");
    }
  }
  return Status::OK();
}

namespace internal {

Status ParseSafetensorsJson(const char* json, size_t n, uint64_t data_size,
                            std::vector<TensorInfo>* tensors,
                            std::map<std::string, std::string>* metadata, uint64_t* data_end) {
  // A second tensor of the same name (or a second "dtype" in one tensor) is refused, not kept.
  nlohmann::json j;
  DCR_RETURN_IF_ERROR(
      ParseJsonStrict(json, n, "safetensors JSON header", "safetensors header", &j));
  if (!j.is_object()) return DataLossError("safetensors header is not a JSON object");
  tensors->clear();
  metadata->clear();
  *data_end = 0;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return DataLossError("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return DataLossError("__metadata__ values must be strings");
        (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets")) {
      return DataLossError("tensor '" + name + "': needs dtype, shape and data_offsets");
    }
    const auto& dt = v["dtype"];
    const auto& sh = v["shape"];
    const auto& off = v["data_offsets"];
    if (!dt.is_string() || !sh.is_array() || !off.is_array() || off.size() != 2 ||
        !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return DataLossError("tensor '" + name + "': malformed dtype, shape or data_offsets");
    }
    TensorInfo t;
    t.name = name;
    t.dtype_name = dt.get<std::string>();
    t.dtype = DTypeFromName(t.dtype_name);
    uint64_t elems = 1;
    for (const auto& d : sh) {
      if (!d.is_number_unsigned()) return DataLossError("tensor '" + name + "': bad shape entry");
      uint64_t x = d.get<uint64_t>();
      if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return DataLossError("tensor '" + name + "': shape overflows (dimension " +
                             std::to_string(x) + ")");
      }
      if (x != 0 && elems > std::numeric_limits<uint64_t>::max() / x) {
        return DataLossError("tensor '" + name + "': shape overflows");
      }
      elems *= x;
      t.shape.push_back(static_cast<int64_t>(x));
    }
    uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e || e > data_size) {
      return DataLossError("tensor '" + name + "': data_offsets [" + std::to_string(b) + ", " +
                           std::to_string(e) + "] outside the data section of " +
                           std::to_string(data_size) + " bytes");
    }
    t.offset = b;
    t.nbytes = e - b;
    *data_end = std::max(*data_end, e);
    if (t.dtype != DType::kUnknown) {
      uint64_t w = static_cast<uint64_t>(DTypeWidth(t.dtype));
      if (elems > std::numeric_limits<uint64_t>::max() / w || elems * w != t.nbytes) {
        return DataLossError("tensor '" + name + "': shape needs " + std::to_string(elems) +
                             " elements of " + t.dtype_name + " but data_offsets give " +
                             std::to_string(t.nbytes) + " bytes");
      }
    } else if (elems / 8 > t.nbytes || t.nbytes / 16 > elems || (elems == 0) != (t.nbytes == 0)) {
      // A dtype this build does not know is carried as bytes, but its shape must still fit
      // them for some element size between 1 bit and 16 bytes.
      return DataLossError("tensor '" + name + "': unknown dtype '" + t.dtype_name + "' with " +
                           std::to_string(elems) + " elements cannot occupy " +
                           std::to_string(t.nbytes) + " bytes");
    }
    tensors->push_back(std::move(t));
  }
  std::sort(tensors->begin(), tensors->end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  // The tensors tile the data section from offset 0: no overlap, no gap, nothing after the
  // last one (bytes no tensor owns would be carried by no delta).
  uint64_t next = 0;
  for (size_t i = 0; i < tensors->size(); ++i) {
    const auto& t = (*tensors)[i];
    if (t.offset < next) {
      return DataLossError("tensors '" + (*tensors)[i - 1].name + "' and '" + t.name +
                           "' overlap in the data section");
    }
    if (t.offset > next) {
      return DataLossError("tensor '" + t.name + "': gap of " + std::to_string(t.offset - next) +
                           " bytes before it in the data section (at offset " +
                           std::to_string(next) + ")");
    }
    next = t.offset + t.nbytes;
  }
  if (data_size != UINT64_MAX && next != data_size) {
    return DataLossError("data section has " + std::to_string(data_size - next) +
                         " bytes after the last tensor" +
                         (tensors->empty() ? std::string() : " '" + tensors->back().name + "'"));
  }
  return Status::OK();
}

}  // namespace internal

namespace {

// For the error about a file whose safetensors header length is impossible: what the file is
// instead, when it is recognisable (a dcr delta, a sharded checkpoint's index, other JSON text);
// empty otherwise.
std::string RecognizeNonSafetensors(const uint8_t* p, uint64_t n) {
  if (n >= sizeof(kFileMagic) && std::memcmp(p, kFileMagic, sizeof(kFileMagic)) == 0) {
    return "a dcr delta file (magic DCRDELTA), not a safetensors checkpoint: a delta is the DELTA "
           "of `dcr apply BASE DELTA -o OUT` and what `dcr inspect` reads";
  }
  uint64_t i = 0;
  while (i < n && i < 4096 && std::isspace(p[i])) ++i;
  if (i >= n || (p[i] != '{' && p[i] != '[')) return "";
  const std::string head(reinterpret_cast<const char*>(p), std::min<uint64_t>(n, 1 << 16));
  if (head.find("\"weight_map\"") != std::string::npos) {
    return "the index of a sharded checkpoint (a weight_map naming the shard files), not a "
           "safetensors file: give the index's name ending in .safetensors.index.json, or the "
           "checkpoint's directory";
  }
  return "JSON text, not a safetensors checkpoint (a safetensors file starts with the 8-byte "
         "length of its JSON header)";
}

}  // namespace

Status Checkpoint::ParseFile(uint32_t i, std::map<std::string, std::string>* metadata) {
  CheckpointFile& f = files_[i];
  const uint8_t* file = f.data;
  const uint64_t file_size = f.size;
  uint64_t n = 0;
  if (file_size >= 8) std::memcpy(&n, file, 8);
  if (file_size < 8 || n > internal::kMaxSafetensorsHeaderBytes || n > file_size - 8) {
    // An impossible header length: name the file's kind when it is recognisably another one.
    const std::string what = RecognizeNonSafetensors(file, file_size);
    if (!what.empty()) return InvalidArgumentError(what);
  }
  if (file_size < 8) return DataLossError("truncated safetensors file: fewer than 8 bytes");
  if (n > internal::kMaxSafetensorsHeaderBytes) {
    return DataLossError("safetensors header size " + std::to_string(n) +
                         " exceeds the 100 MiB limit");
  }
  if (n > file_size - 8) {
    return DataLossError("truncated safetensors file: header of " + std::to_string(n) +
                         " bytes but file has " + std::to_string(file_size));
  }
  f.data_section_offset = 8 + n;
  const uint64_t data_size = file_size - 8 - n;
  uint64_t data_end = 0;
  std::vector<TensorInfo> tensors;
  DCR_RETURN_IF_ERROR(internal::ParseSafetensorsJson(reinterpret_cast<const char*>(file + 8), n,
                                                     data_size, &tensors, metadata, &data_end));
  for (TensorInfo& t : tensors) {
    t.file = i;
    tensors_.push_back(std::move(t));
  }
  return Status::OK();
}

const TensorInfo* Checkpoint::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t Checkpoint::total_file_bytes() const {
  uint64_t s = 0;
  for (const auto& f : files_) s += f.size;
  return s;
}

uint64_t Checkpoint::total_tensor_bytes() const {
  uint64_t s = 0;
  for (const auto& t : tensors_) s += t.nbytes;
  return s;
}

Hash128 Checkpoint::ContentHash(int threads) const { return ContentHash(threads, nullptr, "hash"); }

Hash128 Checkpoint::ContentHash(int threads, const ProgressCallback& progress_callback,
                                std::string_view phase) const {
  internal::PhaseProgress progress(progress_callback, phase, total_tensor_bytes());
  if (!hash_valid_) {
    // In groups of about kGroupBytes in file order, each group's bytes marked done once hashed
    // (internal::AdviseDone): a checkpoint larger than memory is hashed with a bounded working
    // set. The hash is a sum (hash.h), so the grouping does not change it.
    constexpr uint64_t kGroupBytes = uint64_t{256} << 20;
    Hash128 total;
    std::vector<TensorView> views;
    uint64_t group_bytes = 0;
    auto flush = [&]() {
      if (views.empty()) return;
      HashAdd(&total, ContentHashOf(views, threads));
      for (const TensorView& v : views) internal::AdviseDone(v.data, v.nbytes);
      views.clear();
      progress.Add(group_bytes);
      group_bytes = 0;
    };
    for (const auto& t : tensors_) {
      views.push_back(TensorView{t.name, t.dtype_name, t.shape, data(t), t.nbytes});
      group_bytes += t.nbytes;
      if (group_bytes >= kGroupBytes) flush();
    }
    flush();
    hash_ = total;
    hash_valid_ = true;
  }
  progress.Finish();
  return hash_;
}

namespace {

// Appends `s` as a quoted JSON string. Piecewise, not "\"" + JsonEscape(s) + "\"": g++ 12 at -O3
// reports a -Wrestrict false positive for a string literal added to a temporary string.
void AppendJsonString(std::string* json, const std::string& s) {
  *json += '"';
  *json += JsonEscape(s);
  *json += '"';
}

}  // namespace

std::string BuildSafetensorsHeader(const std::vector<TensorView>& tensors,
                                   const std::map<std::string, std::string>& metadata,
                                   std::vector<uint64_t>* offsets) {
  std::string json = "{";
  bool first = true;
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool f2 = true;
    for (const auto& [k, v] : metadata) {
      if (!f2) json += ",";
      f2 = false;
      AppendJsonString(&json, k);
      json += ':';
      AppendJsonString(&json, v);
    }
    json += "}";
    first = false;
  }
  uint64_t off = 0;
  if (offsets) offsets->clear();
  for (const auto& t : tensors) {
    if (!first) json += ",";
    first = false;
    AppendJsonString(&json, t.name);
    json += ":{\"dtype\":";
    AppendJsonString(&json, t.dtype_name);
    json += ",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) json += ",";
      json += std::to_string(t.shape[i]);
    }
    json +=
        "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + t.nbytes) + "]}";
    if (offsets) offsets->push_back(off);
    off += t.nbytes;
  }
  json += "}";
  while ((8 + json.size()) % 8 != 0) json += ' ';
  std::string out(8, '\0');
  uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json;
}

Status WriteFileAtomicParts(const std::string& path,
                            const std::vector<std::pair<const void*, size_t>>& parts) {
  DCR_ASSIGN_OR_RETURN(auto file, internal::AtomicFile::Create(path));
  uint64_t total = 0;
  for (const auto& part : parts) total += part.second;
  DCR_RETURN_IF_ERROR(file->Reserve(total));
  uint64_t off = 0;
  for (const auto& [p, n] : parts) {
    DCR_RETURN_IF_ERROR(file->PWrite(p, n, off));
    off += n;
  }
  return file->Commit();
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  for (const auto& t : tensors) {
    DType d = DTypeFromName(t.dtype_name);
    if (d != DType::kUnknown) {
      uint64_t elems = 1;
      for (int64_t x : t.shape) {
        if (x < 0) return InvalidArgumentError("tensor '" + t.name + "': negative dimension");
        elems *= static_cast<uint64_t>(x);
      }
      if (elems * static_cast<uint64_t>(DTypeWidth(d)) != t.nbytes) {
        return InvalidArgumentError("tensor '" + t.name + "': shape and byte size disagree");
      }
    }
  }
  std::string header = BuildSafetensorsHeader(tensors, metadata, nullptr);
  std::vector<std::pair<const void*, size_t>> parts;
  parts.emplace_back(header.data(), header.size());
  for (const auto& t : tensors) parts.emplace_back(t.data, t.nbytes);
  return WriteFileAtomicParts(path, parts);
}

std::vector<uint8_t> SafetensorsImage(const std::vector<TensorView>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  const std::string header = BuildSafetensorsHeader(tensors, metadata, nullptr);
  uint64_t size = header.size();
  for (const auto& t : tensors) size += t.nbytes;
  std::vector<uint8_t> out;
  out.reserve(size);
  out.insert(out.end(), header.begin(), header.end());
  for (const auto& t : tensors) {
    const auto* p = static_cast<const uint8_t*>(t.data);
    out.insert(out.end(), p, p + t.nbytes);
  }
  return out;
}

StatusOr<ShardedLayout> PlanShardedCheckpoint(const std::vector<TensorView>& tensors,
                                              uint64_t max_shard_bytes) {
  if (tensors.empty())
    return InvalidArgumentError("a sharded checkpoint needs at least one tensor");
  ShardedLayout out;
  uint64_t bytes = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (out.ranges.empty() || (bytes > 0 && bytes + tensors[i].nbytes > max_shard_bytes)) {
      out.ranges.emplace_back(i, i);
      bytes = 0;
    }
    out.ranges.back().second = i + 1;
    bytes += tensors[i].nbytes;
    total += tensors[i].nbytes;
  }
  std::map<std::string, std::string> weight_map;
  for (size_t k = 0; k < out.ranges.size(); ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, out.ranges.size());
    out.names.push_back(name);
    for (size_t i = out.ranges[k].first; i < out.ranges[k].second; ++i) {
      if (!weight_map.emplace(tensors[i].name, name).second) {
        return InvalidArgumentError("tensor '" + tensors[i].name + "' given twice");
      }
    }
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = nlohmann::ordered_json::object();
  for (const auto& [t, f] : weight_map) index["weight_map"][t] = f;
  out.index_json = index.dump(2) + "\n";
  return out;
}

Status WriteShardedCheckpoint(const std::string& dir, const std::vector<TensorView>& tensors,
                              uint64_t max_shard_bytes,
                              const std::map<std::string, std::string>& metadata) {
  DCR_ASSIGN_OR_RETURN(ShardedLayout layout, PlanShardedCheckpoint(tensors, max_shard_bytes));
  DCR_ASSIGN_OR_RETURN(auto out, internal::AtomicDirectory::Create(dir));
  for (size_t k = 0; k < layout.names.size(); ++k) {
    std::vector<TensorView> part(
        tensors.begin() + static_cast<std::ptrdiff_t>(layout.ranges[k].first),
        tensors.begin() + static_cast<std::ptrdiff_t>(layout.ranges[k].second));
    DCR_RETURN_IF_ERROR(WriteSafetensors(out->FilePath(layout.names[k]), part, metadata));
  }
  DCR_RETURN_IF_ERROR(WriteFileAtomic(out->FilePath(kIndexFileName), layout.index_json.data(),
                                      layout.index_json.size()));
  return out->Commit();
}

Status WriteFileAtomic(const std::string& path, const void* data, size_t size) {
  return WriteFileAtomicParts(path, {{data, size}});
}

StatusOr<std::vector<uint8_t>> ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open " + path, errno);
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      return ErrnoError("read " + path, e);
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  ::close(fd);
  return out;
}

}  // namespace dcr
