// The progress callbacks of BuildDelta and ApplyDeltaFile (dcr/progress.h): the phases and their
// order, done bytes from 0 to the total, every call on the caller's thread, never overlapping,
// and the same output bytes with and without a callback.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dcr/apply.h"
#include "dcr/delta.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;

struct Recorder {
  struct Call {
    std::string phase;
    uint64_t done, total;
  };
  std::vector<Call> calls;
  std::thread::id thread = std::this_thread::get_id();
  std::atomic<int> inside{0};
  bool wrong_thread = false, overlapped = false;
  ProgressCallback Callback() {
    return [this](const ProgressUpdate& u) {
      if (inside.fetch_add(1) != 0) overlapped = true;
      if (std::this_thread::get_id() != thread) wrong_thread = true;
      calls.push_back({std::string(u.phase), u.done_bytes, u.total_bytes});
      inside.fetch_sub(1);
    };
  }
  // The phases in order; checks each phase's calls: 0 first, non-decreasing, total last.
  std::vector<std::string> Phases() const {
    std::vector<std::string> phases;
    for (size_t i = 0; i < calls.size(); ++i) {
      const Call& c = calls[i];
      const bool first = i == 0 || calls[i - 1].phase != c.phase;
      if (first) {
        phases.push_back(c.phase);
        EXPECT_EQ(c.done, 0u) << c.phase;
      } else {
        EXPECT_GE(c.done, calls[i - 1].done) << c.phase;
        EXPECT_EQ(c.total, calls[i - 1].total) << c.phase;
      }
      EXPECT_LE(c.done, c.total) << c.phase;
      const bool last = i + 1 == calls.size() || calls[i + 1].phase != c.phase;
      if (last) {
        EXPECT_EQ(c.done, c.total) << c.phase;
      }
    }
    return phases;
  }
  uint64_t Total(const std::string& phase) const {
    for (const Call& c : calls) {
      if (c.phase == phase) return c.total;
    }
    return 0;
  }
  size_t Count(const std::string& phase) const {
    size_t n = 0;
    for (const Call& c : calls) n += c.phase == phase;
    return n;
  }
};

class ProgressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dcr_progress_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
    // Two BF16 tensors of 3M and 1M elements and a small one; 2% of the elements changed.
    std::mt19937_64 rng(7);
    const std::vector<std::pair<std::string, int64_t>> shapes = {
        {"a.weight", 3 << 20}, {"b.weight", 1 << 20}, {"c.bias", 1000}};
    std::vector<std::vector<uint16_t>> base(shapes.size()), target(shapes.size());
    for (size_t i = 0; i < shapes.size(); ++i) {
      base[i].resize(shapes[i].second);
      for (auto& v : base[i]) v = static_cast<uint16_t>(rng());
      target[i] = base[i];
      for (auto& v : target[i]) {
        if (rng() % 50 == 0) v ^= 1;
      }
    }
    auto views = [&](std::vector<std::vector<uint16_t>>& data) {
      std::vector<TensorView> v;
      for (size_t i = 0; i < shapes.size(); ++i) {
        v.push_back(
            {shapes[i].first, "BF16", {shapes[i].second}, data[i].data(), data[i].size() * 2});
        bytes_ += data[i].size() * 2;
      }
      return v;
    };
    ASSERT_TRUE(WriteSafetensors(Path("base.safetensors"), views(base), {}).ok());
    bytes_ = 0;
    ASSERT_TRUE(WriteSafetensors(Path("target.safetensors"), views(target), {}).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& f) const { return (dir_ / f).string(); }
  std::vector<uint8_t> Build(const DeltaOptions& o) {
    auto base = Checkpoint::Open(Path("base.safetensors"));
    auto target = Checkpoint::Open(Path("target.safetensors"));
    EXPECT_TRUE(base.ok() && target.ok());
    DeltaMemorySink sink;
    auto st = BuildDelta(o.full ? nullptr : base->get(), **target, o, &sink);
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    return sink.Release();
  }

  fs::path dir_;
  uint64_t bytes_ = 0;  // tensor bytes of the target
};

TEST_F(ProgressTest, BuildDeltaReportsHashAndDiffOnTheCallersThread) {
  DeltaOptions o;
  o.chunk_elems = 1 << 18;  // 17 cells: several build windows on 2 threads
  o.threads = 2;
  const std::vector<uint8_t> plain = Build(o);
  Recorder rec;
  o.progress = rec.Callback();
  EXPECT_EQ(Build(o), plain);
  EXPECT_FALSE(rec.wrong_thread);
  EXPECT_FALSE(rec.overlapped);
  EXPECT_EQ(rec.Phases(), (std::vector<std::string>{"hash base", "diff"}));
  EXPECT_EQ(rec.Total("diff"), bytes_);
  EXPECT_EQ(rec.Total("hash base"), bytes_);
  EXPECT_GT(rec.Count("diff"), 3u);  // per build window, not only the ends

  Recorder full;
  o.full = true;
  o.progress = full.Callback();
  Build(o);
  EXPECT_EQ(full.Phases(), (std::vector<std::string>{"encode", "hash target"}));
}

TEST_F(ProgressTest, ApplyReportsEveryPhaseAndWritesTheSameFile) {
  DeltaOptions o;
  o.chunk_elems = 1 << 18;
  const std::vector<uint8_t> delta = Build(o);
  const std::string dpath = Path("d.dcr");
  ASSERT_TRUE(WriteFileAtomic(dpath, delta.data(), delta.size()).ok());
  ApplyOptions ao;
  ao.threads = 4;
  ao.verify_full = true;
  Recorder rec;
  ao.progress = rec.Callback();
  auto st = ApplyDeltaFile(Path("base.safetensors"), dpath, Path("out.safetensors"), ao);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_FALSE(rec.wrong_thread);
  EXPECT_FALSE(rec.overlapped);
  EXPECT_EQ(rec.Phases(), (std::vector<std::string>{"hash base", "copy base", "apply", "rehash"}));
  EXPECT_EQ(rec.Total("copy base"), bytes_);
  auto reader = DeltaReader::Open(dpath);
  ASSERT_TRUE(reader.ok());
  uint64_t chunk_bytes = 0;
  for (size_t i = 0; i < (*reader)->num_chunks(); ++i) chunk_bytes += (*reader)->chunk_size(i);
  EXPECT_EQ(rec.Total("apply"), chunk_bytes);
  auto out = ReadFile(Path("out.safetensors"));
  auto want = ReadFile(Path("target.safetensors"));
  ASSERT_TRUE(out.ok() && want.ok());
  EXPECT_TRUE(*out == *want);
}

}  // namespace
}  // namespace dcr
