// The CLI's progress display: formats library progress (dcr/progress.h) as
// "diff: 1.23 GiB / 4.00 GiB, 812 MiB/s, 3 s left" and writes it to stderr, as one line
// rewritten in place on a terminal and as plain periodic lines otherwise.
//
// Thread safety: ProgressLine is thread-compatible (calls must not overlap); the Format*
// functions are pure.
#ifndef DCR_CORE_CLI_PROGRESS_LINE_H_
#define DCR_CORE_CLI_PROGRESS_LINE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "dcr/progress.h"

namespace dcr::cli {

// Binary units, three significant digits: "512 B", "1.23 GiB", "12.3 MiB", "812 MiB".
std::string FormatBytes(double bytes);
// "350 ms" below 1 s, "2.5 s" below 10 s, "42 s", "2 min 05 s", "1 h 02 min".
std::string FormatDuration(double seconds);
// One progress line without a line end, for a phase `elapsed_s` seconds old:
//   "diff: 1.23 GiB / 4.00 GiB, 812 MiB/s, 3 s left"     (done < total)
//   "diff: 4.00 GiB / 4.00 GiB, 812 MiB/s, done in 5.0 s"  (done >= total)
// The rate (done / elapsed) and the time left ((total - done) / rate) are left out while they are
// unknown (nothing done yet, or no time elapsed).
std::string FormatProgress(std::string_view phase, uint64_t done, uint64_t total, double elapsed_s);

class ProgressLine {
 public:
  struct Options {
    // Whether output goes to a terminal: one line redrawn in place ("\r\033[K" + text, no line
    // end) at most every tty_interval_s. Otherwise a plain line ending in '\n' at most every
    // plain_interval_s, and never a carriage return or escape sequence.
    bool tty = false;
    double tty_interval_s = 0.1;
    double plain_interval_s = 5;
    // Seconds on a monotonic clock (default std::chrono::steady_clock).
    std::function<double()> now;
    // Receives the output (default: stderr, flushed).
    std::function<void(std::string_view)> write;
    // Written before the text of every line, e.g. "  synth tiny 3%: ".
    std::string prefix;
  };

  explicit ProgressLine(Options options);
  // A display on stderr (tty = isatty(stderr)) with `options`' intervals and prefix; a disabled
  // one writes nothing at all.
  static ProgressLine ForStderr(bool enabled, Options options);
  static ProgressLine ForStderr(bool enabled) { return ForStderr(enabled, Options()); }
  ~ProgressLine();  // Finish()

  // A library progress update: the phase's line, throttled as above; a phase's first final
  // update (done >= total) always writes its line, ending in '\n', and later updates of that
  // phase write nothing. Phases with total 0 are not shown.
  void Update(const ProgressUpdate& update);
  // A caller-formatted line: throttled like Update unless `final` (always written, ending in
  // '\n').
  void Show(const std::string& text, bool final);
  // Whether a Show(text, false) now would write (the interval since the last line passed), so
  // that a caller can skip gathering what a line would say.
  bool Due() const;
  // Clears a line left unfinished on a terminal, so that other output starts on a clean line.
  void Finish();
  // A callback for an options struct that calls Update; valid while this object lives.
  ProgressCallback Callback();

 private:
  bool enabled_ = true;
  Options options_;
  std::string phase_;
  double phase_start_ = 0;
  uint64_t last_done_ = 0;
  bool phase_done_ = false;  // the current phase's final line is written
  double last_write_ = -1e300;
  bool open_line_ = false;  // a terminal line without its line end is showing
};

}  // namespace dcr::cli

#endif  // DCR_CORE_CLI_PROGRESS_LINE_H_
