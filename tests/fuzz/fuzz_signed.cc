// libFuzzer target: a whole signed delta stream (format version 6) -> every manifest record it
// holds parsed, VerifyDeltaFile with the seed key of the seeds (dcr_fuzz_seeds), and the stream's
// records delivered in order through a TrustedReceiver over storage sized by the delta's own
// inventory (bounded; filled as the seeds' base, so seeded deltas apply). A second TrustedReceiver
// gets the stream as a relay that decodes context-coded chunks forwards it: each context chunk
// turned into its plain form (ContextChunkToPlain against that receiver's base bits), which the
// manifest's plain SHA-256 must vouch for. A parsed manifest must serialize back to its own
// bytes.
#include <cstring>
#include <string>

#include "dcr/context.h"
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
  // Two copies of the storage (the FixedModel's bit pattern): as built, and as decoded by a relay.
  std::vector<std::vector<uint8_t>> store, store2;
  std::vector<ReceiverTensor> tensors, tensors2;
  std::vector<TensorBuffer> bits;
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    store.emplace_back(inv.tensors[i].nbytes);
    for (size_t b = 0; b < store.back().size(); ++b)
      store.back()[b] = static_cast<uint8_t>(b * 131 + i);
  }
  store2 = store;
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    tensors.push_back({inv.tensors[i], store[i].data()});
    tensors2.push_back({inv.tensors[i], store2[i].data()});
    const int w = DTypeWidth(inv.tensors[i].dtype);
    bits.push_back(
        {store2[i].data(), w > 0 ? inv.tensors[i].nbytes / static_cast<uint64_t>(w) : 0, w, 0});
  }
  TrustOptions o;
  o.key = trust;
  o.run_id = 1;
  o.max_pending_bytes = 1 << 20;
  const VersionId held{d.header().base_version, d.header().base_hash};
  TrustedReceiver rx(std::make_unique<BufferReceiver>(std::move(tensors), held), o);
  TrustedReceiver rx2(std::make_unique<BufferReceiver>(std::move(tensors2), held), o);
  size_t hsize = 0;
  if (!ParseFileHeader(data, size, &hsize).ok()) return 0;
  if (!rx.Begin(data, hsize).ok()) return 0;
  const bool decoding = rx2.Begin(data, hsize).ok();
  std::vector<uint8_t> covered;
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
    if (decoding) {
      StatusOr<ChunkHeader> h = IsManifestRecord(data + off, rs)
                                    ? StatusOr<ChunkHeader>(InvalidArgumentError("manifest"))
                                    : ParseChunkHeader(data + off, rs, nullptr, nullptr);
      if (h.ok() && IsContextCoded(*h) && GatherCoveredBits(*h, bits, &covered).ok()) {
        StatusOr<std::vector<uint8_t>> plain =
            ContextChunkToPlain(data + off, rs, covered.data(), covered.size());
        if (plain.ok()) (void)rx2.ApplyRecord(plain->data(), plain->size());
      } else {
        (void)rx2.ApplyRecord(data + off, rs);
      }
    }
    off += rs;
  }
  (void)rx.Commit(data + trailer_offset, size - trailer_offset);
  if (decoding) (void)rx2.Commit(data + trailer_offset, size - trailer_offset);
  return 0;
}
