#include "progress_line.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>

namespace dcr::cli {

std::string FormatBytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  char buf[32];
  if (!(bytes >= 1024)) {
    std::snprintf(buf, sizeof(buf), "%.0f B", bytes > 0 ? bytes : 0.0);
    return buf;
  }
  int unit = 0;
  double v = bytes;
  while (v >= 1024 && unit < 5) {
    v /= 1024;
    ++unit;
  }
  // Round first, so that 9.996 prints as "10.0", not "10.00".
  const char* fmt = "%.0f %s";
  if (std::round(v * 100) / 100 < 10) {
    fmt = "%.2f %s";
  } else if (std::round(v * 10) / 10 < 100) {
    fmt = "%.1f %s";
  }
  std::snprintf(buf, sizeof(buf), fmt, v, kUnits[unit]);
  return buf;
}

std::string FormatDuration(double seconds) {
  char buf[32];
  if (!(seconds > 0)) seconds = 0;
  if (seconds < 1) {
    std::snprintf(buf, sizeof(buf), "%.0f ms", seconds * 1e3);
  } else if (seconds < 9.95) {
    std::snprintf(buf, sizeof(buf), "%.1f s", seconds);
  } else if (seconds < 59.5) {
    std::snprintf(buf, sizeof(buf), "%.0f s", seconds);
  } else if (seconds < 3599.5) {
    const long s = std::lround(seconds);
    std::snprintf(buf, sizeof(buf), "%ld min %02ld s", s / 60, s % 60);
  } else {
    const long m = std::lround(seconds / 60);
    std::snprintf(buf, sizeof(buf), "%ld h %02ld min", m / 60, m % 60);
  }
  return buf;
}

std::string FormatProgress(std::string_view phase, uint64_t done, uint64_t total,
                           double elapsed_s) {
  std::string out(phase);
  out += ": " + FormatBytes(static_cast<double>(done)) + " / " +
         FormatBytes(static_cast<double>(total));
  const bool finished = done >= total;
  if (done > 0 && elapsed_s > 0) {
    const double rate = static_cast<double>(done) / elapsed_s;
    out += ", " + FormatBytes(rate) + "/s";
    if (!finished) out += ", " + FormatDuration(static_cast<double>(total - done) / rate) + " left";
  }
  if (finished) out += ", done in " + FormatDuration(elapsed_s);
  return out;
}

ProgressLine::ProgressLine(Options options) : options_(std::move(options)) {
  if (!options_.now) {
    options_.now = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
  }
  // A file gets its first periodic line plain_interval_s after the start.
  if (!options_.tty) last_write_ = options_.now();
  if (!options_.write) {
    options_.write = [](std::string_view s) {
      std::fwrite(s.data(), 1, s.size(), stderr);
      std::fflush(stderr);
    };
  }
}

ProgressLine ProgressLine::ForStderr(bool enabled, Options options) {
  options.tty = isatty(STDERR_FILENO) != 0;
  ProgressLine line(std::move(options));
  line.enabled_ = enabled;
  return line;
}

ProgressLine::~ProgressLine() { Finish(); }

bool ProgressLine::Due() const {
  const double interval = options_.tty ? options_.tty_interval_s : options_.plain_interval_s;
  return enabled_ && options_.now() - last_write_ >= interval;
}

void ProgressLine::Show(const std::string& text, bool final) {
  if (!enabled_) return;
  if (!final && !Due()) return;
  last_write_ = options_.now();
  std::string out = (options_.tty ? "\r\033[K" : "") + options_.prefix + text;
  if (final || !options_.tty) out += '\n';
  open_line_ = options_.tty && !final;
  options_.write(out);
}

void ProgressLine::Update(const ProgressUpdate& u) {
  if (!enabled_ || u.total_bytes == 0) return;
  const double now = options_.now();
  // A new phase, or the same one again (a phase restarts at 0; after its end it can only
  // restart).
  if (u.phase != phase_ || u.done_bytes == 0 || u.done_bytes < last_done_ ||
      (phase_done_ && u.done_bytes < u.total_bytes)) {
    phase_ = std::string(u.phase);
    phase_start_ = now;
    // A file gets its first line of a phase plain_interval_s into it (a short phase: only its
    // final line); a terminal shows the phase at once.
    if (!options_.tty) last_write_ = now;
    phase_done_ = false;
  }
  last_done_ = u.done_bytes;
  const bool final = u.done_bytes >= u.total_bytes;
  if (phase_done_)
    return;  // the phase's final line is written (the last unit of work and the
             // phase's end both report done == total)
  phase_done_ = final;
  Show(FormatProgress(u.phase, u.done_bytes, u.total_bytes, now - phase_start_), final);
}

void ProgressLine::Finish() {
  if (!enabled_ || !open_line_) return;
  options_.write("\r\033[K");
  open_line_ = false;
}

ProgressCallback ProgressLine::Callback() {
  return [this](const ProgressUpdate& u) { Update(u); };
}

}  // namespace dcr::cli
