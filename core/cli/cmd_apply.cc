// dcr apply BASE DELTA -o OUT: offline refit.
#include <chrono>
#include <cstdio>
#include <ctime>
#include <optional>

#include "command.h"
#include "dcr/apply.h"
#include "dcr/commitment.h"
#include "dcr/signing.h"
#include "dcr/status_macros.h"
#include "progress_line.h"

namespace dcr::cli {

DCR_REGISTER_COMMAND(
    "apply", "Apply DELTA to BASE, writing OUT atomically (refuses a wrong base; no OUT on error)",
    [](CLI::App* app) {
      struct Args {
        std::string base, delta, out;
        int threads = 0;
        bool verify = false, quiet = false;
        std::string trust, floor;
        uint64_t run_id = 0;
        bool check_run = false;
      };
      auto a = std::make_shared<Args>();
      app->add_option("base", a->base,
                      "Base checkpoint: a .safetensors file or a shard directory (ignored for a "
                      "full-frame delta)")
          ->required();
      app->add_option("delta", a->delta, "Delta file")->required();
      app->add_option(
             "-o,--out", a->out,
             "Output checkpoint: a file, or a directory when the delta's target is sharded "
             "(written whole under a temporary name, then moved into place)")
          ->required();
      app->add_option("--threads", a->threads, "Threads (0 = all cores)");
      app->add_flag("--verify", a->verify,
                    "Also rehash the whole output and compare with the target hash");
      app->add_flag("-q,--quiet", a->quiet, "No progress on stderr, no summary");
      app->add_option("--trust", a->trust,
                      "Apply only a delta signed by this Ed25519 public key (PEM): every manifest "
                      "and chunk hash is checked before anything is written");
      auto* run = app->add_option("--run-id", a->run_id,
                                  "With --trust: refuse a delta signed for another run");
      app->add_option("--version-floor", a->floor,
                      "Refuse a delta whose target version is below the one recorded in FILE; "
                      "record the target version there after a successful apply");
      return [a, run]() {
        a->check_run = run->count() > 0;
        auto t0 = std::chrono::steady_clock::now();
        ApplyOptions opt;
        opt.threads = a->threads;
        opt.verify_full = a->verify;
        ProgressLine progress = ProgressLine::ForStderr(!a->quiet);
        opt.progress = progress.Callback();
        std::shared_ptr<const TrustKey> trust;
        if (!a->trust.empty()) {
          auto k = TrustKey::Load(a->trust);
          if (!k.ok()) return ReportStatus("apply", k.status());
          trust = *k;
        }
        std::optional<VersionFloor> floor;
        if (!a->floor.empty()) {
          auto f = VersionFloor::Load(a->floor, a->check_run ? a->run_id : 0);
          if (!f.ok()) return ReportStatus("apply", f.status());
          floor = std::move(*f);
        }
        uint64_t target_version = 0;
        SignedCommitment commitment;
        opt.check_delta = [&](const DeltaReader& d) -> Status {
          target_version = d.header().target_version;
          if (floor) DCR_RETURN_IF_ERROR(floor->Check(target_version));
          if (trust) {
            DCR_RETURN_IF_ERROR(VerifyDeltaFile(
                d, trust, a->check_run ? std::optional<uint64_t>(a->run_id) : std::nullopt,
                &commitment));
            if (!commitment.root) {  // the chain and the additive hash prove nothing alone
              return FailedPreconditionError(
                  "the signed delta carries no commitment of its target (its final manifest has "
                  "no commitment root), so the output cannot be proven: refused");
            }
          }
          return Status();
        };
        // With a signed commitment, the output is published only when its commitment is the
        // signed root (the additive content hash is a checksum, not a proof).
        opt.check_output = [&](const std::vector<TensorView>& views) -> Status {
          if (!commitment.root) return Status();
          return CheckCommitment(views, *commitment.root, &commitment.leaves, a->threads)
              .WithContext("output refused");
        };
        auto st = ApplyDeltaFile(a->base, a->delta, a->out, opt);
        if (st.ok() && floor) {
          Status rec = floor->Record(target_version, static_cast<double>(std::time(nullptr)));
          if (!rec.ok()) st = rec.WithContext("applied, but the version floor");
        }
        progress.Finish();
        if (!st.ok()) return ReportStatus("apply", st.status());
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!a->quiet) {
          if (commitment.root) {
            std::printf(
                "%s: %llu chunks, %llu changes applied in %.2f s; content hash %s; verified "
                "(commitment %s)\n",
                a->out.c_str(), static_cast<unsigned long long>(st->chunks),
                static_cast<unsigned long long>(st->changes), secs, st->result_hash.ToHex().c_str(),
                CommitmentPrefix(*commitment.root).c_str());
          } else {
            std::printf(
                "%s: %llu chunks, %llu changes applied in %.2f s; content hash %s verified%s\n",
                a->out.c_str(), static_cast<unsigned long long>(st->chunks),
                static_cast<unsigned long long>(st->changes), secs, st->result_hash.ToHex().c_str(),
                a->verify ? " (full rehash)" : "");
          }
        }
        return 0;
      };
    });

}  // namespace dcr::cli
