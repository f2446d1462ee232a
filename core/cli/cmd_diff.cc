// dcr diff BASE TARGET -o DELTA: builds the delta from BASE to TARGET.
#include <chrono>
#include <cstdio>

#include "command.h"
#include "dcr/commitment.h"
#include "dcr/delta.h"
#include "dcr/signing.h"
#include "dcr/sums.h"
#include "device_option.h"
#include "progress_line.h"

namespace dcr::cli {
namespace {

struct DiffArgs {
  std::vector<std::string> files;
  std::string base, target, out;
  uint64_t chunk_elems = uint64_t{1} << 22;
  uint64_t small = uint64_t{1} << 16;
  int level = 1, threads = 0;
  std::string values = "auto";
  uint64_t base_version = 0, target_version = 1;
  bool full = false, quiet = false, wan_context = false;
  int context_classes = kContextClassesMax;
  DeviceOption device;
  std::string sign_key;  // --sign: the trainer's Ed25519 key (PEM)
  uint64_t run_id = 0;
  uint32_t chunks_per_manifest = 32;
  std::string base_sums;    // --base-sums: BASE's sums file, checked, for its content hash
  std::string target_sums;  // --target-sums: write TARGET's sums file
};

int RunDiff(const DiffArgs& a) {
  // The device first: a refusal (no usable CUDA device) comes before any file is read.
  auto device = a.device.Open();
  if (!device.ok()) return ReportStatus("diff", device.status());
  std::unique_ptr<SigningKey> key;
  if (!a.sign_key.empty()) {
    auto k = SigningKey::Load(a.sign_key);
    if (!k.ok()) return ReportStatus("diff", k.status());
    key = std::move(*k);
  }
  std::unique_ptr<Checkpoint> base;
  if (!a.full) {
    auto b = Checkpoint::Open(a.base);
    if (!b.ok()) return ReportStatus("diff", b.status());
    base = std::move(*b);
  }
  auto t = Checkpoint::Open(a.target);
  if (!t.ok()) return ReportStatus("diff", t.status());
  DeltaOptions opt;
  if (!a.base_sums.empty()) {
    // The base's content hash from its sums file once every byte of the base matches it: one
    // XXH3 pass instead of the element terms of every element.
    auto sums = ReadSums(a.base_sums);
    if (!sums.ok()) return ReportStatus("diff", sums.status());
    Status ok = CheckSums(*base, *sums, a.threads);
    if (!ok.ok())
      return ReportStatus("diff", ok.WithContext("base " + a.base + " against " + a.base_sums));
    opt.known_base_hash = sums->content_hash;
  }
  opt.chunk_elems = a.chunk_elems;
  opt.small_tensor_elems = a.small;
  opt.zstd_level = a.level;
  opt.threads = a.threads;
  opt.base_version = a.base_version;
  opt.target_version = a.target_version;
  opt.full = a.full;
  opt.context_coding = a.wan_context;
  opt.context_classes = a.context_classes;
  opt.collect_entropy = !a.quiet;
  if (a.values == "xor")
    opt.value_policy = ValuePolicy::kXor;
  else if (a.values == "ulp")
    opt.value_policy = ValuePolicy::kUlpDelta;
  else if (a.values == "absolute")
    opt.value_policy = ValuePolicy::kAbsolute;
  else
    opt.value_policy = ValuePolicy::kAuto;
  ProgressLine progress = ProgressLine::ForStderr(!a.quiet);
  opt.progress = progress.Callback();
  auto t0 = std::chrono::steady_clock::now();
  DeltaFileSink file_sink(a.out);
  SignOptions so;
  so.run_id = a.run_id;
  so.chunks_per_manifest = a.chunks_per_manifest;
  if (key) {
    // The final manifest signs the target's commitment and its leaves (dcr/commitment.h).
    auto c = CheckpointCommitment(**t, a.threads);
    if (!c.ok()) return ReportStatus("diff", c.status().WithContext("commitment of " + a.target));
    so.commitment = c->root;
    so.commitment_leaves = std::move(c->leaves);
  }
  SigningSink signing_sink(key.get(), so, &file_sink);
  DeltaSink* sink = key ? static_cast<DeltaSink*>(&signing_sink) : &file_sink;
  auto st = BuildDeltaOnDevice(base.get(), **t, opt, device->get(), sink);
  progress.Finish();
  if (!st.ok()) return ReportStatus("diff", st.status());
  if (!a.target_sums.empty()) {
    // The delta's target hash is the target's content hash (the base's moved by every element
    // that differs, or computed in full with --full).
    Status ws = WriteSums(a.target_sums, ComputeSums(**t, st->target_hash, a.threads));
    if (!ws.ok()) {
      return ReportStatus(
          "diff", ws.WithContext("the delta " + a.out + " is written; the target's sums file " +
                                 a.target_sums));
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!a.quiet) {
    double bound_bytes = st->entropy_bound_bits / 8;
    if (a.full) {
      std::printf(
          "%s: %llu chunks, a full frame of all %llu elements (no base: every element is "
          "sent, nothing is compared)\n",
          a.out.c_str(), static_cast<unsigned long long>(st->chunks),
          static_cast<unsigned long long>(st->elements));
    } else {
      std::printf("%s: %llu chunks, %llu of %llu elements changed (%.4f%%)\n", a.out.c_str(),
                  static_cast<unsigned long long>(st->chunks),
                  static_cast<unsigned long long>(st->changed),
                  static_cast<unsigned long long>(st->elements),
                  st->elements ? 100.0 * st->changed / st->elements : 0.0);
    }
    std::printf("delta %llu bytes, dense %llu bytes: %.1fx smaller",
                static_cast<unsigned long long>(st->payload_bytes),
                static_cast<unsigned long long>(st->dense_bytes),
                st->payload_bytes ? static_cast<double>(st->dense_bytes) / st->payload_bytes : 0.0);
    if (bound_bytes > 0)
      std::printf("; %.3fx the order-0 XOR bound", st->payload_bytes / bound_bytes);
    if (a.wan_context) {
      std::printf("; %llu of %llu chunks context-coded (format version 8)",
                  static_cast<unsigned long long>(st->context_chunks),
                  static_cast<unsigned long long>(st->chunks));
    }
    std::printf("; built in %.2f s", secs);
    if (key) std::printf("; signed by %s", KeyFingerprint(key->public_key()).c_str());
    if (*device) std::printf(" on device %s", (*device)->name().c_str());
    std::printf("\n");
    if ((*t)->sharded()) {
      std::printf("target: %zu shards%s%s\n", (*t)->files().size(),
                  (*t)->index_name().empty() ? "" : " and ", (*t)->index_name().c_str());
    }
    std::printf("base %s -> target hash %s\n",
                a.full ? "none (full frame)" : ("hash " + st->base_hash.ToHex()).c_str(),
                st->target_hash.ToHex().c_str());
  }
  return 0;
}

}  // namespace

DCR_REGISTER_COMMAND(
    "diff", "Build the delta that turns BASE into TARGET (bit-exact)", [](CLI::App* app) {
      auto a = std::make_shared<DiffArgs>();
      app->add_option("files", a->files,
                      "BASE TARGET (.safetensors files or shard directories, "
                      "also mixed); with --full just TARGET")
          ->required();
      app->add_option("-o,--out", a->out, "Output delta file")->required();
      app->add_option("--chunk-elems", a->chunk_elems, "Grid cell size in elements")
          ->capture_default_str();
      app->add_option("--small-elems", a->small,
                      "Tensors smaller than this are batched into shared chunks")
          ->capture_default_str();
      app->add_option("--level", a->level, "zstd level per stream")->capture_default_str();
      app->add_option("--threads", a->threads,
                      "Encoder threads (0 = all cores); never changes the bytes");
      app->add_option("--values", a->values, "Value coding: auto|xor|ulp|absolute")
          ->check(CLI::IsMember({"auto", "xor", "ulp", "absolute"}))
          ->capture_default_str();
      app->add_option("--base-version", a->base_version, "Version number of BASE");
      app->add_option("--target-version", a->target_version, "Version number of TARGET");
      app->add_flag("--full", a->full, "Full frame for a receiver without a base (BASE ignored)");
      app->add_flag("--wan-context", a->wan_context,
                    "Context-code chunks against the base exponents where that is "
                    "smaller (format version 8: a receiver decodes them with the "
                    "base bits of every covered element; for the long link)");
      app->add_option("--context-classes", a->context_classes,
                      "With --wan-context: the most exponent classes per chunk "
                      "(1-16); fewer decode faster, a little larger")
          ->check(CLI::Range(1, kContextClassesMax))
          ->needs("--wan-context")
          ->capture_default_str();
      app->add_flag("-q,--quiet", a->quiet, "No progress on stderr, no summary");
      app->add_option("--sign", a->sign_key,
                      "Sign the delta with this Ed25519 key (PEM, 0600; `dcr keys` "
                      "makes one): format version 6 with manifest records");
      app->add_option("--run-id", a->run_id,
                      "With --sign: the run the delta is for (receivers of another "
                      "run refuse it); default 0, none");
      app->add_option("--chunks-per-manifest", a->chunks_per_manifest,
                      "With --sign: chunks per signed manifest record")
          ->check(CLI::Range(1, 65536))
          ->capture_default_str();
      app->add_option("--base-sums", a->base_sums,
                      "BASE's sums file (`dcr sums`, or --target-sums of the diff "
                      "that built BASE): its content hash is used once every byte "
                      "of BASE is checked against it, instead of hashing BASE")
          ->excludes("--full");
      app->add_option("--target-sums", a->target_sums,
                      "Write TARGET's sums file (for the next diff's --base-sums)");
      a->device.AddTo(app);
      return [a]() {
        if (a->files.size() == 2) {
          a->base = a->files[0];
          a->target = a->files[1];
        } else if (a->files.size() == 1 && a->full) {
          a->target = a->files[0];
        } else {
          std::fprintf(stderr, "dcr diff: expected BASE TARGET (or TARGET with --full)\n");
          return 2;
        }
        return RunDiff(*a);
      };
    });

}  // namespace dcr::cli
