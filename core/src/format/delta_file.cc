// Delta header, trailer, inventory, grid, sinks and the reader.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "internal/atomic_file.h"
#include "internal/byte_io.h"
#include "internal/mapped_file.h"
#include "internal/safetensors.h"

namespace dcr {

// ---- inventory and grid ----

StatusOr<Inventory> Inventory::Parse(const std::string& json) {
  Inventory inv;
  std::map<std::string, std::string> metadata;
  DCR_RETURN_IF_ERROR(internal::ParseSafetensorsJson(json.data(), json.size(), ~uint64_t{0},
                                                     &inv.tensors, &metadata, &inv.data_size));
  inv.json = json;
  std::sort(inv.tensors.begin(), inv.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  for (const auto& t : inv.tensors) inv.salts.push_back(TensorSalt(t.name));
  return inv;
}

Inventory Inventory::FromCheckpoint(const Checkpoint& ckpt) {
  Inventory inv;
  inv.json = ckpt.header_json();
  inv.tensors = ckpt.tensors();
  std::sort(inv.tensors.begin(), inv.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  for (const auto& t : inv.tensors) inv.salts.push_back(TensorSalt(t.name));
  inv.data_size = ckpt.file_size() - ckpt.data_section_offset();
  return inv;
}

int Inventory::Find(const std::string& name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorInfo& t, const std::string& n) { return t.name < n; });
  if (it == tensors.end() || it->name != name) return -1;
  return static_cast<int>(it - tensors.begin());
}

std::vector<GridCell> BuildGrid(const Inventory& inv, const DeltaOptions& options) {
  const uint64_t cell = std::max<uint64_t>(options.chunk_elems, 1);
  std::vector<GridCell> grid;
  // Open batch cell per width for small tensors.
  std::map<int, GridCell> open;
  auto flush = [&](int width) {
    auto it = open.find(width);
    if (it != open.end() && !it->second.segments.empty()) grid.push_back(std::move(it->second));
    open.erase(width);
  };
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    const TensorInfo& t = inv.tensors[i];
    const uint64_t n = t.num_elements();
    if (n == 0) continue;
    const int w = t.width();
    if (n < options.small_tensor_elems && n < cell) {
      GridCell& c = open[w];
      if (c.num_elements + n > cell) {
        flush(w);
      }
      GridCell& c2 = open[w];
      c2.width = static_cast<uint8_t>(w);
      c2.segments.push_back(Segment::Range(static_cast<uint32_t>(i), 0, n));
      c2.num_elements += n;
      continue;
    }
    for (uint64_t b = 0; b < n; b += cell) {
      GridCell c;
      c.width = static_cast<uint8_t>(w);
      uint64_t len = std::min(cell, n - b);
      c.segments.push_back(Segment::Range(static_cast<uint32_t>(i), b, len));
      c.num_elements = len;
      grid.push_back(std::move(c));
    }
  }
  for (int w : {1, 2, 4, 8}) flush(w);
  for (size_t i = 0; i < grid.size(); ++i) grid[i].chunk_id = i;
  return grid;
}

// ---- header / trailer ----

std::vector<uint8_t> SerializeFileHeader(const FileHeader& h) {
  std::vector<uint8_t> out;
  // Its final size up front: one allocation (which also keeps g++ 12 from reporting a false
  // -Wstringop-overflow for the magic written into an empty vector).
  out.reserve(8 + 4 + 4 + 8 + 16 + 8 + 4 + h.inventory.size() + 8 + 8);
  internal::ByteWriter w(&out);
  w.Raw(kFileMagic, 8);
  w.U32(h.format_version);
  w.U32(h.flags);
  w.U64(h.base_version);
  w.H128(h.base_hash);
  w.U64(h.target_version);
  w.U32(static_cast<uint32_t>(h.inventory.size()));
  w.Raw(h.inventory.data(), h.inventory.size());
  w.U64(h.chunk_elems);
  w.U64(XXH3_64bits(out.data(), out.size()));
  return out;
}

StatusOr<FileHeader> ParseFileHeader(const uint8_t* data, size_t size, size_t* consumed) {
  internal::ByteReader r(data, size);
  char magic[8];
  r.Raw(magic, 8);
  if (r.failed()) return DataLossError("truncated delta: shorter than its magic");
  if (std::memcmp(magic, kFileMagic, 8) != 0) return DataLossError("not a dcr delta (bad magic)");
  FileHeader h;
  h.format_version = r.U32();
  if (!r.failed() &&
      (h.format_version < kOldestReadableFormatVersion || h.format_version > kFormatVersion)) {
    return FailedPreconditionError("unsupported delta format version " +
                                   std::to_string(h.format_version) + " (this build reads " +
                                   std::to_string(kOldestReadableFormatVersion) + " to " +
                                   std::to_string(kFormatVersion) + ")");
  }
  h.flags = r.U32();
  h.base_version = r.U64();
  h.base_hash = r.H128();
  h.target_version = r.U64();
  uint32_t inv_size = r.U32();
  if (r.failed()) return DataLossError("truncated delta header");
  if (inv_size > internal::kMaxSafetensorsHeaderBytes) {
    return DataLossError("delta header: inventory of " + std::to_string(inv_size) +
                         " bytes exceeds the " +
                         std::to_string(internal::kMaxSafetensorsHeaderBytes) + "-byte cap");
  }
  if (inv_size > r.remaining()) return DataLossError("truncated delta header (inventory)");
  h.inventory.assign(reinterpret_cast<const char*>(r.pos()), inv_size);
  r.Skip(inv_size);
  h.chunk_elems = r.U64();
  size_t body = r.offset();
  uint64_t checksum = r.U64();
  if (r.failed()) return DataLossError("truncated delta header");
  if (XXH3_64bits(data, body) != checksum) return DataLossError("delta header checksum mismatch");
  if (h.flags & ~kFlagNoBase) return DataLossError("unknown delta header flags");
  if (consumed) *consumed = r.offset();
  return h;
}

std::vector<uint8_t> SerializeTrailer(const Trailer& t, uint64_t trailer_offset) {
  std::vector<uint8_t> out;
  internal::ByteWriter w(&out);
  w.Raw(kTrailerMagic, 8);
  w.U64(t.chunks.size());
  for (const auto& e : t.chunks) {
    w.U64(e.chunk_id);
    w.U64(e.offset);
    w.U64(e.size);
  }
  w.H128(t.target_hash);
  w.U64(trailer_offset);
  w.U64(XXH3_64bits(out.data(), out.size()));
  w.Raw(kEndMagic, 8);
  return out;
}

StatusOr<Trailer> ParseTrailer(const uint8_t* data, size_t size) {
  internal::ByteReader r(data, size);
  char magic[8];
  r.Raw(magic, 8);
  if (r.failed() || std::memcmp(magic, kTrailerMagic, 8) != 0) {
    return DataLossError("bad or missing delta trailer");
  }
  uint64_t n = r.U64();
  if (r.failed() || n > r.remaining() / 24) return DataLossError("delta trailer chunk count is absurd");
  Trailer t;
  t.chunks.resize(n);
  for (auto& e : t.chunks) {
    e.chunk_id = r.U64();
    e.offset = r.U64();
    e.size = r.U64();
  }
  t.target_hash = r.H128();
  r.U64();  // trailer_offset, checked by the reader
  size_t body = r.offset();
  uint64_t checksum = r.U64();
  char end[8];
  r.Raw(end, 8);
  if (r.failed()) return DataLossError("truncated delta trailer");
  if (XXH3_64bits(data, body) != checksum) return DataLossError("delta trailer checksum mismatch");
  if (std::memcmp(end, kEndMagic, 8) != 0) return DataLossError("bad delta end marker");
  return t;
}

// ---- sinks ----

Status DeltaMemorySink::OnHeader(const std::vector<uint8_t>& b) {
  bytes_.insert(bytes_.end(), b.begin(), b.end());
  return Status::OK();
}
Status DeltaMemorySink::OnChunk(const ChunkHeader&, const std::vector<uint8_t>& b) {
  bytes_.insert(bytes_.end(), b.begin(), b.end());
  return Status::OK();
}
Status DeltaMemorySink::OnTrailer(const std::vector<uint8_t>& b) {
  bytes_.insert(bytes_.end(), b.begin(), b.end());
  return Status::OK();
}

DeltaFileSink::DeltaFileSink(std::string path) : path_(std::move(path)) {}

DeltaFileSink::~DeltaFileSink() = default;

Status DeltaFileSink::OnHeader(const std::vector<uint8_t>& bytes) {
  DCR_ASSIGN_OR_RETURN(file_, internal::AtomicFile::Create(path_));
  return file_->Write(bytes.data(), bytes.size());
}

Status DeltaFileSink::OnChunk(const ChunkHeader&, const std::vector<uint8_t>& bytes) {
  if (!file_) return FailedPreconditionError("delta file sink is not open");
  return file_->Write(bytes.data(), bytes.size());
}

Status DeltaFileSink::OnTrailer(const std::vector<uint8_t>& bytes) {
  if (!file_) return FailedPreconditionError("delta file sink is not open");
  DCR_RETURN_IF_ERROR(file_->Write(bytes.data(), bytes.size()));
  Status s = file_->Commit();
  file_.reset();  // removes the temporary when the commit failed
  return s;
}

// ---- reader ----

DeltaReader::~DeltaReader() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

StatusOr<std::unique_ptr<DeltaReader>> DeltaReader::Open(const std::string& path) {
  std::unique_ptr<DeltaReader> r(new DeltaReader());
  uint64_t size = 0;
  DCR_RETURN_IF_ERROR(internal::MapReadOnly(path, &r->map_, &size));
  r->size_ = static_cast<size_t>(size);
  r->data_ = static_cast<const uint8_t*>(r->map_);
  Status s = r->Init();
  if (!s.ok()) return s.WithContext(path);
  return r;
}

StatusOr<std::unique_ptr<DeltaReader>> DeltaReader::FromBytes(std::vector<uint8_t> bytes) {
  std::unique_ptr<DeltaReader> r(new DeltaReader());
  r->owned_ = std::move(bytes);
  r->data_ = r->owned_.data();
  r->size_ = r->owned_.size();
  DCR_RETURN_IF_ERROR(r->Init());
  return r;
}

Status DeltaReader::Init() {
  size_t hsize = 0;
  DCR_ASSIGN_OR_RETURN(header_, ParseFileHeader(data_, size_, &hsize));
  // Trailer: the last 8 bytes are the end magic; before them checksum and trailer offset.
  if (size_ < hsize + 8 + 8 + 8 + 16 + 8 + 8) return DataLossError("truncated delta: no trailer");
  uint64_t trailer_offset = 0;
  std::memcpy(&trailer_offset, data_ + size_ - 24, 8);
  if (trailer_offset < hsize || trailer_offset >= size_) {
    return DataLossError("truncated or corrupt delta: bad trailer offset");
  }
  DCR_ASSIGN_OR_RETURN(trailer_, ParseTrailer(data_ + trailer_offset, size_ - trailer_offset));
  std::set<uint64_t> ids;
  for (const auto& e : trailer_.chunks) {
    if (e.offset < hsize || e.offset > trailer_offset || e.size > trailer_offset - e.offset) {
      return DataLossError("chunk table entry outside the chunk area");
    }
    if (!ids.insert(e.chunk_id).second) return DataLossError("duplicate chunk id in the chunk table");
  }
  DCR_ASSIGN_OR_RETURN(inventory_, Inventory::Parse(header_.inventory));
  return Status::OK();
}

}  // namespace dcr
