// One conformance suite for every ObjectStore; the S3 cases run against a real SigV4-verifying
// server (scripts/start-s3-server.sh) when DCR_S3_ENDPOINT is set and skip otherwise.
#include "dcr/object_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <thread>

namespace dcr {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/dcr_store_test_XXXXXX";
  char* d = mkdtemp(tmpl);
  return d ? d : "/tmp";
}

std::vector<uint8_t> Bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

std::string Env(const char* n) {
  const char* v = std::getenv(n);
  return v ? v : "";
}

// Bucket names unique per process so concurrent test runs do not collide.
std::string UniqueBucket() {
  return "dcr-test-" + std::to_string(::getpid()) + "-" +
         std::to_string(std::random_device{}() % 100000);
}

bool IsHttp(const std::string& endpoint) { return endpoint.rfind("http://", 0) == 0; }

std::unique_ptr<ObjectStore> MakeStore(const std::string& kind) {
  if (kind == "mem") return std::make_unique<MemoryStore>();
  if (kind == "dir") {
    auto s = DirectoryStore::Open(TempDir() + "/root");
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(s).value();
  }
  S3Options o;
  o.endpoint = Env("DCR_S3_ENDPOINT");
  o.ca_file = Env("DCR_S3_CA_FILE");
  o.allow_http = IsHttp(o.endpoint);  // a local test server without a TLS terminator
  o.region = Env("DCR_S3_REGION").empty() ? "us-east-1" : Env("DCR_S3_REGION");
  o.bucket = UniqueBucket();
  o.create_bucket = true;
  o.multipart_threshold = 6 << 20;  // exercise multipart with small objects
  o.part_bytes = 5 << 20;
  auto s = S3Store::Open(o);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return nullptr;
  return std::move(s).value();
}

class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "s3" && Env("DCR_S3_ENDPOINT").empty()) {
      GTEST_SKIP() << "DCR_S3_ENDPOINT unset: start a server with scripts/start-s3-server.sh and "
                      "export the variables it prints";
    }
    store_ = MakeStore(GetParam());
    ASSERT_NE(store_, nullptr);
  }
  std::unique_ptr<ObjectStore> store_;
};

TEST_P(StoreTest, PutGetHeadRangeListDelete) {
  auto a = Bytes(1000, 1), b = Bytes(0, 2), c = Bytes(70000, 3);
  ASSERT_TRUE(store_->Put("p/step-1/0000000000.hdr", a.data(), a.size()).ok());
  ASSERT_TRUE(store_->Put("p/step-1/0000000001.chk", b.data(), b.size()).ok());
  ASSERT_TRUE(store_->Put("p/step-1/sub dir/x+y&z.chk", c.data(), c.size()).ok());
  ASSERT_TRUE(store_->Put("q/other", a.data(), 10).ok());

  auto got = store_->Get("p/step-1/0000000000.hdr");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, a);
  auto empty = store_->Get("p/step-1/0000000001.chk");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());
  auto odd = store_->Get("p/step-1/sub dir/x+y&z.chk");
  ASSERT_TRUE(odd.ok()) << odd.status();
  EXPECT_EQ(*odd, c);

  auto range = store_->GetRange("p/step-1/sub dir/x+y&z.chk", 65000, 10000);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(*range, std::vector<uint8_t>(c.begin() + 65000, c.end()));
  auto mid = store_->GetRange("p/step-1/0000000000.hdr", 10, 20);
  ASSERT_TRUE(mid.ok());
  EXPECT_EQ(*mid, std::vector<uint8_t>(a.begin() + 10, a.begin() + 30));
  EXPECT_FALSE(store_->GetRange("p/step-1/0000000000.hdr", 5000, 1).ok());

  auto head = store_->Head("p/step-1/sub dir/x+y&z.chk");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->size, c.size());
  EXPECT_TRUE(store_->Head("p/nope").status().IsNotFound());
  EXPECT_TRUE(store_->Get("p/nope").status().IsNotFound());

  auto list = store_->List("p/step-1/");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].key, "p/step-1/0000000000.hdr");
  EXPECT_EQ((*list)[0].size, 1000u);
  EXPECT_EQ((*list)[2].key, "p/step-1/sub dir/x+y&z.chk");
  auto all = store_->List("");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 4u);

  ASSERT_TRUE(store_->Delete("p/step-1/0000000001.chk").ok());
  ASSERT_TRUE(store_->Delete("p/step-1/0000000001.chk").ok());  // absent: OK
  list = store_->List("p/");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 2u);
}

TEST_P(StoreTest, ReplaceIsWholeAndBadKeysAreRejected) {
  auto a = Bytes(5000, 4), b = Bytes(100, 5);
  ASSERT_TRUE(store_->Put("k", a.data(), a.size()).ok());
  ASSERT_TRUE(store_->Put("k", b.data(), b.size()).ok());
  EXPECT_EQ(*store_->Get("k"), b);
  for (const char* bad : {"", "/abs", "a//b", "a/../b", "./a", "a/.dcr-tmp.x"}) {
    Status s = store_->Put(bad, a.data(), 1);
    EXPECT_TRUE(s.IsInvalidArgument()) << "'" << bad << "': " << s;
  }
}

TEST_P(StoreTest, LargeObjectAndConcurrentPuts) {
  auto big = Bytes((13 << 20) + 17, 6);  // multipart on S3 (threshold 6 MiB, parts 5 MiB)
  ASSERT_TRUE(store_->Put("big/object", big.data(), big.size()).ok());
  auto got = store_->Get("big/object");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == big);
  auto tail = store_->GetRange("big/object", big.size() - 100, 1000);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(*tail, std::vector<uint8_t>(big.end() - 100, big.end()));

  std::vector<std::thread> threads;
  std::vector<Status> results(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto data = Bytes(3000 + t, 100 + t);
      results[t] = store_->Put("conc/" + std::to_string(t), data.data(), data.size());
    });
  }
  for (auto& t : threads) t.join();
  for (auto& r : results) EXPECT_TRUE(r.ok()) << r;
  auto list = store_->List("conc/");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 8u);
  for (int t = 0; t < 8; ++t)
    EXPECT_EQ(*store_->Get("conc/" + std::to_string(t)), Bytes(3000 + t, 100 + t));
}

INSTANTIATE_TEST_SUITE_P(All, StoreTest, ::testing::Values("mem", "dir", "s3"),
                         [](const auto& info) { return info.param; });

TEST(DirectoryStore, PublishIsAtomicAndTempFilesAreHidden) {
  std::string root = TempDir() + "/store";
  auto s = DirectoryStore::Open(root);
  ASSERT_TRUE(s.ok());
  // A leftover temporary file (as from a crashed writer) is never listed or readable as a key.
  ASSERT_EQ(mkdir((root + "/p").c_str(), 0755), 0);
  FILE* f = fopen((root + "/p/.dcr-tmp.0000000001.chk.1.0").c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("partial", f);
  fclose(f);
  auto list = (*s)->List("p/");
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
  auto d = Bytes(10, 9);
  ASSERT_TRUE((*s)->Put("p/0000000001.chk", d.data(), d.size()).ok());
  list = (*s)->List("p/");
  ASSERT_EQ(list->size(), 1u);
  // Unwritable root: a clear kUnavailable naming the path.
  auto bad = DirectoryStore::Open("/proc/dcr-cannot-create");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("/proc/dcr-cannot-create"), std::string::npos);
}

// Symlinks inside the root (planted by anyone who can write there) never take a key outside
// it: Put, Get, Head, Delete refuse with kFailedPrecondition and List skips them.
TEST(DirectoryStore, SymlinksNeverLeadOutOfTheRoot) {
  const std::string base = TempDir();
  const std::string root = base + "/store", outside = base + "/outside";
  auto s = DirectoryStore::Open(root);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(mkdir(outside.c_str(), 0755), 0);
  FILE* f = fopen((outside + "/secret").c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("secret", f);
  fclose(f);
  ASSERT_EQ(symlink(outside.c_str(), (root + "/evil").c_str()), 0);
  ASSERT_EQ(symlink((outside + "/secret").c_str(), (root + "/leak").c_str()), 0);
  auto d = Bytes(10, 3);
  Status put = (*s)->Put("evil/planted", d.data(), d.size());
  EXPECT_TRUE(put.IsFailedPrecondition()) << put;
  EXPECT_NE(put.message().find("symlink"), std::string::npos) << put;
  EXPECT_NE(access((outside + "/planted").c_str(), F_OK), 0) << "written outside the root";
  for (const std::string key : {"leak", "evil/secret"}) {
    auto got = (*s)->Get(key);
    EXPECT_TRUE(got.status().IsFailedPrecondition()) << key << ": " << got.status();
    EXPECT_FALSE((*s)->Head(key).ok()) << key;
    EXPECT_TRUE((*s)->Delete(key).IsFailedPrecondition()) << key;
  }
  EXPECT_EQ(access((outside + "/secret").c_str(), F_OK), 0);
  auto list = (*s)->List("");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE(list->empty()) << (*list)[0].key;
}

TEST(OpenObjectStore, Specs) {
  EXPECT_TRUE(OpenObjectStore("mem:").ok());
  EXPECT_TRUE(OpenObjectStore("dir:" + TempDir() + "/x").ok());
  EXPECT_TRUE(OpenObjectStore("ftp://x").status().IsInvalidArgument());
  auto s3 = OpenObjectStore("s3://bucket?colour=blue");
  ASSERT_FALSE(s3.ok());
  EXPECT_NE(s3.status().message().find("colour"), std::string::npos);
}

TEST(OpenObjectStore, ReadDeadlineMustBeSeconds) {
  for (const char* bad : {"abc", "0", "-1", "", "1e9", "2s"}) {
    auto s3 =
        OpenObjectStore(std::string("s3://b?endpoint=https://127.0.0.1:9&read_deadline_s=") + bad);
    ASSERT_FALSE(s3.ok()) << bad;
    EXPECT_TRUE(s3.status().IsInvalidArgument()) << bad;
    EXPECT_NE(s3.status().message().find("read_deadline_s"), std::string::npos) << bad;
  }
}

TEST(S3Store, OptionErrorsNameTheField) {
  S3Options o;
  o.bucket = "b";
  auto r = S3Store::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("s3.endpoint"), std::string::npos);
  o.endpoint = "127.0.0.1:8080";
  r = S3Store::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("http://"), std::string::npos);
  o.endpoint = "http://127.0.0.1:1";
  o.allow_http = true;
  o.access_key = "a";
  o.secret_key = "b";
  o.part_bytes = 1 << 20;
  r = S3Store::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("part_bytes"), std::string::npos);
}

TEST(S3Store, UnreachableEndpointIsUnavailable) {
  S3Options o;
  o.endpoint = "http://127.0.0.1:9";  // discard port: nothing listens
  o.allow_http = true;
  o.bucket = "b";
  o.access_key = "a";
  o.secret_key = "b";
  o.connect_timeout_s = 2;
  auto s = S3Store::Open(o);
  ASSERT_TRUE(s.ok());
  auto g = (*s)->Get("k");
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(g.status().IsUnavailable()) << g.status();
  EXPECT_NE(g.status().message().find("127.0.0.1:9"), std::string::npos);
}

TEST(S3Store, CredentialsFromFile) {
  std::string dir = TempDir();
  std::string path = dir + "/creds";
  FILE* f = fopen(path.c_str(), "w");
  fputs("[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n", f);
  fclose(f);
  chmod(path.c_str(), 0600);
  S3Options o;
  o.endpoint = "http://127.0.0.1:9";
  o.allow_http = true;
  o.bucket = "b";
  o.credentials_file = path;
  // Environment credentials take precedence; clear them for this check.
  std::string saved_dcr = Env("DCR_S3_ACCESS_KEY"), saved_aws = Env("AWS_ACCESS_KEY_ID");
  for (const char* v : {"DCR_S3_ACCESS_KEY", "AWS_ACCESS_KEY_ID"}) unsetenv(v);
  auto s = S3Store::Open(o);
  EXPECT_TRUE(s.ok()) << s.status();
  // Readable by others: refused, naming the mode.
  chmod(path.c_str(), 0644);
  Status open = S3Store::Open(o).status();
  EXPECT_TRUE(open.IsFailedPrecondition()) << open;
  EXPECT_NE(open.message().find("mode 0644"), std::string::npos) << open;
  o.credentials_file = dir + "/missing";
  EXPECT_TRUE(S3Store::Open(o).status().IsNotFound());
  if (!saved_dcr.empty()) setenv("DCR_S3_ACCESS_KEY", saved_dcr.c_str(), 1);
  if (!saved_aws.empty()) setenv("AWS_ACCESS_KEY_ID", saved_aws.c_str(), 1);
}

TEST(S3Store, WrongSecretIsForbidden) {
  if (Env("DCR_S3_ENDPOINT").empty()) {
    GTEST_SKIP() << "DCR_S3_ENDPOINT unset: start a server with scripts/start-s3-server.sh";
  }
  S3Options o;
  o.endpoint = Env("DCR_S3_ENDPOINT");
  o.ca_file = Env("DCR_S3_CA_FILE");
  o.allow_http = IsHttp(o.endpoint);
  o.bucket = UniqueBucket();
  o.access_key = Env("DCR_S3_ACCESS_KEY");
  o.secret_key = Env("DCR_S3_SECRET_KEY") + "-wrong";
  auto s = S3Store::Open(o);
  ASSERT_TRUE(s.ok());
  Status put = (*s)->Put("k", "x", 1);
  ASSERT_FALSE(put.ok()) << "a server accepted a wrong secret: it does not verify SigV4";
  EXPECT_TRUE(put.IsFailedPrecondition()) << put;
  EXPECT_NE(put.message().find("403"), std::string::npos) << put;
  EXPECT_NE(put.message().find("SignatureDoesNotMatch"), std::string::npos) << put;
}

TEST(S3Store, PlainHttpNeedsAllowHttp) {
  S3Options o;
  o.endpoint = "http://127.0.0.1:9";
  o.bucket = "b";
  o.access_key = "a";
  o.secret_key = "b";
  auto r = S3Store::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status();
  EXPECT_NE(r.status().message().find("allow_http"), std::string::npos) << r.status();
  o.allow_http = true;
  EXPECT_TRUE(S3Store::Open(o).ok());
  // The same through a store spec.
  auto spec = OpenObjectStore("s3://b?endpoint=http://127.0.0.1:9");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("allow_http"), std::string::npos) << spec.status();
  const std::string creds = TempDir() + "/creds";
  FILE* f = fopen(creds.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("access_key = a\nsecret_key = b\n", f);
  fclose(f);
  chmod(creds.c_str(), 0600);
  auto allowed =
      OpenObjectStore("s3://b?endpoint=http://127.0.0.1:9&allow_http=1&credentials_file=" + creds);
  EXPECT_TRUE(allowed.ok()) << allowed.status();
  o.endpoint = "https://127.0.0.1:9";
  o.allow_http = false;
  o.ca_file = TempDir() + "/missing.pem";
  EXPECT_TRUE(S3Store::Open(o).status().IsNotFound());
}

// The https endpoint (the test server's TLS terminator) is refused when its certificate is
// checked against a CA that did not sign it.
TEST(S3Store, HttpsEndpointIsVerifiedAgainstTheCa) {
  const std::string endpoint = Env("DCR_S3_ENDPOINT");
  if (endpoint.rfind("https://", 0) != 0 || Env("DCR_S3_CA_FILE").empty()) {
    GTEST_SKIP() << "no https test endpoint (scripts/start-s3-server.sh with stunnel4)";
  }
  const std::string dir = TempDir();
  const std::string other_ca = dir + "/other.pem";
  ASSERT_EQ(std::system(("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
                         "-days 1 -subj /CN=other -keyout " +
                         dir + "/other.key -out " + other_ca + " >/dev/null 2>&1")
                            .c_str()),
            0);
  S3Options o;
  o.endpoint = endpoint;
  o.ca_file = other_ca;
  o.bucket = UniqueBucket();
  o.access_key = Env("DCR_S3_ACCESS_KEY");
  o.secret_key = Env("DCR_S3_SECRET_KEY");
  auto s = S3Store::Open(o);
  ASSERT_TRUE(s.ok()) << s.status();
  Status put = (*s)->Put("k", "x", 1);
  ASSERT_FALSE(put.ok())
      << "an https endpoint passed verification against a CA that did not sign it";
  EXPECT_TRUE(put.IsUnavailable()) << put;
  EXPECT_NE(put.message().find("certificate"), std::string::npos) << put;
  o.ca_file = Env("DCR_S3_CA_FILE");
  o.create_bucket = true;
  auto good = S3Store::Open(o);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE((*good)->Put("k", "x", 1).ok());
}

}  // namespace
}  // namespace dcr
