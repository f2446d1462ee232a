// Receivers given a sharded checkpoint (a directory of shards): the buffer receiver holds every
// tensor of every shard and verifies against the target directory; the receivers that work on
// one safetensors file image refuse a directory up front.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "dcr/checkpoint.h"
#include "dcr/dcr_c.h"
#include "dcr/receiver.h"
#include "dcr/runtime.h"
#include "dcr/transport.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;

struct Fixture {
  fs::path dir;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::string> names;
  Fixture() {
    dir = fs::temp_directory_path() / ("dcr_sharded_receiver_test_" + std::to_string(::getpid()) +
                                       "_" + std::to_string(std::random_device{}()));
    std::mt19937_64 rng(7);
    for (int i = 0; i < 6; ++i) {
      names.push_back("layer." + std::to_string(i) + ".weight");
      std::vector<uint8_t> b(2 * 64 * (i + 1));
      for (auto& x : b) x = static_cast<uint8_t>(rng());
      bytes.push_back(std::move(b));
    }
  }
  ~Fixture() { fs::remove_all(dir); }
  // The tensors written as a shard directory `name` with at most 300 bytes per shard.
  std::string Write(const std::string& name) {
    std::vector<TensorView> views;
    for (size_t i = 0; i < names.size(); ++i) {
      views.push_back({names[i],
                       "BF16",
                       {static_cast<int64_t>(bytes[i].size() / 2)},
                       bytes[i].data(),
                       bytes[i].size()});
    }
    const std::string path = (dir / name).string();
    fs::create_directories(dir);
    EXPECT_TRUE(WriteShardedCheckpoint(path, views, 300).ok());
    return path;
  }
};

TEST(ShardedReceiverTest, BufferReceiverHoldsEveryShardsTensors) {
  Fixture f;
  const std::string base = f.Write("base");
  auto ck = Checkpoint::Open(base);
  ASSERT_TRUE(ck.ok()) << ck.status();
  ASSERT_TRUE((*ck)->sharded());
  ASSERT_GE((*ck)->files().size(), 3u);
  auto r = BufferReceiver::Load(base, 3);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->held().number, 3u);
  EXPECT_TRUE((*r)->held().hash == (*ck)->ContentHash());
  EXPECT_TRUE((*r)->Verify(**ck).ok());
  EXPECT_TRUE(VerifyFile(**r, base).ok());

  // One flipped byte in the last shard's tensor: verify names a difference.
  f.bytes.back()[5] ^= 1;
  const std::string other = f.Write("other");
  Status s = VerifyFile(**r, other);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find(f.names.back()), std::string::npos) << s;
}

TEST(ShardedReceiverTest, FileImageReceiversRefuseADirectory) {
  Fixture f;
  const std::string base = f.Write("base");
  int emitted = 0;
  Status s = FullStreamBlobs(base, 1 << 20, [&](BlobKind, std::vector<uint8_t>) {
    ++emitted;
    return Status();
  });
  EXPECT_TRUE(s.IsInvalidArgument()) << s;
  EXPECT_NE(s.ToString().find("sharded checkpoint"), std::string::npos) << s;
  EXPECT_NE(s.ToString().find("method delta"), std::string::npos) << s;
  EXPECT_EQ(emitted, 0);

  auto ck = Checkpoint::Open(base);
  ASSERT_TRUE(ck.ok()) << ck.status();
  bool factory_called = false;
  LoaderFactory factory = [&](int) -> StatusOr<std::unique_ptr<ModelLoader>> {
    factory_called = true;
    return InvalidArgumentError("not reached");
  };
  std::unique_ptr<ModelLoader> loader;
  Storage storage;
  auto map = RecordLoad(**ck, factory, 0, &loader, &storage);
  ASSERT_FALSE(map.ok());
  EXPECT_TRUE(map.status().IsInvalidArgument()) << map.status();
  EXPECT_NE(map.status().ToString().find("sharded"), std::string::npos) << map.status();
  EXPECT_FALSE(factory_called);

  dcr_recorder* rec = nullptr;
  EXPECT_EQ(dcr_recorder_begin(base.c_str(), &rec), DCR_INVALID_ARGUMENT);
  EXPECT_EQ(rec, nullptr);
  EXPECT_NE(std::string(dcr_last_error()).find("sharded checkpoint"), std::string::npos)
      << dcr_last_error();
}

}  // namespace
}  // namespace dcr
