// dcr sums CHECKPOINT -o FILE: writes a checkpoint's sums file (dcr/sums.h) from its full content
// hash. dcr sums CHECKPOINT --check FILE: checks a checkpoint against one, content hash included.
#include <cstdio>

#include "command.h"
#include "dcr/checkpoint.h"
#include "dcr/sums.h"

namespace dcr::cli {
namespace {

struct SumsArgs {
  std::string checkpoint, out, check;
  int threads = 0;
  bool quiet = false;
};

int RunSums(const SumsArgs& a) {
  auto c = Checkpoint::Open(a.checkpoint);
  if (!c.ok()) return ReportStatus("sums", c.status());
  if (!a.check.empty()) {
    auto sums = ReadSums(a.check);
    if (!sums.ok()) return ReportStatus("sums", sums.status());
    Status regions = CheckSums(**c, *sums, a.threads);
    if (!regions.ok()) {
      std::printf("DIFFER: %s\n", regions.message().c_str());
      return 1;
    }
    // The regions match; the recorded content hash is recomputed from the elements, so that a
    // sums file written with a wrong hash is found too.
    const Hash128 h = (*c)->ContentHash(a.threads);
    if (h != sums->content_hash) {
      std::printf("DIFFER: the checkpoint's content hash is %s, its sums file records %s\n",
                  h.ToHex().c_str(), sums->content_hash.ToHex().c_str());
      return 1;
    }
    std::printf("MATCH: %zu files, content hash %s\n", sums->files.size(), h.ToHex().c_str());
    return 0;
  }
  const CheckpointSums sums = ComputeSums(**c, (*c)->ContentHash(a.threads), a.threads);
  Status st = WriteSums(a.out, sums);
  if (!st.ok()) return ReportStatus("sums", st);
  if (!a.quiet) {
    uint64_t regions = 0;
    for (const CheckpointSums::File& f : sums.files) regions += f.regions.size();
    std::printf("%s: content hash %s, %zu files, %llu regions of %llu bytes\n", a.out.c_str(),
                sums.content_hash.ToHex().c_str(), sums.files.size(),
                static_cast<unsigned long long>(regions),
                static_cast<unsigned long long>(sums.region_bytes));
  }
  return 0;
}

}  // namespace

DCR_REGISTER_COMMAND(
    "sums",
    "Write a checkpoint's sums file (content hash bound to XXH3 of its bytes), or check one",
    [](CLI::App* app) {
      auto a = std::make_shared<SumsArgs>();
      app->add_option("checkpoint", a->checkpoint, "A .safetensors file or a shard directory")
          ->required();
      auto* out = app->add_option("-o,--out", a->out, "The sums file to write");
      auto* check = app->add_option("--check", a->check,
                                    "Check CHECKPOINT against this sums file (every region and the "
                                    "content hash); exit 1 when they differ");
      out->excludes(check);
      app->add_option("--threads", a->threads, "Worker threads (0 = all cores)");
      app->add_flag("-q,--quiet", a->quiet, "No summary line");
      return [a]() {
        if (a->out.empty() == a->check.empty()) {
          std::fprintf(stderr, "dcr sums: give -o FILE to write or --check FILE to check\n");
          return 2;
        }
        return RunSums(*a);
      };
    });

}  // namespace dcr::cli
