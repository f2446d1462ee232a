#include "progress_line.h"

#include <gtest/gtest.h>

#include <string>

namespace dcr::cli {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(FormatBytes, ThreeSignificantDigitsInBinaryUnits) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.00 KiB");
  EXPECT_EQ(FormatBytes(1.23 * kGiB), "1.23 GiB");
  EXPECT_EQ(FormatBytes(12.3 * kMiB), "12.3 MiB");
  EXPECT_EQ(FormatBytes(812.0 * kMiB), "812 MiB");
  EXPECT_EQ(FormatBytes(9.999 * kMiB), "10.0 MiB");
  EXPECT_EQ(FormatBytes(4.0 * kGiB), "4.00 GiB");
}

TEST(FormatDuration, Units) {
  EXPECT_EQ(FormatDuration(0.35), "350 ms");
  EXPECT_EQ(FormatDuration(2.5), "2.5 s");
  EXPECT_EQ(FormatDuration(42), "42 s");
  EXPECT_EQ(FormatDuration(125), "2 min 05 s");
  EXPECT_EQ(FormatDuration(3720), "1 h 02 min");
}

TEST(FormatProgress, RateAndTimeLeft) {
  // 1.25 GiB of 4 GiB after 1.5 s: 853 MiB/s, 2.75 GiB left = 3.3 s.
  EXPECT_EQ(FormatProgress("diff", kGiB + kGiB / 4, 4 * kGiB, 1.5),
            "diff: 1.25 GiB / 4.00 GiB, 853 MiB/s, 3.3 s left");
  EXPECT_EQ(FormatProgress("apply", 4 * kGiB, 4 * kGiB, 5),
            "apply: 4.00 GiB / 4.00 GiB, 819 MiB/s, done in 5.0 s");
}

TEST(FormatProgress, UnknownRateLeftOut) {
  EXPECT_EQ(FormatProgress("diff", 0, 4 * kGiB, 2), "diff: 0 B / 4.00 GiB");
  EXPECT_EQ(FormatProgress("diff", kGiB, 4 * kGiB, 0), "diff: 1.00 GiB / 4.00 GiB");
}

struct Capture {
  double t = 0;
  std::string out;
  ProgressLine::Options Options(bool tty) {
    ProgressLine::Options o;
    o.tty = tty;
    o.now = [this] { return t; };
    o.write = [this](std::string_view s) { out += s; };
    return o;
  }
};

TEST(ProgressLine, FileGetsPlainPeriodicLinesAndAFinalLine) {
  Capture c;
  {
    ProgressLine line(c.Options(false));
    for (int i = 0; i <= 96; ++i) {  // 12 s at 100 MiB/s, an update every 125 ms
      c.t = i * 0.125;
      line.Update(ProgressUpdate{"diff", static_cast<uint64_t>(i) * 25 * kMiB / 2, 1200 * kMiB});
    }
  }
  EXPECT_EQ(c.out.find('\r'), std::string::npos) << c.out;
  EXPECT_EQ(c.out.find('\033'), std::string::npos) << c.out;
  EXPECT_EQ(c.out,
            "diff: 500 MiB / 1.17 GiB, 100 MiB/s, 7.0 s left\n"
            "diff: 1000 MiB / 1.17 GiB, 100 MiB/s, 2.0 s left\n"
            "diff: 1.17 GiB / 1.17 GiB, 100 MiB/s, done in 12 s\n");
}

TEST(ProgressLine, ShortPhaseOnAFileLeavesOnlyItsFinalLine) {
  Capture c;
  ProgressLine line(c.Options(false));
  line.Update(ProgressUpdate{"hash base", 0, kGiB});
  c.t = 0.5;
  line.Update(ProgressUpdate{"hash base", kGiB, kGiB});
  line.Update(ProgressUpdate{"diff", 0, kGiB});
  c.t = 1.0;
  line.Update(ProgressUpdate{"diff", kGiB / 2, kGiB});
  c.t = 1.5;
  line.Update(ProgressUpdate{"diff", kGiB, kGiB});
  line.Update(ProgressUpdate{"diff", kGiB, kGiB});  // the phase's end after its last unit
  EXPECT_EQ(c.out,
            "hash base: 1.00 GiB / 1.00 GiB, 2.00 GiB/s, done in 500 ms\n"
            "diff: 1.00 GiB / 1.00 GiB, 1.00 GiB/s, done in 1.0 s\n");
}

TEST(ProgressLine, TerminalRedrawsOneLineAndEndsIt) {
  Capture c;
  ProgressLine line(c.Options(true));
  line.Update(ProgressUpdate{"apply", 0, kGiB});
  c.t = 0.05;  // within the redraw interval: not shown
  line.Update(ProgressUpdate{"apply", kGiB / 4, kGiB});
  c.t = 0.5;
  line.Update(ProgressUpdate{"apply", kGiB / 2, kGiB});
  EXPECT_EQ(
      c.out,
      "\r\033[Kapply: 0 B / 1.00 GiB\r\033[Kapply: 512 MiB / 1.00 GiB, 1.00 GiB/s, 500 ms left");
  c.out.clear();
  line.Finish();
  EXPECT_EQ(c.out, "\r\033[K");
  c.out.clear();
  c.t = 1.0;
  line.Update(ProgressUpdate{"apply", kGiB, kGiB});
  EXPECT_EQ(c.out, "\r\033[Kapply: 1.00 GiB / 1.00 GiB, 1.00 GiB/s, done in 1.0 s\n");
  c.out.clear();
  line.Finish();  // the final line has its line end: nothing to clear
  EXPECT_EQ(c.out, "");
}

TEST(ProgressLine, PrefixAndDue) {
  Capture c;
  ProgressLine::Options o = c.Options(false);
  o.prefix = "  synth tiny 3%: ";
  ProgressLine line(std::move(o));
  EXPECT_FALSE(line.Due());
  line.Show("calibrate 1/48", false);  // within the first interval: not written
  c.t = 5;
  EXPECT_TRUE(line.Due());
  line.Show("calibrate 30/48", false);
  EXPECT_FALSE(line.Due());
  line.Show("calibrate done", true);
  EXPECT_EQ(c.out, "  synth tiny 3%: calibrate 30/48\n  synth tiny 3%: calibrate done\n");
}

TEST(ProgressLine, DisabledWritesNothing) {
  ProgressLine line = ProgressLine::ForStderr(false);
  ProgressCallback cb = line.Callback();
  // Would reach stderr if enabled; the test only checks that nothing breaks.
  cb(ProgressUpdate{"diff", 1, 1});
  line.Show("x", true);
}

TEST(ProgressLine, ZeroTotalIsNotShown) {
  Capture c;
  ProgressLine line(c.Options(false));
  line.Update(ProgressUpdate{"copy base", 0, 0});
  EXPECT_EQ(c.out, "");
}

}  // namespace
}  // namespace dcr::cli
