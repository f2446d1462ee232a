#include "run_check.h"

#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>

#include "command.h"
#include "dcr/checkpoint.h"
#include "dcr/status_macros.h"

namespace dcr::cli {
namespace {

std::string Fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

std::string RunLabel(const RunResult& run) {
  std::string label = std::string(MethodName(run.method)) + "/" + TransportKindName(run.transport);
  const double rate = run.configured_change_rate > 0 ? run.configured_change_rate : run.change_rate;
  label += "/rate " + Fmt("%.4g%%", rate * 100) + "/step " + std::to_string(run.step);
  return label;
}

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // XML 1.0 admits no control characters but tab, newline and carriage return.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') {
          out += ' ';
        } else {
          out += c;
        }
    }
  }
  return out;
}

}  // namespace

StatusOr<RunCheck> LoadRunCheck(const std::string& path) {
  if (!std::ifstream(path)) return NotFoundError("--check " + path + ": no such file");
  RunCheck c;
  c.file = path;
  YAML::Node n;
  try {
    n = YAML::LoadFile(path);
  } catch (const std::exception& e) {
    return InvalidArgumentError("--check " + path + ": " + e.what());
  }
  if (n.IsNull()) return c;
  if (!n.IsMap()) return InvalidArgumentError("--check " + path + ": expected a map of thresholds");
  for (const auto& kv : n) {
    const std::string key = kv.first.as<std::string>("");
    const std::string value = kv.second.IsScalar() ? kv.second.as<std::string>("") : "";
    const std::string what = "--check " + path + ": " + key;
    if (key == "min_speedup") {
      char* end = nullptr;
      c.min_speedup = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(c.min_speedup > 0)) {
        return InvalidArgumentError(what + ": expected a positive number, got '" + value + "'");
      }
    } else if (key == "max_wire_bytes_per_receiver") {
      DCR_ASSIGN_OR_RETURN(c.max_wire_bytes_per_receiver, ParseSize(value, what));
      if (c.max_wire_bytes_per_receiver == 0) {
        return InvalidArgumentError(what + ": expected a positive size");
      }
    } else if (key == "verified") {
      if (value != "true" && value != "false") {
        return InvalidArgumentError(what + ": expected true or false, got '" + value + "'");
      }
      c.verified = value == "true";
    } else {
      return InvalidArgumentError(what +
                                  ": unknown key (min_speedup, "
                                  "max_wire_bytes_per_receiver, verified)");
    }
  }
  return c;
}

Status ValidateRunCheck(const RunCheck& check, const Scenario& s) {
  const std::set<Method> methods(s.methods.begin(), s.methods.end());
  if (check.min_speedup > 0 && (!methods.count(Method::kDelta) || !methods.count(Method::kFull))) {
    return InvalidArgumentError("--check " + check.file +
                                ": min_speedup compares the delta with "
                                "the full transfer of the same run: the scenario needs methods: "
                                "[delta, full]");
  }
  if (check.max_wire_bytes_per_receiver > 0 && !methods.count(Method::kDelta)) {
    return InvalidArgumentError("--check " + check.file +
                                ": max_wire_bytes_per_receiver gates the "
                                "delta runs: the scenario has no delta method");
  }
  return Status();
}

std::vector<CheckOutcome> EvaluateRunCheck(const RunCheck& check, const ScenarioResult& r) {
  std::vector<CheckOutcome> out;
  for (const RunResult& run : r.runs) {
    const std::string label = RunLabel(run);
    const std::string failed = run.error.empty() ? "" : "the run failed: " + run.error;
    if (check.verified) {
      CheckOutcome o;
      o.name = label + ": every receiver verified";
      o.seconds = run.refit_seconds;
      o.passed = run.error.empty() && run.receivers > 0 && run.receivers_verified == run.receivers;
      o.message = std::to_string(run.receivers_verified) + " of " + std::to_string(run.receivers) +
                  " receivers verified byte for byte" + (failed.empty() ? "" : "; " + failed);
      out.push_back(o);
    }
    if (run.method != Method::kDelta) continue;
    if (check.min_speedup > 0) {
      CheckOutcome o;
      o.name = label + ": speedup >= " + Fmt("%g", check.min_speedup) + "x";
      o.seconds = run.refit_seconds;
      const double speedup = SpeedupVsFull(r, run);
      o.passed = speedup >= check.min_speedup;
      if (!failed.empty()) {
        o.message = failed;
      } else if (speedup <= 0) {
        o.message =
            "no successful full run of the same transport, change rate and step to "
            "compare with";
      } else {
        o.message = "speedup " + Fmt("%.3g", speedup) + "x over the full transfer (delta " +
                    Fmt("%.3f", run.refit_seconds) + " s)" +
                    (o.passed ? "" : ", below " + Fmt("%g", check.min_speedup) + "x");
      }
      out.push_back(o);
    }
    if (check.max_wire_bytes_per_receiver > 0) {
      CheckOutcome o;
      o.name = label +
               ": wire bytes per receiver <= " + std::to_string(check.max_wire_bytes_per_receiver);
      o.seconds = run.refit_seconds;
      const uint64_t per = run.receivers > 0 ? run.wire_bytes / run.receivers : 0;
      o.passed = failed.empty() && run.receivers > 0 && per <= check.max_wire_bytes_per_receiver;
      o.message =
          !failed.empty() ? failed
          : run.receivers == 0
              ? std::string("no receivers")
              : std::to_string(per) + " wire bytes per receiver (" +
                    std::to_string(run.wire_bytes) + " over the long link / " +
                    std::to_string(run.receivers) + ")" +
                    (o.passed ? ""
                              : ", above " + std::to_string(check.max_wire_bytes_per_receiver));
      out.push_back(o);
    }
  }
  return out;
}

std::string RunCheckJUnit(const std::string& suite, const std::vector<CheckOutcome>& outcomes) {
  int failures = 0;
  double seconds = 0;
  for (const CheckOutcome& o : outcomes) {
    failures += o.passed ? 0 : 1;
    seconds += o.seconds;
  }
  const std::string name = XmlEscape(suite);
  std::string x = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  x += "<testsuites name=\"dcr run --check\" tests=\"" + std::to_string(outcomes.size()) +
       "\" failures=\"" + std::to_string(failures) + "\" errors=\"0\" time=\"" +
       Fmt("%.3f", seconds) + "\">\n";
  x += "  <testsuite name=\"" + name + "\" tests=\"" + std::to_string(outcomes.size()) +
       "\" failures=\"" + std::to_string(failures) + "\" errors=\"0\" skipped=\"0\" time=\"" +
       Fmt("%.3f", seconds) + "\">\n";
  for (const CheckOutcome& o : outcomes) {
    x += "    <testcase classname=\"dcr.run." + name + "\" name=\"" + XmlEscape(o.name) +
         "\" time=\"" + Fmt("%.3f", o.seconds) + "\">\n";
    if (o.passed) {
      x += "      <system-out>" + XmlEscape(o.message) + "</system-out>\n";
    } else {
      x += "      <failure message=\"" + XmlEscape(o.message) + "\" type=\"threshold\">" +
           XmlEscape(o.message) + "</failure>\n";
    }
    x += "    </testcase>\n";
  }
  x += "  </testsuite>\n</testsuites>\n";
  return x;
}

bool ReportRunCheck(const RunCheck& check, const std::string& json_path, const std::string& suite,
                    const std::vector<CheckOutcome>& outcomes) {
  bool ok = true;
  size_t passed = 0;
  for (const CheckOutcome& o : outcomes) {
    if (o.passed) {
      ++passed;
    } else {
      std::fprintf(stderr, "dcr run --check: MISS %s: %s\n", o.name.c_str(), o.message.c_str());
      ok = false;
    }
  }
  const std::string xml_path = JUnitPathFor(json_path);
  const std::string xml = RunCheckJUnit(suite, outcomes);
  Status w = WriteFileAtomic(xml_path, xml.data(), xml.size());
  if (!w.ok()) {
    ReportStatus("run", w.WithContext("--check: the JUnit XML"));
    return false;
  }
  std::fprintf(stderr, "dcr run --check: %zu of %zu checks of %s passed; JUnit XML %s\n", passed,
               outcomes.size(), check.file.c_str(), xml_path.c_str());
  return ok;
}

std::string JUnitPathFor(const std::string& json_path) {
  const std::string ext = ".json";
  if (json_path.size() > ext.size() &&
      json_path.compare(json_path.size() - ext.size(), ext.size(), ext) == 0) {
    return json_path.substr(0, json_path.size() - ext.size()) + ".junit.xml";
  }
  return json_path + ".junit.xml";
}

}  // namespace dcr::cli
