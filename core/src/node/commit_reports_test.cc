#include "node/commit_reports.h"

#include <gtest/gtest.h>

namespace dcr::internal {
namespace {

CommitReport Committed(int rank, uint64_t run = 9, uint64_t version = 3) {
  CommitReport r;
  r.rank = rank;
  r.run = run;
  r.version = version;
  r.target_hash = Hash128{0x1122334455667788ull + static_cast<uint64_t>(rank), 0xabcdefull};
  r.ok = true;
  return r;
}

TEST(CommitReports, RecordRoundTripsAndKeepsItsBytes) {
  CommitReport failed = Committed(4);
  failed.ok = false;
  failed.code = StatusCode::kDataLoss;
  failed.error = "chunk 7: checksum mismatch";
  for (const CommitReport& in : {Committed(2), failed}) {
    const ReportRecord rec = EncodeReportRecord(in);
    size_t used = 0;
    auto out = ParseReportRecord(rec.bytes.data(), rec.bytes.size(), &used);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(used, rec.bytes.size());
    EXPECT_EQ(out->report.rank, in.rank);
    EXPECT_EQ(out->report.run, in.run);
    EXPECT_EQ(out->report.version, in.version);
    EXPECT_EQ(out->report.target_hash, in.target_hash);
    EXPECT_EQ(out->report.ok, in.ok);
    EXPECT_EQ(out->report.code, in.ok ? StatusCode::kOk : in.code);
    EXPECT_EQ(out->report.error, in.ok ? "" : in.error);
    EXPECT_EQ(out->bytes, rec.bytes);
    EXPECT_TRUE(out->tail.empty());
  }
}

TEST(CommitReports, CommitmentRootRoundTripsAndOtherFormatsAreRefusedByName) {
  CommitReport in = Committed(2);
  Sha256Digest root{};
  for (size_t i = 0; i < root.size(); ++i) root[i] = static_cast<uint8_t>(i + 1);
  in.commitment = root;
  const ReportRecord rec = EncodeReportRecord(in);
  EXPECT_EQ(rec.bytes.size(), 4u + kReportBodyFixedBytes + 4u);
  size_t used = 0;
  auto out = ParseReportRecord(rec.bytes.data(), rec.bytes.size(), &used);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->report.commitment, root);
  // No root travels as zeros and reads back as none.
  const ReportRecord none = EncodeReportRecord(Committed(2));
  out = ParseReportRecord(none.bytes.data(), none.bytes.size(), &used);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->report.commitment.has_value());
  // A format-1 record (44-byte body: the additive hash and a message length): refused by name.
  std::vector<uint8_t> v1(rec.bytes.begin(), rec.bytes.begin() + 4 + 40);
  v1[0] = 44;
  v1[1] = v1[2] = v1[3] = 0;
  v1.insert(v1.end(), 8, 0);  // message length 0, tail length 0
  Status s = ParseReportRecord(v1.data(), v1.size(), &used).status();
  EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  EXPECT_NE(s.message().find("format 1"), std::string::npos) << s;
  // An unknown format.
  std::vector<uint8_t> v3 = rec.bytes;
  v3[4 + 44] = 3;
  s = ParseReportRecord(v3.data(), v3.size(), &used).status();
  EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  EXPECT_NE(s.message().find("format 3, unknown"), std::string::npos) << s;
}

TEST(CommitReports, CollectorKeepsACommittedRecordOnlyWithTheExpectedRoot) {
  Sha256Digest root{}, other{};
  root[0] = 7;
  other[0] = 8;
  std::optional<Sha256Digest> expected;  // nothing signed yet: no check
  ReportCollector c({-1, 0, 0, 0, 0}, 0, 9, 3);
  c.set_expected_commitment([&] { return expected; });
  EXPECT_TRUE(c.Add(1, EncodeReportRecord(Committed(1))).ok());
  expected = root;
  CommitReport good = Committed(2), wrong = Committed(3), failed = Committed(4);
  good.commitment = root;
  wrong.commitment = other;
  failed.ok = false;
  failed.error = "refused";
  EXPECT_TRUE(c.Add(2, EncodeReportRecord(good)).ok());
  Status s = c.Add(3, EncodeReportRecord(wrong));
  EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  EXPECT_NE(s.message().find("not the signed root"), std::string::npos) << s;
  EXPECT_TRUE(c.Add(4, EncodeReportRecord(failed)).ok());  // a failure carries no root
  EXPECT_EQ(c.records().size(), 3u);
}

TEST(CommitReports, TailIsCarriedVerbatim) {
  // A record grown at its end (e.g. a signature over the body) parses, and its bytes --
  // tail included -- are what a relay forwards.
  ReportRecord rec = EncodeReportRecord(Committed(1));
  const std::vector<uint8_t> sig = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  rec.bytes.resize(rec.bytes.size() - 4);
  for (int i = 0; i < 4; ++i) rec.bytes.push_back(static_cast<uint8_t>(sig.size() >> (8 * i)));
  rec.bytes.insert(rec.bytes.end(), sig.begin(), sig.end());
  auto payload = EncodeReportPayload({rec, EncodeReportRecord(Committed(2))});
  auto out = ParseReportPayload(payload.data(), payload.size(), 2);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].tail, sig);
  EXPECT_EQ((*out)[0].bytes, rec.bytes);
  EXPECT_EQ((*out)[1].report.rank, 2);
  EXPECT_EQ(EncodeReportPayload(*out), payload);
}

TEST(CommitReports, MalformedPayloadsAreRefused) {
  auto payload = EncodeReportPayload({EncodeReportRecord(Committed(1))});
  EXPECT_TRUE(ParseReportPayload(payload.data(), payload.size(), 2).status().IsDataLoss());
  for (size_t cut = 0; cut < payload.size(); ++cut) {
    EXPECT_TRUE(ParseReportPayload(payload.data(), cut, 1).status().IsDataLoss()) << cut;
  }
  auto extra = payload;
  extra.push_back(0);
  EXPECT_TRUE(ParseReportPayload(extra.data(), extra.size(), 1).status().IsDataLoss());
  auto huge = payload;
  huge[4] = 0xff;  // body length far beyond the bound
  huge[5] = 0xff;
  EXPECT_TRUE(ParseReportPayload(huge.data(), huge.size(), 1).status().IsDataLoss());
  auto bad_code = payload;
  bad_code[4 + 4 + 4] = 200;  // status code byte
  EXPECT_TRUE(ParseReportPayload(bad_code.data(), bad_code.size(), 1).status().IsDataLoss());
}

TEST(CommitReports, CollectorKeepsOnlyTheChildsSubtreeOnceForThisRunAndVersion) {
  // 0 -> 1 -> {3, 4}, 0 -> 2 -> 5; this node is 0.
  ReportCollector c({-1, 0, 0, 1, 1, 2}, 0, 9, 3);
  EXPECT_TRUE(c.Add(1, EncodeReportRecord(Committed(3))).ok());
  EXPECT_TRUE(c.Add(1, EncodeReportRecord(Committed(1))).ok());
  // A rank of another subtree, the sender, a rank out of range: refused.
  Status s = c.Add(1, EncodeReportRecord(Committed(5)));
  EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  EXPECT_NE(s.message().find("not in its subtree"), std::string::npos) << s;
  EXPECT_FALSE(c.Add(1, EncodeReportRecord(Committed(0))).ok());
  EXPECT_FALSE(c.Add(1, EncodeReportRecord(Committed(17))).ok());
  // A node that is not a child of this one.
  EXPECT_FALSE(c.Add(3, EncodeReportRecord(Committed(3))).ok());
  // A duplicate, even through the right child.
  s = c.Add(1, EncodeReportRecord(Committed(3)));
  EXPECT_NE(s.message().find("a second time"), std::string::npos) << s;
  // Another run or version.
  EXPECT_FALSE(c.Add(2, EncodeReportRecord(Committed(5, 8, 3))).ok());
  EXPECT_FALSE(c.Add(2, EncodeReportRecord(Committed(5, 9, 2))).ok());
  EXPECT_TRUE(c.Add(2, EncodeReportRecord(Committed(5))).ok());
  std::vector<int> ranks;
  for (const CommitReport& r : c.reports()) ranks.push_back(r.rank);
  EXPECT_EQ(ranks, (std::vector<int>{3, 1, 5}));
}

TEST(CommitReports, SetTailKeepsTheBodyAndTheVerifierDecides) {
  ReportRecord rec = EncodeReportRecord(Committed(2));
  const auto before = ReportBody(rec);
  const std::vector<uint8_t> body(before.first, before.first + before.second);
  SetReportTail(&rec, {9, 8, 7});
  const auto after = ReportBody(rec);
  EXPECT_EQ(std::vector<uint8_t>(after.first, after.first + after.second), body);
  size_t used = 0;
  auto parsed = ParseReportRecord(rec.bytes.data(), rec.bytes.size(), &used);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tail, (std::vector<uint8_t>{9, 8, 7}));
  // Parents {-1, 0, 1}: a verifier at the sender refuses what it cannot attribute.
  ReportCollector c({-1, 0, 1}, 0, Committed(1).run, Committed(1).version);
  c.set_verifier([](const ReportRecord& r) {
    return r.tail.empty() ? FailedPreconditionError("unsigned") : Status();
  });
  Status s = c.Add(1, EncodeReportRecord(Committed(2)));
  EXPECT_TRUE(s.IsFailedPrecondition()) << s;
  EXPECT_TRUE(c.Add(1, *parsed).ok());
  EXPECT_EQ(c.records().size(), 1u);
}

}  // namespace
}  // namespace dcr::internal
