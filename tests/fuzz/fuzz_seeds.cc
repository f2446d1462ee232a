// Writes seed inputs for the fuzz targets: real deltas (ulp, XOR, full frame, small and batched
// tensors), the same signed (and signed with context coding), their chunk records, overwrite forms
// and context-coded forms, and journals of real applies.
//   dcr_fuzz_seeds OUT_DIR   ->  OUT_DIR/{chunk,delta,journal,signed}/seed-*
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "dcr/context.h"
#include "dcr/delta.h"
#include "dcr/journal.h"
#include "dcr/signing.h"
#include "dcr/sums.h"
#include "dcr/versioning.h"
#include "fuzz_common.h"

namespace {

void Write(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dcr;
  if (argc != 2) {
    std::fprintf(stderr, "usage: dcr_fuzz_seeds OUT_DIR\n");
    return 2;
  }
  std::string out = argv[1];
  for (const char* d : {"", "/chunk", "/delta", "/journal", "/signed", "/sums"}) {
    ::mkdir((out + d).c_str(), 0755);
  }
  auto signing_key = SigningKey::FromSeed(fuzz::kSigningSeed);
  if (!signing_key.ok()) return 1;
  fuzz::FixedModel m;
  m.Buffers();
  auto base = Checkpoint::FromBytes(SafetensorsImage(m.Views()));
  std::mt19937_64 rng(1);
  fuzz::FixedModel t = m;
  for (auto& b : t.bufs) {
    for (size_t i = 0; i < b.size(); ++i) {
      if (rng() % 40 == 0) b[i] ^= static_cast<uint8_t>(1 + rng() % 7);
    }
  }
  auto target = Checkpoint::FromBytes(SafetensorsImage(t.Views()));
  if (!base.ok() || !target.ok()) {
    std::fprintf(stderr, "checkpoint: %s %s\n", base.status().ToString().c_str(),
                 target.status().ToString().c_str());
    return 1;
  }
  int n = 0;
  struct Variant {
    ValuePolicy policy;
    bool full;
    uint64_t chunk_elems;
  };
  for (Variant v :
       {Variant{ValuePolicy::kAuto, false, 1024}, Variant{ValuePolicy::kXor, false, 512},
        Variant{ValuePolicy::kAbsolute, false, 2048}, Variant{ValuePolicy::kAuto, true, 1024}}) {
    DeltaOptions o;
    o.chunk_elems = v.chunk_elems;
    o.small_tensor_elems = 512;
    o.value_policy = v.policy;
    o.full = v.full;
    o.threads = 1;
    DeltaMemorySink sink;
    auto st = BuildDelta(v.full ? nullptr : base->get(), **target, o, &sink);
    if (!st.ok()) {
      std::fprintf(stderr, "BuildDelta: %s\n", st.status().ToString().c_str());
      return 1;
    }
    std::vector<uint8_t> bytes = sink.Release();
    Write(out + "/delta/seed-" + std::to_string(n), bytes);
    {  // the same delta signed (run 1, 2 chunks per manifest)
      DeltaMemorySink signed_mem;
      SignOptions so;
      so.run_id = 1;
      so.chunks_per_manifest = 2;
      SigningSink signing(signing_key->get(), so, &signed_mem);
      if (!BuildDelta(v.full ? nullptr : base->get(), **target, o, &signing).ok()) return 1;
      Write(out + "/signed/seed-" + std::to_string(n), signed_mem.bytes());
    }
    if (!v.full) {  // signed with context coding: manifests list both forms of context chunks
      DeltaOptions oc = o;
      oc.context_coding = true;
      DeltaMemorySink signed_mem;
      SignOptions so;
      so.run_id = 1;
      so.chunks_per_manifest = 2;
      SigningSink signing(signing_key->get(), so, &signed_mem);
      if (!BuildDelta(base->get(), **target, oc, &signing).ok()) return 1;
      Write(out + "/signed/seed-" + std::to_string(n) + "-ctx", signed_mem.bytes());
    }
    auto r = DeltaReader::FromBytes(bytes);
    if (!r.ok()) return 1;
    for (size_t i = 0; i < (*r)->num_chunks(); ++i) {
      const uint8_t* c = (*r)->chunk_data(i);
      Write(out + "/chunk/seed-" + std::to_string(n) + "-" + std::to_string(i),
            std::vector<uint8_t>(c, c + (*r)->chunk_size(i)));
      if (!v.full) {
        auto ow = OverwriteChunkFromRelative(c, (*r)->chunk_size(i), (*r)->inventory(), **base);
        if (ow.ok())
          Write(out + "/chunk/seed-" + std::to_string(n) + "-" + std::to_string(i) + "-ow", *ow);
        // Its context-coded form against the fixed model's bits (the base of these deltas).
        auto h = ParseChunkHeader(c, (*r)->chunk_size(i), nullptr, nullptr);
        std::vector<uint8_t> covered;
        if (h.ok() && ContextCodable(*h) && GatherCoveredBits(*h, m.Buffers(), &covered).ok()) {
          auto ctx = EncodeContextChunk(c, (*r)->chunk_size(i), covered.data(), covered.size());
          if (ctx.ok())
            Write(out + "/chunk/seed-" + std::to_string(n) + "-" + std::to_string(i) + "-ctx",
                  *ctx);
        }
      }
    }
    // A journal of a real apply that stopped mid-delta, and one that committed.
    if (!v.full) {
      std::string jp = out + "/journal/seed-" + std::to_string(n);
      std::remove(jp.c_str());
      auto j = ReceiverJournal::Open(jp);
      if (!j.ok()) return 1;
      (void)(*j)->RecordCommitted({0, (*base)->ContentHash(1)});
      m.Buffers();
      BufferReceiver inner(m.Tensors(), {0, (*base)->ContentHash(1)});
      JournaledReceiver ja(&inner, j->get());
      (void)BeginDelta(**r, &ja);
      for (size_t i = 0; i < (*r)->num_chunks(); ++i) {
        (void)ja.ApplyRecord((*r)->chunk_data(i), (*r)->chunk_size(i));
      }
      if (n % 2 == 0) (void)CommitDelta(**r, &ja);
      m = fuzz::FixedModel();
      m.Buffers();
    }
    ++n;
  }
  // Sums files of the fixed model's checkpoint, in small regions and in the default ones.
  for (uint64_t region : {kSumsMinRegionBytes, kSumsRegionBytes}) {
    const std::string text = FormatSums(ComputeSums(**base, (*base)->ContentHash(1), 1, region));
    Write(out + "/sums/seed-" + std::to_string(region),
          std::vector<uint8_t>(text.begin(), text.end()));
  }
  std::printf("seeds written to %s\n", out.c_str());
  return 0;
}
