#include "dcr/reports/report.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/status_macros.h"

namespace dcr::reports {
namespace {

using nlohmann::json;

std::string Fmt(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string Pct(double rate) { return Fmt("%g%%", rate * 100.0); }

Status WriteFileAtomic(const std::string& path, const std::string& content) {
  return dcr::WriteFileAtomic(path, content.data(), content.size());
}

Status MakeDirs(const std::string& dir) {
  std::string cur;
  std::stringstream ss(dir);
  std::string part;
  if (!dir.empty() && dir[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoError("cannot create directory '" + cur + "'", errno);
    }
  }
  return Status::OK();
}

std::string ScalarText(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

// The change rate a reader names a run by: the trainer's rate where the result has it (3%, 5%),
// else the measured one to three significant digits.
std::string RateLabel(const ReportRow& r) {
  return r.configured_change_rate > 0 ? Pct(r.configured_change_rate)
                                      : Fmt("%.3g%%", r.change_rate * 100.0);
}

double NominalRate(const ReportRow& r) {
  return r.configured_change_rate > 0 ? r.configured_change_rate : r.change_rate;
}

// Display label of a (model, rate) group.
std::string GroupLabel(const ReportRow& r) { return r.model + " " + RateLabel(r); }

// The published reference of a group: NeMo-DCR reports one refit time, 1T at 3% over its relay
// tree (150 s); the 1T presets' full-checkpoint transfer (87.5 min) is the simulator's calibration
// input, not a result.
bool IsOneTrillion(const ReportRow& r) {
  std::string m = r.model;
  std::transform(m.begin(), m.end(), m.begin(), ::tolower);
  return m.find("1t") != std::string::npos;
}

bool IsPaperHeadline(const ReportRow& r) {
  return IsOneTrillion(r) && std::fabs(NominalRate(r) - 0.03) < 1e-9;
}

// "simulated", "real" or "simulated and real", as the rows say.
std::string ModeWords(const std::vector<ReportRow>& rows) {
  bool sim = false, real = false;
  for (const ReportRow& r : rows) (r.mode == "sim" ? sim : real) = true;
  if (sim && real) return "simulated and real";
  return sim ? "simulated" : "real";
}

// " , N receivers" when every row has the same receiver count.
std::string ReceiversWords(const std::vector<ReportRow>& rows) {
  if (rows.empty()) return "";
  for (const ReportRow& r : rows) {
    if (r.receivers != rows.front().receivers) return "";
  }
  return ", " + std::to_string(rows.front().receivers) + " receivers";
}

std::string SeriesKey(const std::string& method, const std::string& transport) {
  return method + "/" + transport;
}

}  // namespace

namespace {

// A node's result (`rank`, `role`, `ok` at the top level) as a NodeRow.
Status AddNodeResult(const json& j, const std::string& source, Report* report) {
  if (!j["rank"].is_number_integer() || !j["role"].is_string() || !j.contains("ok") ||
      !j["ok"].is_boolean()) {
    return InvalidArgumentError(source +
                                ": a node result needs integer 'rank', string 'role' "
                                "and boolean 'ok'");
  }
  auto number = [&j](const char* key) {
    return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
  };
  NodeRow n;
  n.source = source;
  n.rank = j["rank"].get<int64_t>();
  n.role = j["role"].get<std::string>();
  n.ok = j["ok"].get<bool>();
  n.verified = j.contains("verified") && j["verified"].is_boolean() && j["verified"].get<bool>();
  const double start = number("t_start"), commit = number("t_commit");
  n.seconds = start > 0 && commit >= start ? commit - start : 0;
  n.bytes_received = number("bytes_received");
  n.bytes_sent = number("bytes_sent");
  n.receivers_committed = static_cast<int64_t>(number("receivers_committed"));
  if (j.contains("declared_dead") && j["declared_dead"].is_array()) {
    for (const json& d : j["declared_dead"]) {
      if (!d.is_string()) continue;
      n.declared_dead += (n.declared_dead.empty() ? "" : "; ") + d.get<std::string>();
    }
  }
  if (j.contains("error") && j["error"].is_string()) n.error = j["error"].get<std::string>();
  report->nodes.push_back(n);
  return Status::OK();
}

// `text` with the characters that would break a Markdown table cell or a CSV field replaced.
std::string Cell(std::string text, char separator) {
  for (char& c : text) {
    if (c == '\n' || c == separator || c == '"') c = ' ';
  }
  return text;
}

}  // namespace

Status AddResult(const std::string& json_text, const std::string& source, Report* report) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError(source + ": not a JSON object");
  }
  if (!j.contains("scenario") && j.contains("rank") && j.contains("role")) {
    return AddNodeResult(j, source, report);
  }
  for (const char* key : {"scenario", "mode", "model"}) {
    if (!j.contains(key) || !j[key].is_string()) {
      return InvalidArgumentError(source + ": missing string key '" + std::string(key) + "'");
    }
  }
  if (!j.contains("runs") || !j["runs"].is_array()) {
    return InvalidArgumentError(source + ": missing array 'runs'");
  }
  const json& runs = j["runs"];
  for (size_t i = 0; i < runs.size(); ++i) {
    const json& r = runs[i];
    std::string where = source + ": runs[" + std::to_string(i) + "]";
    if (!r.is_object()) return InvalidArgumentError(where + ": not an object");
    for (const char* key : {"method", "transport"}) {
      if (!r.contains(key) || !r[key].is_string()) {
        return InvalidArgumentError(where + ": missing string key '" + std::string(key) + "'");
      }
    }
    for (const char* key :
         {"change_rate", "refit_seconds", "wire_bytes", "receivers", "receivers_verified"}) {
      if (!r.contains(key) || !r[key].is_number()) {
        return InvalidArgumentError(where + ": missing numeric key '" + std::string(key) + "'");
      }
    }
    ReportRow row;
    row.source = source;
    row.scenario = j["scenario"].get<std::string>();
    row.mode = j["mode"].get<std::string>();
    row.model = j["model"].get<std::string>();
    row.method = r["method"].get<std::string>();
    row.transport = r["transport"].get<std::string>();
    row.change_rate = r["change_rate"].get<double>();
    if (r.contains("configured_change_rate") && r["configured_change_rate"].is_number()) {
      row.configured_change_rate = r["configured_change_rate"].get<double>();
    }
    row.refit_seconds = r["refit_seconds"].get<double>();
    row.wire_bytes = r["wire_bytes"].get<double>();
    row.receivers = r["receivers"].get<int64_t>();
    row.receivers_verified = r["receivers_verified"].get<int64_t>();
    if (row.method != "delta" && row.method != "full") {
      return InvalidArgumentError(where + ": key 'method' must be \"delta\" or \"full\"");
    }
    report->rows.push_back(row);
  }
  ResultSetup setup;
  setup.source = source;
  setup.scenario = j["scenario"].get<std::string>();
  std::ostringstream text;
  text << "mode: " << j["mode"].get<std::string>() << "; model: " << j["model"].get<std::string>();
  if (j.contains("setup") && j["setup"].is_object()) {
    for (auto& [k, v] : j["setup"].items()) {
      // Long values (a verbatim calibration file) stay in the result JSON, not in the table.
      if (v.is_object() || v.is_array()) continue;
      if (k.size() > 5 && k.compare(k.size() - 5, 5, ".json") == 0) continue;  // verbatim files
      std::string value = ScalarText(v);
      std::replace(value.begin(), value.end(), '\n', ' ');
      if (value.size() > 400)
        value = value.substr(0, 80) + "... (" + std::to_string(value.size()) +
                " chars, see the result file)";
      text << "; " << k << ": " << value;
    }
  }
  if (j.contains("calibration") && j["calibration"].is_object()) {
    const json& c = j["calibration"];
    if (c.contains("source")) text << "; calibration: " << ScalarText(c["source"]);
    if (c.contains("memcpy_bytes_per_s")) {
      text << " (memcpy " << Fmt("%.3g", c["memcpy_bytes_per_s"].get<double>()) << " B/s)";
    }
  }
  setup.text = text.str();
  report->setups.push_back(setup);
  return Status::OK();
}

namespace {

// (rank, version) of a file named node-<rank>-v<k>.json; false for any other name.
bool NodeResultName(const std::string& name, long* rank, long* version) {
  char tail[8] = {0};
  int used = 0;
  if (std::sscanf(name.c_str(), "node-%ld-v%ld%7s%n", rank, version, tail, &used) != 3) {
    return false;
  }
  return std::string(tail) == ".json" && static_cast<size_t>(used) == name.size() && *rank >= 0 &&
         *version >= 1;
}

}  // namespace

StatusOr<std::vector<std::string>> NodeResultsIn(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return NotFoundError("directory '" + dir + "' cannot be read");
  std::vector<std::tuple<long, long, std::string>> own;
  std::vector<std::string> deployments;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    long rank = 0, version = 0;
    if (NodeResultName(name, &rank, &version)) {
      own.emplace_back(rank, version, dir + "/" + name);
    } else if (name.rfind("deployment-", 0) == 0) {
      struct stat st;
      const std::string sub = dir + "/" + name;
      if (stat(sub.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) deployments.push_back(sub);
    }
  }
  closedir(d);
  std::sort(own.begin(), own.end());
  std::sort(deployments.begin(), deployments.end());
  std::vector<std::string> out;
  for (const auto& o : own) out.push_back(std::get<2>(o));
  for (const std::string& sub : deployments) {
    DCR_ASSIGN_OR_RETURN(std::vector<std::string> more, NodeResultsIn(sub));
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

StatusOr<Report> LoadResults(const std::vector<std::string>& given) {
  Report report;
  std::vector<std::string> paths;
  for (const std::string& p : given) {
    struct stat st;
    if (stat(p.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      paths.push_back(p);
      continue;
    }
    DCR_ASSIGN_OR_RETURN(std::vector<std::string> found, NodeResultsIn(p));
    if (found.empty()) {
      return NotFoundError("directory '" + p +
                           "' holds no node results (node-<rank>-v<k>.json, also in its "
                           "deployment-* directories)");
    }
    paths.insert(paths.end(), found.begin(), found.end());
  }
  for (const std::string& p : paths) {
    std::ifstream in(p, std::ios::binary);
    if (!in) return NotFoundError("result file '" + p + "' cannot be read");
    std::stringstream ss;
    ss << in.rdbuf();
    DCR_RETURN_IF_ERROR(AddResult(ss.str(), p, &report));
  }
  ComputeDerived(&report);
  return report;
}

void ComputeDerived(Report* report) {
  for (ReportRow& d : report->rows) {
    if (d.method != "delta") continue;
    for (const ReportRow& f : report->rows) {
      if (f.method == "full" && f.source == d.source && f.transport == d.transport &&
          f.model == d.model && f.change_rate == d.change_rate &&
          f.configured_change_rate == d.configured_change_rate) {
        if (d.refit_seconds > 0) d.speedup = f.refit_seconds / d.refit_seconds;
        if (d.wire_bytes > 0) d.delta_ratio = f.wire_bytes / d.wire_bytes;
      }
    }
  }
}

namespace {

// The headline: the 1T 3% relay-tree refit against the paper's 150 s and our 75 s target.
void RenderHeadline(const Report& report, std::ostringstream& md) {
  for (const ReportRow& r : report.rows) {
    if (IsPaperHeadline(r) && r.method == "delta" && r.transport == "relay_tree") {
      md << "**1T, 3% change, relay tree (" << r.mode << "):** refit "
         << Fmt("%.1f", r.refit_seconds) << " s; the paper (NeMo-DCR) reports 150 s; our target "
         << "is <= 75 s: " << (r.refit_seconds <= 75.0 ? "**met**" : "**not met**") << " ("
         << Fmt("%.2fx", 150.0 / r.refit_seconds) << " faster than the paper's number, "
         << Fmt("%.2fx", r.refit_seconds / 75.0) << " of the target).\n\n";
    }
  }
}

// One line per (source, model, rate): delta and full time and the speedup, per transport.
void RenderSummary(const Report& report, std::ostringstream& md) {
  std::vector<std::string> transports;
  for (const ReportRow& r : report.rows) {
    if (std::find(transports.begin(), transports.end(), r.transport) == transports.end()) {
      transports.push_back(r.transport);
    }
  }
  md << "| model | change |";
  for (const std::string& t : transports) md << " " << t << " delta (s) | full (s) | speedup |";
  md << "\n|---|---|";
  for (size_t i = 0; i < transports.size(); ++i) md << "---|---|---|";
  md << "\n";
  std::set<std::string> done;
  for (const ReportRow& g : report.rows) {
    std::string key = g.source + "\n" + GroupLabel(g);
    if (!done.insert(key).second) continue;
    md << "| " << g.model << " | " << RateLabel(g) << " |";
    for (const std::string& t : transports) {
      const ReportRow* delta = nullptr;
      const ReportRow* full = nullptr;
      for (const ReportRow& r : report.rows) {
        if (r.source != g.source || GroupLabel(r) != GroupLabel(g) || r.transport != t) continue;
        (r.method == "delta" ? delta : full) = &r;
      }
      md << " " << (delta ? Fmt("%.1f", delta->refit_seconds) : "-") << " | "
         << (full ? Fmt("%.1f", full->refit_seconds) : "-") << " | "
         << (delta && delta->speedup > 0 ? Fmt("%.1fx", delta->speedup) : "-") << " |";
    }
    md << "\n";
  }
}

}  // namespace

namespace {

void RenderNodes(const Report& report, std::ostringstream& md) {
  md << "Nodes:\n\n| source | rank | role | ok | verified | seconds | received (MB) | sent (MB) | "
        "receivers committed | declared dead | error |\n";
  md << "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const NodeRow& n : report.nodes) {
    md << "| " << n.source << " | " << n.rank << " | " << n.role << " | " << (n.ok ? "yes" : "no")
       << " | " << (n.verified ? "yes" : "no") << " | " << Fmt("%.2f", n.seconds) << " | "
       << Fmt("%.2f", n.bytes_received / 1e6) << " | " << Fmt("%.2f", n.bytes_sent / 1e6) << " | "
       << n.receivers_committed << " | "
       << (n.declared_dead.empty() ? "-" : Cell(n.declared_dead, '|')) << " | "
       << (n.error.empty() ? "-" : Cell(n.error, '|')) << " |\n";
  }
}

}  // namespace

std::string RenderMarkdown(const Report& report) {
  std::ostringstream md;
  if (report.rows.empty() && !report.nodes.empty()) {  // node results only
    RenderNodes(report, md);
    return md.str();
  }
  RenderHeadline(report, md);
  RenderSummary(report, md);
  md << "\nAll runs:\n\n";
  md << "| model | change (measured) | trainer rate | transport | method | refit (s) | wire (GB) | "
        "receivers verified | speedup vs full | wire ratio | mode |\n";
  md << "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const ReportRow& r : report.rows) {
    md << "| " << r.model << " | " << Pct(r.change_rate) << " | "
       << (r.configured_change_rate > 0 ? Pct(r.configured_change_rate) : "-") << " | "
       << r.transport << " | " << r.method << " | " << Fmt("%.1f", r.refit_seconds) << " | "
       << Fmt("%.2f", r.wire_bytes / 1e9) << " | " << r.receivers_verified << "/" << r.receivers
       << " | " << (r.speedup > 0 ? Fmt("%.1fx", r.speedup) : "-") << " | "
       << (r.delta_ratio > 0 ? Fmt("%.1fx", r.delta_ratio) : "-") << " | " << r.mode << " |\n";
  }
  md << "\nSetup of each result:\n\n";
  for (const ResultSetup& s : report.setups) {
    md << "- `" << s.source << "` (" << s.scenario << "): " << s.text << "\n";
  }
  if (!report.nodes.empty()) {
    md << "\n";
    RenderNodes(report, md);
  }
  return md.str();
}

std::string RenderNodesCsv(const Report& report) {
  std::ostringstream csv;
  csv << "source,rank,role,ok,verified,seconds,bytes_received,bytes_sent,receivers_committed,"
         "declared_dead,error\n";
  for (const NodeRow& n : report.nodes) {
    csv << Cell(n.source, ',') << "," << n.rank << "," << n.role << "," << (n.ok ? 1 : 0) << ","
        << (n.verified ? 1 : 0) << "," << Fmt("%.6f", n.seconds) << ","
        << Fmt("%.0f", n.bytes_received) << "," << Fmt("%.0f", n.bytes_sent) << ","
        << n.receivers_committed << "," << Cell(n.declared_dead, ',') << "," << Cell(n.error, ',')
        << "\n";
  }
  return csv.str();
}

std::string RenderCsv(const Report& report) {
  std::ostringstream csv;
  csv << "source,scenario,mode,model,method,transport,change_rate,configured_change_rate,"
         "refit_seconds,wire_bytes,"
         "receivers,receivers_verified,speedup,delta_ratio\n";
  for (const ReportRow& r : report.rows) {
    csv << r.source << "," << r.scenario << "," << r.mode << "," << r.model << "," << r.method
        << "," << r.transport << "," << Fmt("%.6g", r.change_rate) << ","
        << Fmt("%.6g", r.configured_change_rate) << "," << Fmt("%.6f", r.refit_seconds) << ","
        << Fmt("%.0f", r.wire_bytes) << "," << r.receivers << "," << r.receivers_verified << ","
        << Fmt("%.4f", r.speedup) << "," << Fmt("%.4f", r.delta_ratio) << "\n";
  }
  return csv.str();
}

std::string RenderJson(const Report& report) {
  json rows = json::array();
  for (const ReportRow& r : report.rows) {
    rows.push_back({{"source", r.source},
                    {"scenario", r.scenario},
                    {"mode", r.mode},
                    {"model", r.model},
                    {"method", r.method},
                    {"transport", r.transport},
                    {"change_rate", r.change_rate},
                    {"configured_change_rate", r.configured_change_rate},
                    {"refit_seconds", r.refit_seconds},
                    {"wire_bytes", r.wire_bytes},
                    {"receivers", r.receivers},
                    {"receivers_verified", r.receivers_verified},
                    {"speedup", r.speedup},
                    {"delta_ratio", r.delta_ratio}});
  }
  json setups = json::array();
  for (const ResultSetup& s : report.setups) {
    setups.push_back({{"source", s.source}, {"scenario", s.scenario}, {"setup", s.text}});
  }
  json nodes = json::array();
  for (const NodeRow& n : report.nodes) {
    nodes.push_back({{"source", n.source},
                     {"rank", n.rank},
                     {"role", n.role},
                     {"ok", n.ok},
                     {"verified", n.verified},
                     {"seconds", n.seconds},
                     {"bytes_received", n.bytes_received},
                     {"bytes_sent", n.bytes_sent},
                     {"receivers_committed", n.receivers_committed},
                     {"declared_dead", n.declared_dead},
                     {"error", n.error}});
  }
  return json{{"rows", rows}, {"setups", setups}, {"nodes", nodes}}.dump(2) + "\n";
}

namespace {

// Groups (model + rate) in order of first appearance and the value of each series.
struct Table {
  std::vector<std::string> groups;
  std::vector<std::string> series;
  std::map<std::pair<std::string, std::string>, double> value;
};

std::string DatFile(const Table& t) {
  std::ostringstream dat;
  dat << "# group";
  for (const std::string& s : t.series) dat << "\t\"" << s << "\"";
  dat << "\n";
  for (const std::string& g : t.groups) {
    dat << "\"" << g << "\"";
    for (const std::string& s : t.series) {
      auto it = t.value.find({g, s});
      dat << "\t" << (it == t.value.end() ? std::string("NaN") : Fmt("%.6g", it->second));
    }
    dat << "\n";
  }
  return dat.str();
}

std::string Plot(const Table& t, const std::string& dat, const std::string& title,
                 const std::string& ylabel, bool logy, const std::string& extra) {
  std::ostringstream gp;
  gp << "set termoption noenhanced\nset style data histogram\nset style histogram cluster gap 1\n"
        "set style fill solid 0.8 border -1\nset boxwidth 0.9\nset key top left\n"
        "set xtics rotate by -35 scale 0\nset grid ytics\nset datafile missing 'NaN'\n"
        "set style textbox opaque noborder\n";
  gp << "set xrange [-0.6:" << static_cast<double>(t.groups.size()) - 0.4 << "]\n";
  gp << "set title '" << title << "'\n";
  gp << "set xlabel 'model, change rate'\n";
  gp << "set ylabel '" << ylabel << "'\n";
  if (logy) gp << "set logscale y\n";
  gp << extra;
  gp << "plot ";
  for (size_t i = 0; i < t.series.size(); ++i) {
    if (i) gp << ", ";
    gp << "'" << dat << "' using " << (i + 2) << (i == 0 ? ":xtic(1)" : "") << " title '"
       << t.series[i] << "'";
  }
  gp << "\n";
  return gp.str();
}

// Reference marks drawn over the groups they belong to (a clustered histogram puts group i at
// x = i): the paper's 150 s and our 75 s target over the 1T 3% group; over every 1T group, the
// 87.5 min full transfer that calibrates the simulated long link.
std::string ReferenceLines(const Report& report, const Table& times) {
  std::ostringstream gp;
  bool calibrated = false;
  for (const ReportRow& r : report.rows) calibrated |= r.mode == "sim";
  bool first_calibration = true;
  for (size_t i = 0; i < times.groups.size(); ++i) {
    const ReportRow* row = nullptr;
    for (const ReportRow& r : report.rows) {
      if (GroupLabel(r) == times.groups[i]) row = &r;
    }
    if (row == nullptr || !IsOneTrillion(*row)) continue;
    double x0 = static_cast<double>(i) - 0.5, x1 = static_cast<double>(i) + 0.5;
    auto line = [&](double y, const char* dash, const char* color, const std::string& text) {
      gp << "set arrow from " << x0 << ", first " << y << " to " << x1 << ", first " << y
         << " nohead lw 2 dt " << dash << " lc rgb '" << color << "' front\n";
      if (text.empty()) return;
      gp << "set label '" << text << "' at " << x0 << ", first " << y * 1.25 << " left tc rgb '"
         << color << "' front boxed font ',8'\n";
    };
    if (IsPaperHeadline(*row)) {
      line(150, "2", "red", "NeMo-DCR: 150 s");
      line(75, "3", "dark-green", "target: 75 s");
    }
    if (calibrated) {
      line(5250, "4", "gray30", first_calibration ? "87.5 min full (calibration input)" : "");
      first_calibration = false;
    }
  }
  return gp.str();
}

Status RunGnuplot(const std::string& gnuplot, const std::string& dir, const std::string& name,
                  const std::string& body) {
  for (const char* term : {"png", "svg"}) {
    std::string out = dir + "/" + name + "." + term;
    std::string tmp = out + ".tmp." + std::to_string(::getpid());
    std::string script = std::string("set terminal ") +
                         (std::string(term) == "png" ? "pngcairo size 1200,700 font ',10'"
                                                     : "svg size 1200,700 dynamic") +
                         "\nset output '" + tmp + "'\n" + body;
    std::string gp_path = dir + "/" + name + "." + term + ".gp";
    DCR_RETURN_IF_ERROR(WriteFileAtomic(gp_path, script));
    std::string cmd = gnuplot + " '" + gp_path + "' 2>&1";
    int rc = std::system(cmd.c_str());
    if (rc != 0) {
      std::remove(tmp.c_str());
      return UnavailableError("gnuplot failed (" + std::to_string(rc) + ") on " + gp_path);
    }
    if (std::rename(tmp.c_str(), out.c_str()) != 0) {
      return ErrnoError("cannot rename to '" + out + "'", errno);
    }
  }
  return Status::OK();
}

}  // namespace

Status WriteReport(const Report& report, const ReportOptions& options) {
  if (options.out_dir.empty()) return InvalidArgumentError("report: output directory is empty");
  DCR_RETURN_IF_ERROR(MakeDirs(options.out_dir));
  const std::string& dir = options.out_dir;
  DCR_RETURN_IF_ERROR(WriteFileAtomic(dir + "/summary.md", RenderMarkdown(report)));
  DCR_RETURN_IF_ERROR(WriteFileAtomic(dir + "/summary.csv", RenderCsv(report)));
  DCR_RETURN_IF_ERROR(WriteFileAtomic(dir + "/summary.json", RenderJson(report)));
  if (!report.nodes.empty()) {
    DCR_RETURN_IF_ERROR(WriteFileAtomic(dir + "/nodes.csv", RenderNodesCsv(report)));
  }
  if (!options.figures || report.rows.empty()) return Status::OK();

  Table times, speed;
  std::set<std::string> seen_groups;
  for (const ReportRow& r : report.rows) {
    std::string g = GroupLabel(r);
    if (seen_groups.insert(g).second) {
      times.groups.push_back(g);
      speed.groups.push_back(g);
    }
  }
  for (const char* tr : {"object_store", "relay_tree"}) {
    for (const char* m : {"full", "delta"}) {
      std::string s = SeriesKey(m, tr);
      bool any = false;
      for (const ReportRow& r : report.rows) any |= SeriesKey(r.method, r.transport) == s;
      if (any) times.series.push_back(s);
    }
    bool any = false;
    for (const ReportRow& r : report.rows) any |= r.transport == tr && r.speedup > 0;
    if (any) speed.series.push_back(tr);
  }
  for (const ReportRow& r : report.rows) {
    times.value[{GroupLabel(r), SeriesKey(r.method, r.transport)}] = r.refit_seconds;
    if (r.speedup > 0) speed.value[{GroupLabel(r), r.transport}] = r.speedup;
  }
  DCR_RETURN_IF_ERROR(WriteFileAtomic(dir + "/refit_time.dat", DatFile(times)));
  DCR_RETURN_IF_ERROR(
      RunGnuplot(options.gnuplot, dir, "refit_time",
                 Plot(times, dir + "/refit_time.dat",
                      "Refit time, delta against the full checkpoint (" + ModeWords(report.rows) +
                          ReceiversWords(report.rows) + ")",
                      "refit time (s, log scale)", true, ReferenceLines(report, times))));
  if (!speed.series.empty()) {
    DCR_RETURN_IF_ERROR(WriteFileAtomic(dir + "/speedup.dat", DatFile(speed)));
    DCR_RETURN_IF_ERROR(
        RunGnuplot(options.gnuplot, dir, "speedup",
                   Plot(speed, dir + "/speedup.dat",
                        "Speedup of the delta over the full checkpoint on the "
                        "same transport (" +
                            ModeWords(report.rows) + ")",
                        "full time / delta time (x)", false, "set yrange [0:*]\n")));
  }
  return Status::OK();
}

}  // namespace dcr::reports
