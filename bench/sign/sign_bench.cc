// dcr_bench_sign [--mib N] [--rate R] [--reps K] [--json FILE]: what signing deltas costs, each
// signed and unsigned in the same process, single-threaded, best of K repetitions:
//   build   BuildDelta of a seeded BF16 model (N MiB, fraction R of the elements changed by a few
//           ulps) into memory, plain and through SigningSink (SHA-256 of every chunk record, one
//           Ed25519 signature per 32 chunks);
//   apply   the delta's records delivered in stream order to a BufferReceiver over a copy of the
//           base, plain, and to a TrustedReceiver around one with the signed stream (SHA-256 of
//           every record, one verification per manifest);
//   primitives  SHA-256 of 16 MiB, Ed25519 signatures and verifications per second.
// Reports the rates (dense tensor bytes per second per core) and the signed / plain ratios.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "dcr/delta.h"
#include "dcr/receiver.h"
#include "dcr/signing.h"

namespace dcr {
namespace {

double CpuNow() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

struct Model {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<TensorView> Views() const {
    std::vector<TensorView> v;
    for (size_t i = 0; i < bytes.size(); ++i) {
      v.push_back({"t" + std::to_string(1000 + i),
                   "BF16",
                   {static_cast<int64_t>(bytes[i].size() / 2)},
                   bytes[i].data(),
                   bytes[i].size()});
    }
    return v;
  }
};

// Seeded BF16 weights in tensors of 2^22 elements, and the same with `rate` of them moved by 1-3
// ulps.
void MakePair(uint64_t mib, double rate, Model* base, Model* target) {
  std::mt19937_64 rng(42);
  std::normal_distribution<float> w(0.0f, 0.02f);
  const uint64_t elems = mib << 19;  // 2 bytes each
  for (uint64_t done = 0; done < elems;) {
    const uint64_t n = std::min<uint64_t>(uint64_t{1} << 22, elems - done);
    std::vector<uint8_t> b(n * 2);
    for (uint64_t i = 0; i < n; ++i) {
      float f = w(rng);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      const uint16_t h = static_cast<uint16_t>(u >> 16);
      std::memcpy(&b[2 * i], &h, 2);
    }
    std::vector<uint8_t> t = b;
    std::uniform_real_distribution<double> u01(0, 1);
    for (uint64_t i = 0; i < n; ++i) {
      if (u01(rng) >= rate) continue;
      uint16_t h;
      std::memcpy(&h, &t[2 * i], 2);
      h = static_cast<uint16_t>(h + 1 + (rng() % 3));
      std::memcpy(&t[2 * i], &h, 2);
    }
    base->bytes.push_back(std::move(b));
    target->bytes.push_back(std::move(t));
    done += n;
  }
}

struct Records {
  std::vector<uint8_t> stream;
  size_t header = 0;
  std::vector<std::pair<size_t, size_t>> records;  // offset, size
  size_t trailer = 0;
};

Records Split(std::vector<uint8_t> s) {
  Records r;
  r.stream = std::move(s);
  const uint8_t* d = r.stream.data();
  (void)ParseFileHeader(d, r.stream.size(), &r.header);
  uint64_t trailer_offset = 0;
  std::memcpy(&trailer_offset, d + r.stream.size() - 24, 8);
  size_t off = r.header;
  while (off < trailer_offset) {
    size_t rs = 0, hs = 0;
    if (IsManifestRecord(d + off, trailer_offset - off)) {
      (void)ParseManifest(d + off, trailer_offset - off, &rs);
    } else {
      (void)ParseChunkHeader(d + off, trailer_offset - off, &hs, &rs);
    }
    if (rs == 0) break;
    r.records.emplace_back(off, rs);
    off += rs;
  }
  r.trailer = trailer_offset;
  return r;
}

Status Deliver(Receiver* rx, const Records& r) {
  const uint8_t* d = r.stream.data();
  Status s = rx->Begin(d, r.header);
  if (!s.ok()) return s;
  for (const auto& [off, size] : r.records) {
    s = rx->ApplyRecord(d + off, size);
    if (!s.ok()) return s;
  }
  return rx->Commit(d + r.trailer, r.stream.size() - r.trailer);
}

int Main(int argc, char** argv) {
  uint64_t mib = 256;
  double rate = 0.03;
  int reps = 3;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc)
      mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--rate" && i + 1 < argc)
      rate = std::strtod(argv[++i], nullptr);
    else if (a == "--reps" && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: dcr_bench_sign [--mib N] [--rate R] [--reps K] [--json FILE]\n");
      return 2;
    }
  }
  if (mib == 0 || reps < 1) return 2;
  Model bm, tm;
  MakePair(mib, rate, &bm, &tm);
  auto base = Checkpoint::FromBytes(SafetensorsImage(bm.Views()));
  auto target = Checkpoint::FromBytes(SafetensorsImage(tm.Views()));
  if (!base.ok() || !target.ok()) {
    std::fprintf(stderr, "dcr_bench_sign: model: %s\n", base.status().ToString().c_str());
    return 1;
  }
  bm = Model();
  tm = Model();
  auto key = SigningKey::Generate();
  auto trust = TrustKey::FromRaw((*key)->public_key());
  const double dense = static_cast<double>((*target)->total_tensor_bytes());
  DeltaOptions o;
  o.threads = 1;
  o.known_base_hash = (*base)->ContentHash(1);

  double build_plain = 1e30, build_signed = 1e30, apply_plain = 1e30, apply_signed = 1e30;
  std::vector<uint8_t> plain_bytes, signed_bytes;
  for (int rep = 0; rep < reps; ++rep) {
    {
      DeltaMemorySink mem;
      const double t0 = CpuNow();
      auto st = BuildDelta(base->get(), **target, o, &mem);
      build_plain = std::min(build_plain, CpuNow() - t0);
      if (!st.ok()) return std::fprintf(stderr, "build: %s\n", st.status().ToString().c_str()), 1;
      plain_bytes = mem.Release();
    }
    {
      DeltaMemorySink mem;
      SigningSink sink(key->get(), SignOptions{}, &mem);
      const double t0 = CpuNow();
      auto st = BuildDelta(base->get(), **target, o, &sink);
      build_signed = std::min(build_signed, CpuNow() - t0);
      if (!st.ok()) return std::fprintf(stderr, "sign: %s\n", st.status().ToString().c_str()), 1;
      signed_bytes = mem.Release();
    }
  }
  const Records plain = Split(plain_bytes), sgn = Split(signed_bytes);
  for (int rep = 0; rep < reps; ++rep) {
    {
      std::unique_ptr<BufferReceiver> rx = BufferReceiver::Copy(**base);
      const double t0 = CpuNow();
      Status s = Deliver(rx.get(), plain);
      apply_plain = std::min(apply_plain, CpuNow() - t0);
      if (!s.ok()) return std::fprintf(stderr, "apply: %s\n", s.ToString().c_str()), 1;
    }
    {
      TrustOptions to;
      to.key = *trust;
      to.check_commitment = false;  // the chain's cost (the stream signs no commitment)
      TrustedReceiver rx(BufferReceiver::Copy(**base), to);
      const double t0 = CpuNow();
      Status s = Deliver(&rx, sgn);
      apply_signed = std::min(apply_signed, CpuNow() - t0);
      if (!s.ok()) return std::fprintf(stderr, "verified apply: %s\n", s.ToString().c_str()), 1;
    }
  }
  // Primitives.
  std::vector<uint8_t> buf(16 << 20, 0x5a);
  double sha_s = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    const double t0 = CpuNow();
    Sha256Digest d = Sha256(buf.data(), buf.size());
    sha_s = std::min(sha_s, CpuNow() - t0);
    buf[0] ^= d[0];
  }
  const int nsig = 2000;
  double t0 = CpuNow();
  Ed25519Signature sig{};
  for (int i = 0; i < nsig; ++i) sig = *(*key)->Sign(buf.data(), 256);
  const double sign_s = (CpuNow() - t0) / nsig;
  t0 = CpuNow();
  int ok = 0;
  for (int i = 0; i < nsig; ++i) ok += (*trust)->Verify(buf.data(), 256, sig);
  const double verify_s = (CpuNow() - t0) / nsig;
  if (ok != nsig) return std::fprintf(stderr, "verification failed\n"), 1;

  const size_t manifests = sgn.records.size() - plain.records.size();
  nlohmann::json j;
  j["what"] = "dcr_bench_sign: signed vs unsigned deltas, one thread, best of reps (CPU time)";
  j["dense_bytes"] = dense;
  j["change_rate"] = rate;
  j["chunks"] = plain.records.size();
  j["manifests"] = manifests;
  j["delta_bytes"] = plain_bytes.size();
  j["signed_delta_bytes"] = signed_bytes.size();
  j["encode_bytes_per_s"] = dense / build_plain;
  j["encode_signed_bytes_per_s"] = dense / build_signed;
  j["sign_encode_ratio"] = build_plain / build_signed;
  j["decode_apply_bytes_per_s"] = dense / apply_plain;
  j["decode_apply_verified_bytes_per_s"] = dense / apply_signed;
  j["verify_apply_ratio"] = apply_plain / apply_signed;
  j["sha256_bytes_per_s"] = static_cast<double>(buf.size()) / sha_s;
  j["ed25519_signs_per_s"] = 1.0 / sign_s;
  j["ed25519_verifies_per_s"] = 1.0 / verify_s;
  std::printf(
      "model %.0f MiB BF16, %.1f%% changed: %zu chunks, %zu manifests; delta %zu bytes, "
      "signed %zu (+%.3f%%)\n",
      dense / (1 << 20), rate * 100, plain.records.size(), manifests, plain_bytes.size(),
      signed_bytes.size(),
      100.0 * (static_cast<double>(signed_bytes.size()) / plain_bytes.size() - 1));
  std::printf("| per core | unsigned | signed | signed / unsigned |\n|---|---|---|---|\n");
  std::printf("| build (dense GB/s) | %.3f | %.3f | %.3f |\n", dense / build_plain / 1e9,
              dense / build_signed / 1e9, build_plain / build_signed);
  std::printf("| apply (dense GB/s) | %.3f | %.3f | %.3f |\n", dense / apply_plain / 1e9,
              dense / apply_signed / 1e9, apply_plain / apply_signed);
  std::printf("SHA-256 %.2f GB/s; Ed25519 %.0f signatures/s, %.0f verifications/s\n",
              buf.size() / sha_s / 1e9, 1.0 / sign_s, 1.0 / verify_s);
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f == nullptr) return std::fprintf(stderr, "cannot write %s\n", json_path.c_str()), 1;
    std::fprintf(f, "%s\n", j.dump(1).c_str());
    std::fclose(f);
  }
  return 0;
}

}  // namespace
}  // namespace dcr

int main(int argc, char** argv) { return dcr::Main(argc, argv); }
