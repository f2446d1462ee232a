// The calibration file's optional blocks: TLS costs from dcr_bench_tls --json, inline or as a file
// beside the calibration, and the errors that name a bad key.
#include "calibration.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace dcr::sim::internal {
namespace {

const char* kRates = R"("memcpy_bytes_per_s": 6e9,
  "rates": [{"change_rate": 0.03, "encode_bytes_per_s": 2e9, "decode_apply_bytes_per_s": 5e9}])";

TEST(CalibrationTest, TlsBlockInline) {
  auto c = ParseCalibration(
      std::string("{") + kRates +
          R"(, "tls": {"bytes": 1, "tls_cpu_s_per_byte": {"send": 5e-10, "recv": 7e-10}}})",
      "inline.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->has_tls);
  EXPECT_EQ(c->tls_send_s_per_byte, 5e-10);
  EXPECT_EQ(c->tls_recv_s_per_byte, 7e-10);
  EXPECT_EQ(c->tls_source, "inline.json");
}

TEST(CalibrationTest, NoTlsBlockChargesNothing) {
  auto c = ParseCalibration(std::string("{") + kRates + "}", "x.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->has_tls);
  EXPECT_EQ(c->tls_send_s_per_byte, 0);
}

TEST(CalibrationTest, CommitmentRatePerCoreAndItsWallVariant) {
  auto none = ParseCalibration(std::string("{") + kRates + "}", "x.json");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_commitment());
  auto c = ParseCalibration(std::string("{") + kRates +
                                R"(, "commitment_bytes_per_s": 1.8e9,
                                  "commitment_wall_bytes_per_s": 1.2e9,
                                  "verify_bytes_per_s": 2.5e9})",
                            "x.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->has_commitment());
  EXPECT_EQ(c->commitment_bytes_per_s, 1.8e9);
  EXPECT_EQ(c->verify_bytes_per_s, 2.5e9);
  c->UseWallClock();
  EXPECT_EQ(c->commitment_bytes_per_s, 1.2e9);
  auto bad =
      ParseCalibration(std::string("{") + kRates + R"(, "commitment_bytes_per_s": 0})", "x.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("commitment_bytes_per_s"), std::string::npos);
}

TEST(CalibrationTest, TlsBlockFromAFileBesideTheCalibration) {
  char dir[] = "/tmp/dcr_sim_cal_XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string d = dir;
  std::ofstream(d + "/tls.json") << R"({"tls_cpu_s_per_byte": {"send": 1e-9, "recv": 2e-9}})";
  std::ofstream(d + "/cal.json") << "{" << kRates << R"(, "tls": "tls.json"})";
  auto c = LoadCalibration(d + "/cal.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->has_tls);
  EXPECT_EQ(c->tls_send_s_per_byte, 1e-9);
  EXPECT_EQ(c->tls_recv_s_per_byte, 2e-9);
  EXPECT_EQ(c->tls_source, d + "/tls.json");

  std::ofstream(d + "/missing.json") << "{" << kRates << R"(, "tls": "nope.json"})";
  auto m = LoadCalibration(d + "/missing.json");
  EXPECT_TRUE(m.status().IsNotFound()) << m.status();
  EXPECT_NE(m.status().message().find("nope.json"), std::string::npos) << m.status();
  for (const char* f : {"tls.json", "cal.json", "missing.json"}) std::remove((d + "/" + f).c_str());
  ::rmdir(dir);
}

TEST(CalibrationTest, BadTlsBlockNamesTheKey) {
  auto a = ParseCalibration(std::string("{") + kRates + R"(, "tls": {"wall_s": 1}})", "a.json");
  EXPECT_TRUE(a.status().IsInvalidArgument());
  EXPECT_NE(a.status().message().find("tls_cpu_s_per_byte"), std::string::npos) << a.status();
  auto b = ParseCalibration(
      std::string("{") + kRates + R"(, "tls": {"tls_cpu_s_per_byte": {"send": -1, "recv": 0}}})",
      "b.json");
  EXPECT_TRUE(b.status().IsInvalidArgument());
  EXPECT_NE(b.status().message().find("'send'"), std::string::npos) << b.status();
}

TEST(CalibrationTest, ContextKeysPerRate) {
  const std::string rate =
      R"("encode_bytes_per_s": 2e9, "decode_apply_bytes_per_s": 5e9, "payload_bytes": 900,
         "context_payload_bytes": 600, "context_encode_bytes_per_s": 1e9,
         "context_decode_apply_bytes_per_s": 3e9)";
  auto c = ParseCalibration(
      R"({"memcpy_bytes_per_s": 6e9, "rates": [{"change_rate": 0.03, )" + rate + "}]}", "ctx.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->has_context);
  EXPECT_EQ(c->ContextEncodeBytesPerS(0.03), 1e9);
  // No transcoding speed given: context decode+apply, then the plain encoder.
  EXPECT_DOUBLE_EQ(c->ContextTranscodeBytesPerS(0.03), 1 / (1 / 3e9 + 1 / 2e9));

  auto mixed = ParseCalibration(
      R"({"memcpy_bytes_per_s": 6e9, "rates": [{"change_rate": 0.03, )" + rate +
          R"(}, {"change_rate": 0.05, "encode_bytes_per_s": 2e9, "decode_apply_bytes_per_s": 5e9}]})",
      "mixed.json");
  EXPECT_TRUE(mixed.status().IsInvalidArgument());
  EXPECT_NE(mixed.status().message().find("rates[1]"), std::string::npos) << mixed.status();

  // The class cap the context speeds were measured at: 16 when the file does not say.
  EXPECT_EQ(c->context_classes, kContextClassesMax);
  auto eight = ParseCalibration(
      R"({"memcpy_bytes_per_s": 6e9, "context_classes": 8, "rates": [{"change_rate": 0.03, )" +
          rate + "}]}",
      "ctx8.json");
  ASSERT_TRUE(eight.ok()) << eight.status();
  EXPECT_EQ(eight->context_classes, 8);
  for (const char* bad : {"0", "17", "2.5", "\"8\""}) {
    auto b = ParseCalibration(std::string(R"({"memcpy_bytes_per_s": 6e9, "context_classes": )") +
                                  bad + R"(, "rates": [{"change_rate": 0.03, )" + rate + "}]}",
                              "bad.json");
    EXPECT_TRUE(b.status().IsInvalidArgument()) << bad;
    EXPECT_NE(b.status().message().find("context_classes"), std::string::npos) << b.status();
  }
}

TEST(CalibrationTest, SigningBlock) {
  auto c =
      ParseCalibration(std::string("{") + kRates +
                           R"(, "signing": {"sha256_bytes_per_s": 2e9, "ed25519_signs_per_s": 2e4,
               "ed25519_verifies_per_s": 1e4, "chunks": 320, "manifests": 10,
               "delta_bytes": 1000, "signed_delta_bytes": 1002}})",
                       "sign.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->has_signing);
  EXPECT_DOUBLE_EQ(c->sha256_s_per_byte, 0.5e-9);
  EXPECT_DOUBLE_EQ(c->sign_s_per_manifest, 50e-6);
  EXPECT_DOUBLE_EQ(c->verify_s_per_manifest, 100e-6);
  EXPECT_DOUBLE_EQ(c->chunks_per_manifest, 32);
  EXPECT_DOUBLE_EQ(c->signed_size_ratio, 1.002);
  auto bad = ParseCalibration(
      std::string("{") + kRates + R"(, "signing": {"sha256_bytes_per_s": 2e9}})", "bad.json");
  EXPECT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_NE(bad.status().message().find("ed25519_signs_per_s"), std::string::npos) << bad.status();
}

TEST(CalibrationTest, CommitKeysPerRateOrInABlock) {
  // In the rates (dcr bench pipeline --json writes them there): interpolated in change rate.
  auto c = ParseCalibration(R"({"memcpy_bytes_per_s": 6e9, "rates": [
      {"change_rate": 0.01, "encode_bytes_per_s": 2e9, "decode_apply_bytes_per_s": 5e9,
       "commit_s_per_storage_byte": 1e-9, "plain_write_bytes_per_s": 2e9},
      {"change_rate": 0.05, "encode_bytes_per_s": 2e9, "decode_apply_bytes_per_s": 5e9,
       "commit_s_per_storage_byte": 3e-9, "plain_write_bytes_per_s": 1e9}]})",
                            "r.json");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->has_commit());
  EXPECT_DOUBLE_EQ(c->CommitSPerStorageByte(0.03), 2e-9);
  EXPECT_DOUBLE_EQ(c->CommitSPerStorageByte(0.10), 3e-9);
  EXPECT_DOUBLE_EQ(c->PlainWriteBytesPerS(0.01), 2e9);
  EXPECT_EQ(c->commit_source, "r.json");

  // A "durability" block: the rates of another file's JSON, inline here.
  auto b = ParseCalibration(std::string("{") + kRates + R"(, "durability": {"rates": [
      {"change_rate": 0.03, "commit_s_per_storage_byte": 4e-9}]}})",
                            "b.json");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_DOUBLE_EQ(b->CommitSPerStorageByte(0.03), 4e-9);

  auto none = ParseCalibration(std::string("{") + kRates + "}", "n.json");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_commit());

  // Some rates with the keys and some without, a block without them, a bad value: refused.
  auto partial = ParseCalibration(R"({"memcpy_bytes_per_s": 6e9, "rates": [
      {"change_rate": 0.01, "encode_bytes_per_s": 2e9, "decode_apply_bytes_per_s": 5e9,
       "commit_s_per_storage_byte": 1e-9},
      {"change_rate": 0.05, "encode_bytes_per_s": 2e9, "decode_apply_bytes_per_s": 5e9}]})",
                                  "p.json");
  EXPECT_TRUE(partial.status().IsInvalidArgument());
  EXPECT_NE(partial.status().message().find("commit_*"), std::string::npos) << partial.status();
  auto empty =
      ParseCalibration(std::string("{") + kRates + R"(, "durability": {"rates": []}})", "e");
  EXPECT_TRUE(empty.status().IsInvalidArgument()) << empty.status();
  auto bad = ParseCalibration(std::string("{") + kRates + R"(, "durability": {"rates": [
      {"change_rate": 0.03, "commit_s_per_storage_byte": -1}]}})",
                              "bad.json");
  EXPECT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_NE(bad.status().message().find("commit_s_per_storage_byte"), std::string::npos);
}

}  // namespace
}  // namespace dcr::sim::internal
