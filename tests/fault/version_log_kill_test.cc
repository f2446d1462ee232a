// Real process kills of a receiver that makes its versions durable with a VersionLog
// (receivers/version_log.h): a child process recovers the store (image + log), applies the next
// delta through VersionLoggingReceiver over host memory, and is killed with SIGKILL at one step
// of the commit (mid-records, after the entries are synced and before the commit marker, after
// the marker and before the image, mid-image, after the image is renamed and before the log
// names it). The parent then recovers the store from its files alone and compares the bytes
// with the dense image of the version the step must leave (the old one before the marker, the
// new one after), byte for byte; the store then takes the next version.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <ostream>

#include "dcr/testing/fault_test_util.h"
#include "receivers/version_log.h"

namespace dcr::internal {
namespace {

using testing::DeltaBytes;
using testing::MakeCheckpoint;
using testing::Model;
using testing::NextVersion;
using testing::RandomModel;
using testing::SafetensorsBytes;
using testing::SmallGrid;
using testing::TempDir;

struct Chain {
  std::vector<std::vector<uint8_t>> images;
  std::vector<std::unique_ptr<Checkpoint>> ckpts;
  std::vector<std::unique_ptr<DeltaReader>> deltas;  // deltas[k]: version k -> k + 1
  VersionId id(size_t k) const { return VersionId{k, ckpts[k]->ContentHash(1)}; }
};

Chain MakeChain(size_t n) {
  Chain c;
  Model m = RandomModel(41);
  for (size_t k = 0; k <= n; ++k) {
    if (k > 0) m = NextVersion(m, 200 + k, 0.03);
    c.images.push_back(SafetensorsBytes(m));
    c.ckpts.push_back(MakeCheckpoint(m));
    if (k > 0) {
      auto d = DeltaReader::FromBytes(
          DeltaBytes(c.ckpts[k - 1].get(), *c.ckpts[k], SmallGrid(k - 1, k)));
      if (!d.ok()) std::abort();
      c.deltas.push_back(std::move(*d));
    }
  }
  return c;
}

struct Case {
  const char* name;
  std::optional<VersionLogStep> step;  // killed at this step of the commit of version 2
  bool mid_records;                    // killed after half of version 2's records are logged
  size_t survives;                     // the version the restart must hold
};

// gtest prints the case by its name (the CTest names carry it).
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Every image the log is written with: version 2's commit writes one (image_every_versions 2).
VersionLogOptions Options() {
  VersionLogOptions o;
  o.image_every_versions = 2;
  return o;
}

// Recovers the store in `dir`, applies delta k -> k + 1 through the log, and dies where `kc`
// says. Runs in the child: exits 0 when it was not killed, 1 on an error.
[[noreturn]] void ChildApply(const std::string& dir, const Chain& c, size_t k, const Case& kc) {
  VersionLogOptions o = Options();
  if (kc.step) {
    const VersionLogStep die_at = *kc.step;
    o.on_step = [die_at](VersionLogStep s) {
      if (s == die_at) ::raise(SIGKILL);
    };
  }
  RecoveredVersion r;
  auto log = VersionLog::Open(dir, *c.ckpts[0], &r, o);
  if (!log.ok() || r.version != c.id(k)) ::_exit(1);
  std::vector<uint8_t> storage = std::move(r.bytes);
  BufferReceiver rx(ImageTensors(*c.ckpts[0], storage.data()), r.version);
  VersionLoggingReceiver logging(&rx, log->get(), [&](VersionLog* l, const VersionId& v) {
    return l->WriteImage(storage.data(), storage.size(), v);
  });
  const DeltaReader& d = *c.deltas[k];
  if (!BeginDelta(d, &logging).ok()) ::_exit(1);
  for (size_t i = 0; i < d.num_chunks(); ++i) {
    if (kc.mid_records && i == d.num_chunks() / 2) ::raise(SIGKILL);
    if (!logging.ApplyRecord(d.chunk_data(i), d.chunk_size(i)).ok()) ::_exit(1);
  }
  if (!CommitDelta(d, &logging).ok()) ::_exit(1);
  ::_exit(0);
}

class VersionLogKill : public ::testing::TestWithParam<Case> {};

TEST_P(VersionLogKill, RestartHoldsTheOldOrTheNewVersionBitExact) {
  const Case& kc = GetParam();
  const Chain c = MakeChain(3);
  TempDir tmp;
  const std::string dir = tmp / "store";
  {
    // Version 0's image, version 1 logged.
    std::vector<uint8_t> storage = c.images[0];
    BufferReceiver rx(ImageTensors(*c.ckpts[0], storage.data()), c.id(0));
    auto log = VersionLog::Create(dir, storage.data(), storage.size(), c.id(0), Options());
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    VersionLoggingReceiver logging(&rx, log->get());
    ASSERT_TRUE(ApplyDelta(*c.deltas[0], &logging).ok());
  }
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) ChildApply(dir, c, 1, kc);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  if (kc.step || kc.mid_records) {
    ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
        << "the child was to die at " << kc.name << "; status " << wstatus;
  } else {
    ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "status " << wstatus;
  }

  // The restart: the store's files alone.
  RecoveredVersion r;
  auto log = VersionLog::Open(dir, *c.ckpts[0], &r, Options());
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_EQ(r.version, c.id(kc.survives));
  EXPECT_TRUE(r.bytes == c.images[kc.survives])
      << kc.name << ": the restarted receiver's bytes differ from the dense image of v"
      << kc.survives;
  // No temporary or stale image is left: the log and the one image it names.
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name == "log" || name == "image-" + std::to_string(r.image_version.number))
        << kc.name << ": left behind " << name;
    ++files;
  }
  EXPECT_EQ(files, 2u);

  // The store goes on: the versions after the survivor, then a clean restart.
  std::vector<uint8_t> storage = std::move(r.bytes);
  {
    BufferReceiver rx(ImageTensors(*c.ckpts[0], storage.data()), r.version);
    VersionLoggingReceiver logging(&rx, log->get(), [&](VersionLog* l, const VersionId& v) {
      return l->WriteImage(storage.data(), storage.size(), v);
    });
    for (size_t k = kc.survives; k < 3; ++k) {
      ASSERT_TRUE(ApplyDelta(*c.deltas[k], &logging).ok()) << "v" << k << " -> v" << k + 1;
    }
  }
  log->reset();
  RecoveredVersion last;
  auto again = VersionLog::Open(dir, *c.ckpts[0], &last, Options());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(last.version, c.id(3));
  EXPECT_TRUE(last.bytes == c.images[3]);
}

INSTANTIATE_TEST_SUITE_P(
    Steps, VersionLogKill,
    ::testing::Values(Case{"no-kill", std::nullopt, false, 2},
                      Case{"mid-records", std::nullopt, true, 1},
                      Case{"entries-synced", VersionLogStep::kEntriesSynced, false, 1},
                      Case{"marker-synced", VersionLogStep::kMarkerSynced, false, 2},
                      Case{"image-half-written", VersionLogStep::kImageHalfWritten, false, 2},
                      Case{"image-renamed", VersionLogStep::kImageRenamed, false, 2}),
    [](const ::testing::TestParamInfo<Case>& i) {
      std::string n = i.param.name;
      for (char& ch : n) {
        if (ch == '-') ch = '_';
      }
      return n;
    });

}  // namespace
}  // namespace dcr::internal
