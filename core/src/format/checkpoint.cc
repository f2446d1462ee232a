// safetensors reading (mmap) and atomic writing.
#include "dcr/checkpoint.h"

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
#include "internal/safetensors.h"

namespace dcr {
namespace {

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
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

Checkpoint::~Checkpoint() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& path) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  DCR_RETURN_IF_ERROR(internal::MapReadOnly(path, &ck->map_, &ck->map_size_));
  ck->file_ = static_cast<const uint8_t*>(ck->map_);
  ck->file_size_ = ck->map_size_;
  Status s = ck->Parse();
  if (!s.ok()) return s.WithContext(path);
  return ck;
}

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::FromBytes(std::vector<uint8_t> bytes) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->owned_ = std::move(bytes);
  ck->file_ = ck->owned_.data();
  ck->file_size_ = ck->owned_.size();
  DCR_RETURN_IF_ERROR(ck->Parse());
  return ck;
}

namespace internal {

Status ParseSafetensorsJson(const char* json, size_t n, uint64_t data_size,
                            std::vector<TensorInfo>* tensors,
                            std::map<std::string, std::string>* metadata, uint64_t* data_end) {
  // JSON keeps the last of duplicate keys: a second tensor of the same name (or a second
  // "dtype" in one tensor) would silently replace the first. Every object's keys are checked.
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
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json, json + n, callback);
  } catch (const std::exception& e) {
    return DataLossError(std::string("malformed safetensors JSON header: ") + e.what());
  }
  if (!duplicate.empty()) {
    return DataLossError("safetensors header names '" + duplicate + "' twice");
  }
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
      return DataLossError("tensor '" + name + "': unknown dtype '" + t.dtype_name +
                           "' with " + std::to_string(elems) + " elements cannot occupy " +
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
    return "the index of a sharded checkpoint (model.safetensors.index.json: a weight_map naming "
           "the shard files), not a safetensors file: dcr reads one .safetensors file (`dcr "
           "verify DIR_A DIR_B` compares two shard directories)";
  }
  return "JSON text, not a safetensors checkpoint (a safetensors file starts with the 8-byte "
         "length of its JSON header)";
}

}  // namespace

Status Checkpoint::Parse() {
  uint64_t n = 0;
  if (file_size_ >= 8) std::memcpy(&n, file_, 8);
  if (file_size_ < 8 || n > internal::kMaxSafetensorsHeaderBytes || n > file_size_ - 8) {
    // An impossible header length: name the file's kind when it is recognisably another one.
    const std::string what = RecognizeNonSafetensors(file_, file_size_);
    if (!what.empty()) return InvalidArgumentError(what);
  }
  if (file_size_ < 8) return DataLossError("truncated safetensors file: fewer than 8 bytes");
  if (n > internal::kMaxSafetensorsHeaderBytes) {
    return DataLossError("safetensors header size " + std::to_string(n) + " exceeds the 100 MiB limit");
  }
  if (n > file_size_ - 8) {
    return DataLossError("truncated safetensors file: header of " + std::to_string(n) +
                         " bytes but file has " + std::to_string(file_size_));
  }
  data_section_ = file_ + 8 + n;
  const uint64_t data_size = file_size_ - 8 - n;
  uint64_t data_end = 0;
  DCR_RETURN_IF_ERROR(internal::ParseSafetensorsJson(reinterpret_cast<const char*>(file_ + 8), n,
                                                     data_size, &tensors_, &metadata_, &data_end));
  index_.clear();
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  return Status::OK();
}

const TensorInfo* Checkpoint::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::string Checkpoint::header_json() const {
  uint64_t n = 0;
  std::memcpy(&n, file_, 8);
  return std::string(reinterpret_cast<const char*>(file_ + 8), n);
}

uint64_t Checkpoint::total_tensor_bytes() const {
  uint64_t s = 0;
  for (const auto& t : tensors_) s += t.nbytes;
  return s;
}

Hash128 Checkpoint::ContentHash(int threads) const {
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
    json += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + t.nbytes) +
            "]}";
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
