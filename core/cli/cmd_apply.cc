// dcr apply BASE DELTA -o OUT: offline refit.
#include <chrono>
#include <cstdio>

#include "command.h"
#include "dcr/apply.h"
#include "progress_line.h"

namespace dcr::cli {

DCR_REGISTER_COMMAND(
    "apply", "Apply DELTA to BASE, writing OUT atomically (refuses a wrong base; no OUT on error)",
    [](CLI::App* app) {
      struct Args {
        std::string base, delta, out;
        int threads = 0;
        bool verify = false, quiet = false;
      };
      auto a = std::make_shared<Args>();
      app->add_option("base", a->base,
                     "Base checkpoint: a .safetensors file or a shard directory (ignored for a "
                     "full-frame delta)")
          ->required();
      app->add_option("delta", a->delta, "Delta file")->required();
      app->add_option("-o,--out", a->out,
                     "Output checkpoint: a file, or a directory when the delta's target is sharded "
                     "(written whole under a temporary name, then moved into place)")
          ->required();
      app->add_option("--threads", a->threads, "Threads (0 = all cores)");
      app->add_flag("--verify", a->verify, "Also rehash the whole output and compare with the target hash");
      app->add_flag("-q,--quiet", a->quiet, "No progress on stderr, no summary");
      return [a]() {
        auto t0 = std::chrono::steady_clock::now();
        ApplyOptions opt;
        opt.threads = a->threads;
        opt.verify_full = a->verify;
        ProgressLine progress = ProgressLine::ForStderr(!a->quiet);
        opt.progress = progress.Callback();
        auto st = ApplyDeltaFile(a->base, a->delta, a->out, opt);
        progress.Finish();
        if (!st.ok()) return ReportStatus("apply", st.status());
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!a->quiet) {
          std::printf("%s: %llu chunks, %llu changes applied in %.2f s; content hash %s verified%s\n",
                      a->out.c_str(), static_cast<unsigned long long>(st->chunks),
                      static_cast<unsigned long long>(st->changes), secs,
                      st->result_hash.ToHex().c_str(), a->verify ? " (full rehash)" : "");
        }
        return 0;
      };
    });

}  // namespace dcr::cli
