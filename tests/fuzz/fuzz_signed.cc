// libFuzzer target: a whole signed delta stream (format version 6) -> every manifest record it
// holds parsed, VerifyDeltaFile with the seed key of the seeds (dcr_fuzz_seeds), and the stream's
// records delivered in order through a TrustedReceiver over storage sized by the delta's own
// inventory (bounded). A parsed manifest must serialize back to its own bytes.
#include <cstring>
#include <string>

#include "dcr/delta.h"
#include "dcr/manifest.h"
#include "dcr/signing.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dcr;
  for (size_t off = 0; off + 4 <= size; ++off) {
    if (!IsManifestRecord(data + off, size - off)) continue;
    size_t rs = 0;
    StatusOr<Manifest> m = ParseManifest(data + off, size - off, &rs);
    if (!m.ok()) continue;
    std::vector<uint8_t> again = SerializeManifest(*m);
    if (again.size() != rs || std::memcmp(again.data(), data + off, rs) != 0) __builtin_trap();
  }
  static std::shared_ptr<const TrustKey> trust = [] {
    auto k = SigningKey::FromSeed(fuzz::kSigningSeed);
    if (!k.ok()) __builtin_trap();
    auto t = TrustKey::FromRaw((*k)->public_key());
    if (!t.ok()) __builtin_trap();
    return *t;
  }();
  StatusOr<std::unique_ptr<DeltaReader>> r =
      DeltaReader::FromBytes(std::vector<uint8_t>(data, data + size));
  if (!r.ok()) return 0;
  const DeltaReader& d = **r;
  (void)VerifyDeltaFile(d, trust, 1);
  const Inventory& inv = d.inventory();
  if (inv.data_size() > (uint64_t{8} << 20)) return 0;  // keep memory bounded
  std::vector<std::vector<uint8_t>> store;
  std::vector<ReceiverTensor> tensors;
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    store.emplace_back(inv.tensors[i].nbytes, static_cast<uint8_t>(i));
  }
  for (size_t i = 0; i < inv.tensors.size(); ++i) tensors.push_back({inv.tensors[i], store[i].data()});
  TrustOptions o;
  o.key = trust;
  o.run_id = 1;
  o.max_pending_bytes = 1 << 20;
  TrustedReceiver rx(std::make_unique<BufferReceiver>(
                         std::move(tensors), VersionId{d.header().base_version, d.header().base_hash}),
                     o);
  size_t hsize = 0;
  if (!ParseFileHeader(data, size, &hsize).ok()) return 0;
  if (!rx.Begin(data, hsize).ok()) return 0;
  uint64_t trailer_offset = 0;
  std::memcpy(&trailer_offset, data + size - 24, 8);
  size_t off = hsize;
  while (off < trailer_offset) {
    size_t rs = 0, hs = 0;
    if (IsManifestRecord(data + off, trailer_offset - off)) {
      if (!ParseManifest(data + off, trailer_offset - off, &rs).ok()) break;
    } else if (!ParseChunkHeader(data + off, trailer_offset - off, &hs, &rs).ok() ||
               rs > trailer_offset - off) {
      break;
    }
    (void)rx.ApplyRecord(data + off, rs);
    off += rs;
  }
  (void)rx.Commit(data + trailer_offset, size - trailer_offset);
  return 0;
}
