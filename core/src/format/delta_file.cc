// Delta header, trailer, inventory, grid, sinks and the reader.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

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
#include "internal/chunk_bounds.h"
#include "internal/mapped_file.h"
#include "internal/safetensors.h"

namespace dcr {

// ---- inventory and grid ----

namespace {

void SortByName(Inventory* inv) {
  std::sort(inv->tensors.begin(), inv->tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  inv->salts.clear();
  for (const auto& t : inv->tensors) inv->salts.push_back(TensorSalt(t.name));
}

}  // namespace

StatusOr<Inventory> Inventory::Parse(const std::string& json) {
  FileHeader h;
  h.SetSingleFile(json);
  return FromHeader(h);
}

StatusOr<Inventory> Inventory::FromHeader(const FileHeader& header) {
  Inventory inv;
  if (header.files.empty()) return DataLossError("delta header names no target file");
  const bool sharded = header.sharded();
  std::set<std::string> names;
  for (size_t i = 0; i < header.files.size(); ++i) {
    const TargetFile& f = header.files[i];
    if (sharded && !internal::IsPlainFileName(f.name)) {
      return DataLossError("delta header: target file name '" + f.name +
                           "' is not a plain file name");
    }
    if (sharded && !names.insert(f.name).second) {
      return DataLossError("delta header names target file " + f.name + " twice");
    }
    InventoryFile file;
    file.name = f.name;
    file.json = f.header;
    std::vector<TensorInfo> tensors;
    std::map<std::string, std::string> metadata;
    Status s = internal::ParseSafetensorsJson(f.header.data(), f.header.size(), ~uint64_t{0},
                                              &tensors, &metadata, &file.data_size);
    if (!s.ok()) return sharded ? s.WithContext("target file " + f.name) : s;
    for (TensorInfo& t : tensors) {
      t.file = static_cast<uint32_t>(i);
      inv.tensors.push_back(std::move(t));
    }
    inv.files.push_back(std::move(file));
  }
  SortByName(&inv);
  for (size_t i = 1; i < inv.tensors.size(); ++i) {
    if (inv.tensors[i].name == inv.tensors[i - 1].name) {
      return DataLossError("delta header: tensor '" + inv.tensors[i].name +
                           "' is in two target files, " + inv.files[inv.tensors[i - 1].file].name +
                           " and " + inv.files[inv.tensors[i].file].name);
    }
  }
  if (!header.index_name.empty()) {
    if (!sharded || !internal::IsPlainFileName(header.index_name)) {
      return DataLossError("delta header: an index file '" + header.index_name +
                           "' needs a sharded target and a plain file name");
    }
    if (names.count(header.index_name)) {
      return DataLossError("delta header: index file " + header.index_name + " is also a shard");
    }
    DCR_ASSIGN_OR_RETURN(ShardIndex index, ParseShardIndex(header.index));
    std::vector<std::string> file_names;
    for (const auto& f : inv.files) file_names.push_back(f.name);
    DCR_RETURN_IF_ERROR(CheckShardIndex(index, file_names, inv.tensors));
    inv.index_name = header.index_name;
    inv.index_json = header.index;
  }
  return inv;
}

Inventory Inventory::FromCheckpoint(const Checkpoint& ckpt) {
  Inventory inv;
  for (const CheckpointFile& f : ckpt.files()) {
    InventoryFile file;
    file.name = f.name;
    file.json = f.header_json();
    file.data_size = f.size - f.data_section_offset;
    inv.files.push_back(std::move(file));
  }
  inv.index_name = ckpt.index_name();
  inv.index_json = ckpt.index_json();
  inv.tensors = ckpt.tensors();
  SortByName(&inv);
  return inv;
}

void Inventory::ToHeader(FileHeader* header) const {
  header->files.clear();
  for (const InventoryFile& f : files) header->files.push_back(TargetFile{f.name, f.json});
  header->index_name = index_name;
  header->index = index_json;
}

uint64_t Inventory::data_size() const {
  uint64_t n = 0;
  for (const auto& f : files) n += f.data_size;
  return n;
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

namespace {

std::string NamedSection(const std::string& name, const std::string& bytes) {
  std::string out(4, '\0');
  const uint32_t n = static_cast<uint32_t>(name.size());
  std::memcpy(out.data(), &n, 4);
  out += name;
  out += bytes;
  return out;
}

// Splits a named section (u32 name_size | name | bytes). False if malformed.
bool SplitNamedSection(const std::string& section, std::string* name, std::string* bytes) {
  if (section.size() < 4) return false;
  uint32_t n = 0;
  std::memcpy(&n, section.data(), 4);
  if (n > section.size() - 4) return false;
  name->assign(section, 4, n);
  bytes->assign(section, 4 + n, std::string::npos);
  return true;
}

// Upper bound on the sections of a header (one per target file, and a few more).
constexpr uint32_t kMaxSections = 1u << 20;

// The zstd level of version 8's compressed sections (part of the output's identity).
constexpr int kSectionZstdLevel = 19;

// A kSectionZstd body: u32 inner kind | one zstd frame of `body`, content size set, no checksum.
std::string ZstdSection(uint32_t inner_kind, const std::string& body) {
  std::string out(4 + ZSTD_compressBound(body.size()), '\0');
  std::memcpy(out.data(), &inner_kind, 4);
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, kSectionZstdLevel);
  ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1);
  ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 0);
  const size_t n = ZSTD_compress2(c, out.data() + 4, out.size() - 4, body.data(), body.size());
  ZSTD_freeCCtx(c);
  // Cannot fail: the destination holds ZSTD_compressBound bytes and the parameters are valid.
  out.resize(4 + n);
  return out;
}

// Unpacks a kSectionZstd body into its inner kind and bytes, at most `cap` of them.
Status UnzstdSection(const std::string& section, uint64_t cap, uint32_t* inner_kind,
                     std::string* body) {
  if (section.size() < 4) return DataLossError("delta header: compressed section without a kind");
  std::memcpy(inner_kind, section.data(), 4);
  const char* frame = section.data() + 4;
  const size_t frame_size = section.size() - 4;
  const unsigned long long n = ZSTD_getFrameContentSize(frame, frame_size);
  if (n == ZSTD_CONTENTSIZE_UNKNOWN || n == ZSTD_CONTENTSIZE_ERROR) {
    return DataLossError(
        "delta header: compressed section is not a zstd frame with its content size");
  }
  if (n > cap) {
    return DataLossError("delta header: sections of more than " +
                         std::to_string(internal::kMaxSafetensorsHeaderBytes) +
                         " bytes exceed the cap");
  }
  // A zstd block yields at most 128 KiB and takes at least 4 bytes: a larger claim is corrupt.
  if (n / 32768 > frame_size)
    return DataLossError("delta header: compressed section claims too much");
  body->assign(static_cast<size_t>(n), '\0');
  const size_t got = ZSTD_decompress(body->data(), body->size(), frame, frame_size);
  if (ZSTD_isError(got) || got != n)
    return DataLossError("delta header: corrupt compressed section");
  return Status::OK();
}

}  // namespace

uint32_t EncodedFormatVersion(const FileHeader& h) {
  if ((h.flags & kFlagContext) != 0) return 8;
  return (h.flags & kFlagSigned) != 0 ? 6 : kPlainFormatVersion;
}

std::vector<uint8_t> SerializeFileHeader(const FileHeader& h) {
  std::vector<std::pair<uint32_t, std::string>> sections;
  const bool zstd = EncodedFormatVersion(h) >= 8;
  auto add = [&](uint32_t kind, std::string body) {
    if (zstd) {
      sections.emplace_back(kSectionZstd, ZstdSection(kind, body));
    } else {
      sections.emplace_back(kind, std::move(body));
    }
  };
  for (const TargetFile& f : h.files) add(kSectionFile, NamedSection(f.name, f.header));
  if (!h.index_name.empty()) add(kSectionIndex, NamedSection(h.index_name, h.index));
  for (const HeaderSection& s : h.other_sections) sections.emplace_back(s.kind, s.bytes);
  size_t size = 8 + 4 + 4 + 8 + 16 + 8 + 4 + 8 + 8;
  for (const auto& s : sections) size += 8 + s.second.size();
  std::vector<uint8_t> out;
  // Its final size up front: one allocation (which also keeps g++ 12 from reporting a false
  // -Wstringop-overflow for the magic written into an empty vector).
  out.reserve(size);
  internal::ByteWriter w(&out);
  w.Raw(kFileMagic, 8);
  w.U32(EncodedFormatVersion(h));
  w.U32(h.flags);
  w.U64(h.base_version);
  w.H128(h.base_hash);
  w.U64(h.target_version);
  w.U32(static_cast<uint32_t>(sections.size()));
  for (const auto& [kind, bytes] : sections) {
    w.U32(kind);
    w.U32(static_cast<uint32_t>(bytes.size()));
    w.Raw(bytes.data(), bytes.size());
  }
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
  if (r.failed()) return DataLossError("truncated delta header");
  const uint64_t cap = internal::kMaxSafetensorsHeaderBytes;
  uint32_t unknown_critical = 0;  // refused once the checksum says the header is intact
  if (h.format_version < 5) {
    uint32_t inv_size = r.U32();
    if (r.failed()) return DataLossError("truncated delta header");
    if (inv_size > cap) {
      return DataLossError("delta header: inventory of " + std::to_string(inv_size) +
                           " bytes exceeds the " + std::to_string(cap) + "-byte cap");
    }
    if (inv_size > r.remaining()) return DataLossError("truncated delta header (inventory)");
    h.SetSingleFile(std::string(reinterpret_cast<const char*>(r.pos()), inv_size));
    r.Skip(inv_size);
  } else {
    const uint32_t n = r.U32();
    if (r.failed()) return DataLossError("truncated delta header");
    if (n > kMaxSections || n > r.remaining() / 8) {
      return DataLossError("delta header: " + std::to_string(n) + " sections is absurd");
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t stored_kind = r.U32();
      const uint32_t bytes = r.U32();
      if (r.failed()) return DataLossError("truncated delta header (section table)");
      total += bytes;
      if (total > cap) {
        return DataLossError("delta header: sections of more than " + std::to_string(cap) +
                             " bytes exceed the cap");
      }
      if (bytes > r.remaining()) return DataLossError("truncated delta header (section)");
      std::string body(reinterpret_cast<const char*>(r.pos()), bytes);
      r.Skip(bytes);
      uint32_t kind = stored_kind;
      if (stored_kind == kSectionZstd) {
        if (h.format_version < 8) {
          return DataLossError("delta header: a compressed section needs format version 8, not " +
                               std::to_string(h.format_version));
        }
        std::string inner;
        DCR_RETURN_IF_ERROR(UnzstdSection(body, cap - total, &kind, &inner));
        if (kind != kSectionFile && kind != kSectionIndex) {
          return DataLossError("delta header: compressed section of kind " +
                               std::to_string(kind & ~kSectionCritical) +
                               " (only file and index sections are)");
        }
        total += inner.size();
        body = std::move(inner);
      }
      if (kind == kSectionFile || kind == kSectionIndex) {
        std::string name, content;
        if (!SplitNamedSection(body, &name, &content)) {
          return DataLossError("delta header: malformed file section");
        }
        if (kind == kSectionFile) {
          h.files.push_back(TargetFile{std::move(name), std::move(content)});
        } else {
          if (!h.index_name.empty()) return DataLossError("delta header: two index sections");
          if (name.empty()) return DataLossError("delta header: index section without a name");
          h.index_name = std::move(name);
          h.index = std::move(content);
        }
      } else if ((kind & kSectionCritical) != 0) {
        if (unknown_critical == 0) unknown_critical = kind;
      } else {
        h.other_sections.push_back(HeaderSection{kind, std::move(body)});
      }
    }
  }
  h.chunk_elems = r.U64();
  size_t body = r.offset();
  uint64_t checksum = r.U64();
  if (r.failed()) return DataLossError("truncated delta header");
  if (XXH3_64bits(data, body) != checksum) return DataLossError("delta header checksum mismatch");
  if (unknown_critical != 0) {
    return FailedPreconditionError("delta header has a section of kind " +
                                   std::to_string(unknown_critical & ~kSectionCritical) +
                                   " that this build does not know and may not skip: a newer "
                                   "dcr wrote it");
  }
  if (h.files.empty()) return DataLossError("delta header names no target file");
  if (h.flags & ~(kFlagNoBase | kFlagSigned | kFlagContext)) {
    return DataLossError("unknown delta header flags");
  }
  if ((h.flags & kFlagContext) != 0 && h.format_version < 6) {
    return DataLossError("delta header: the context-coding flag needs format version 6, not " +
                         std::to_string(h.format_version));
  }
  if ((h.flags & kFlagSigned) != 0 && h.format_version < 6) {
    return DataLossError("delta header: the signed flag needs format version 6, not " +
                         std::to_string(h.format_version));
  }
  if (consumed) *consumed = r.offset();
  return h;
}

namespace {

uint64_t ZigZag(uint64_t d) { return (d << 1) ^ ((d >> 63) != 0 ? ~uint64_t{0} : 0); }
uint64_t UnZigZag(uint64_t z) { return (z >> 1) ^ (~(z & 1) + 1); }

}  // namespace

std::vector<uint8_t> SerializeTrailer(const Trailer& t, uint64_t trailer_offset) {
  std::vector<uint8_t> out;
  internal::ByteWriter w(&out);
  if (t.compact) {
    w.Raw(kCompactTrailerMagic, 8);
    w.Leb(t.chunks.size());
    uint64_t id = 0, end = 0;
    for (const auto& e : t.chunks) {
      w.Leb(ZigZag(e.chunk_id - id));
      w.Leb(ZigZag(e.offset - end));
      w.Leb(e.size);
      id = e.chunk_id;
      end = e.offset + e.size;
    }
  } else {
    w.Raw(kTrailerMagic, 8);
    w.U64(t.chunks.size());
    for (const auto& e : t.chunks) {
      w.U64(e.chunk_id);
      w.U64(e.offset);
      w.U64(e.size);
    }
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
  Trailer t;
  t.compact = !r.failed() && std::memcmp(magic, kCompactTrailerMagic, 8) == 0;
  if (r.failed() || (!t.compact && std::memcmp(magic, kTrailerMagic, 8) != 0)) {
    return DataLossError("bad or missing delta trailer");
  }
  if (t.compact) {
    // Each entry takes at least 3 bytes.
    const uint64_t n = r.Leb();
    if (r.failed() || n > r.remaining() / 3)
      return DataLossError("delta trailer chunk count is absurd");
    t.chunks.resize(n);
    uint64_t id = 0, end = 0;
    for (auto& e : t.chunks) {
      e.chunk_id = id + UnZigZag(r.Leb());
      e.offset = end + UnZigZag(r.Leb());
      e.size = r.Leb();
      id = e.chunk_id;
      end = e.offset + e.size;
    }
  } else {
    const uint64_t n = r.U64();
    if (r.failed() || n > r.remaining() / 24)
      return DataLossError("delta trailer chunk count is absurd");
    t.chunks.resize(n);
    for (auto& e : t.chunks) {
      e.chunk_id = r.U64();
      e.offset = r.U64();
      e.size = r.U64();
    }
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
Status DeltaSink::OnContextChunk(const ChunkHeader& header, const std::vector<uint8_t>& bytes,
                                 const std::vector<uint8_t>&) {
  return OnChunk(header, bytes);
}

Status DeltaSink::OnManifest(const std::vector<uint8_t>&) {
  return UnimplementedError("this delta sink cannot carry manifest records (a signed stream)");
}
Status DeltaMemorySink::OnManifest(const std::vector<uint8_t>& b) {
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

Status DeltaFileSink::OnManifest(const std::vector<uint8_t>& bytes) {
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
  // Trailer: the last 8 bytes are the end magic; before them checksum and trailer offset. The
  // smallest is a compact one of no chunk: magic, a one-byte count, target hash, offset,
  // checksum, end magic.
  if (size_ < hsize + 8 + 1 + 16 + 8 + 8 + 8) return DataLossError("truncated delta: no trailer");
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
    if (!ids.insert(e.chunk_id).second)
      return DataLossError("duplicate chunk id in the chunk table");
  }
  DCR_ASSIGN_OR_RETURN(inventory_, Inventory::FromHeader(header_));
  return Status::OK();
}

Status DeltaReader::DecodeInto(size_t i, DecodedChunk* out) const {
  DCR_ASSIGN_OR_RETURN(ChunkHeader h,
                       ParseChunkHeader(chunk_data(i), chunk_size(i), nullptr, nullptr));
  DCR_RETURN_IF_ERROR(internal::CheckChunkBounds(h, inventory_));
  return internal::NoThrow("decoding a chunk",
                           [&] { return DecodeChunkInto(chunk_data(i), chunk_size(i), out); });
}

StatusOr<DecodedChunk> DeltaReader::Decode(size_t i) const {
  DecodedChunk out;
  DCR_RETURN_IF_ERROR(DecodeInto(i, &out));
  return out;
}

}  // namespace dcr
