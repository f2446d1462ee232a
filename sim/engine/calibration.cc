#include "calibration.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dcr/status_macros.h"

namespace dcr::sim::internal {
namespace {

double Interp(const std::vector<RatePoint>& pts, double rate, double RatePoint::*field) {
  if (pts.empty()) return 0;
  if (rate <= pts.front().change_rate) return pts.front().*field;
  if (rate >= pts.back().change_rate) return pts.back().*field;
  for (size_t i = 1; i < pts.size(); ++i) {
    if (rate <= pts[i].change_rate) {
      const RatePoint& a = pts[i - 1];
      const RatePoint& b = pts[i];
      double t = (rate - a.change_rate) / (b.change_rate - a.change_rate);
      return a.*field + t * (b.*field - a.*field);
    }
  }
  return pts.back().*field;
}

StatusOr<double> PositiveNumber(const nlohmann::json& obj, const std::string& key,
                                const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return InvalidArgumentError(where + ": missing key '" + key + "'");
  if (!it->is_number() || !(it->get<double>() > 0)) {
    return InvalidArgumentError(where + ": key '" + key + "' must be a positive number");
  }
  return it->get<double>();
}

// A calibration block given inline (a JSON object) or as the name of a JSON file (relative to the
// calibration file's directory). `where` gets the file's name appended; `from` is set to the file
// the block came from.
StatusOr<nlohmann::json> InlineOrFile(const nlohmann::json& block, const std::string& source,
                                      std::string* where, std::string* from) {
  if (!block.is_string()) {
    *from = source;
    return block;
  }
  std::string path = block.get<std::string>();
  if (path.empty() || path[0] != '/') {
    size_t slash = source.rfind('/');
    path = (slash == std::string::npos ? std::string() : source.substr(0, slash + 1)) + path;
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFoundError(*where + ": file '" + path + "' cannot be read");
  std::stringstream ss;
  ss << f.rdbuf();
  *where += " (" + path + ")";
  *from = path;
  return nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
}

double InterpCommit(const std::vector<CommitPoint>& pts, double rate, double CommitPoint::*field) {
  std::vector<RatePoint> as_rates;
  for (const CommitPoint& c : pts) {
    RatePoint p;
    p.change_rate = c.change_rate;
    p.encode_bytes_per_s = c.*field;
    as_rates.push_back(p);
  }
  return Interp(as_rates, rate, &RatePoint::encode_bytes_per_s);
}

// The commit points of `rates` (entries with commit_s_per_storage_byte; all of them or none).
StatusOr<std::vector<CommitPoint>> ParseCommitRates(const nlohmann::json& rates,
                                                    const std::string& where) {
  std::vector<CommitPoint> out;
  if (!rates.is_array()) return InvalidArgumentError(where + ": missing array 'rates'");
  for (size_t i = 0; i < rates.size(); ++i) {
    const nlohmann::json& e = rates[i];
    const std::string at = where + ": rates[" + std::to_string(i) + "]";
    const bool has = e.is_object() && e.contains("commit_s_per_storage_byte");
    if (i > 0 && has != !out.empty()) {
      return InvalidArgumentError(at + ": commit_* keys must be given for every rate or none");
    }
    if (!has) continue;
    CommitPoint c;
    const char* rate_key = e.contains("change_rate") ? "change_rate" : "rate";
    if (!e.contains(rate_key) || !e[rate_key].is_number()) {
      return InvalidArgumentError(at + ": missing key 'change_rate'");
    }
    c.change_rate = e[rate_key].get<double>();
    if (c.change_rate > 1.0) c.change_rate /= 100.0;
    DCR_ASSIGN_OR_RETURN(c.s_per_storage_byte, PositiveNumber(e, "commit_s_per_storage_byte", at));
    if (e.contains("plain_write_bytes_per_s") && e["plain_write_bytes_per_s"].is_number()) {
      c.plain_write_bytes_per_s = e["plain_write_bytes_per_s"].get<double>();
    }
    if (e.contains("durable_apply_cpu_s_per_storage_byte")) {
      const nlohmann::json& v = e["durable_apply_cpu_s_per_storage_byte"];
      if (!v.is_number() || !(v.get<double>() >= 0)) {
        return InvalidArgumentError(at +
                                    ": key 'durable_apply_cpu_s_per_storage_byte' must be a "
                                    "number >= 0");
      }
      c.apply_cpu_s_per_storage_byte = v.get<double>();
    }
    out.push_back(c);
  }
  std::sort(out.begin(), out.end(), [](const CommitPoint& a, const CommitPoint& b) {
    return a.change_rate < b.change_rate;
  });
  return out;
}

}  // namespace

double Calibration::CommitSPerStorageByte(double rate) const {
  return InterpCommit(commit, rate, &CommitPoint::s_per_storage_byte);
}
double Calibration::PlainWriteBytesPerS(double rate) const {
  return InterpCommit(commit, rate, &CommitPoint::plain_write_bytes_per_s);
}

double Calibration::DurableApplyCpuSPerStorageByte(double rate) const {
  return InterpCommit(commit, rate, &CommitPoint::apply_cpu_s_per_storage_byte);
}

void Calibration::UseWallClock() {
  if (memcpy_wall_bytes_per_s > 0) memcpy_bytes_per_s = memcpy_wall_bytes_per_s;
  if (commitment_wall_bytes_per_s > 0) commitment_bytes_per_s = commitment_wall_bytes_per_s;
  for (RatePoint& p : rates) {
    if (p.encode_wall_bytes_per_s > 0) p.encode_bytes_per_s = p.encode_wall_bytes_per_s;
    if (p.decode_apply_wall_bytes_per_s > 0) {
      p.decode_apply_bytes_per_s = p.decode_apply_wall_bytes_per_s;
    }
  }
}

double Calibration::EncodeBytesPerS(double rate) const {
  return Interp(rates, rate, &RatePoint::encode_bytes_per_s);
}
double Calibration::DecodeApplyBytesPerS(double rate) const {
  return Interp(rates, rate, &RatePoint::decode_apply_bytes_per_s);
}

double Calibration::ContextEncodeBytesPerS(double rate) const {
  return Interp(rates, rate, &RatePoint::context_encode_bytes_per_s);
}
double Calibration::ContextTranscodeBytesPerS(double rate) const {
  return Interp(rates, rate, &RatePoint::context_transcode_bytes_per_s);
}

StatusOr<Calibration> ParseCalibration(const std::string& json_text, const std::string& source) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError("calibration " + source + ": not a JSON object");
  }
  Calibration c;
  c.source = source;
  c.raw = json_text;
  DCR_ASSIGN_OR_RETURN(c.memcpy_bytes_per_s,
                       PositiveNumber(j, "memcpy_bytes_per_s", "calibration " + source));
  if (j.contains("memcpy_wall_bytes_per_s") && j["memcpy_wall_bytes_per_s"].is_number()) {
    c.memcpy_wall_bytes_per_s = j["memcpy_wall_bytes_per_s"].get<double>();
  }
  if (j.contains("available_cores") && j["available_cores"].is_number()) {
    c.available_cores = j["available_cores"].get<double>();
  }
  for (auto [key, field] : {std::pair{"commitment_bytes_per_s", &c.commitment_bytes_per_s},
                            {"commitment_wall_bytes_per_s", &c.commitment_wall_bytes_per_s},
                            {"verify_bytes_per_s", &c.verify_bytes_per_s}}) {
    if (!j.contains(key)) continue;
    DCR_ASSIGN_OR_RETURN(*field, PositiveNumber(j, key, "calibration " + source));
  }
  if (j.contains("context_classes")) {
    const nlohmann::json& k = j["context_classes"];
    if (!k.is_number_integer() || k.get<int64_t>() < 1 || k.get<int64_t>() > kContextClassesMax) {
      return InvalidArgumentError("calibration " + source +
                                  ": context_classes must be an integer 1.." +
                                  std::to_string(kContextClassesMax));
    }
    c.context_classes = k.get<int>();
  }
  const nlohmann::json* arr = nullptr;
  for (const char* key : {"rates", "results"}) {
    if (j.contains(key) && j[key].is_array()) arr = &j[key];
  }
  if (arr == nullptr || arr->empty()) {
    return InvalidArgumentError("calibration " + source + ": missing array 'rates'");
  }
  for (size_t i = 0; i < arr->size(); ++i) {
    const nlohmann::json& e = (*arr)[i];
    std::string where = "calibration " + source + ": rates[" + std::to_string(i) + "]";
    if (!e.is_object()) return InvalidArgumentError(where + ": not an object");
    RatePoint p;
    const char* rate_key = e.contains("change_rate") ? "change_rate" : "rate";
    if (!e.contains(rate_key) || !e[rate_key].is_number()) {
      return InvalidArgumentError(where + ": missing key 'change_rate'");
    }
    p.change_rate = e[rate_key].get<double>();
    if (p.change_rate > 1.0) p.change_rate /= 100.0;  // given in percent
    DCR_ASSIGN_OR_RETURN(p.encode_bytes_per_s, PositiveNumber(e, "encode_bytes_per_s", where));
    DCR_ASSIGN_OR_RETURN(p.decode_apply_bytes_per_s,
                         PositiveNumber(e, "decode_apply_bytes_per_s", where));
    auto opt = [&e](const char* key) {
      return e.contains(key) && e[key].is_number() ? e[key].get<double>() : 0.0;
    };
    p.encode_wall_bytes_per_s = opt("encode_wall_bytes_per_s");
    p.decode_apply_wall_bytes_per_s = opt("decode_apply_wall_bytes_per_s");
    const bool context = e.contains("context_encode_bytes_per_s");
    if (i == 0) c.has_context = context;
    if (context != c.has_context) {
      return InvalidArgumentError(where + ": context_* keys must be given for every rate or none");
    }
    if (context) {
      DCR_ASSIGN_OR_RETURN(p.context_encode_bytes_per_s,
                           PositiveNumber(e, "context_encode_bytes_per_s", where));
      DCR_ASSIGN_OR_RETURN(p.context_decode_apply_bytes_per_s,
                           PositiveNumber(e, "context_decode_apply_bytes_per_s", where));
      p.context_transcode_bytes_per_s = opt("context_transcode_bytes_per_s");
      if (!(p.context_transcode_bytes_per_s > 0)) {
        p.context_transcode_bytes_per_s =
            1 / (1 / p.context_decode_apply_bytes_per_s + 1 / p.encode_bytes_per_s);
      }
    }
    c.rates.push_back(p);
  }
  if (j.contains("tls")) {
    std::string where = "calibration " + source + ": tls";
    DCR_ASSIGN_OR_RETURN(nlohmann::json t, InlineOrFile(j["tls"], source, &where, &c.tls_source));
    if (!t.is_object() || !t.contains("tls_cpu_s_per_byte") ||
        !t["tls_cpu_s_per_byte"].is_object()) {
      return InvalidArgumentError(where +
                                  ": must be the JSON of dcr_bench_tls --json, with "
                                  "'tls_cpu_s_per_byte': {send, recv}");
    }
    const nlohmann::json& per = t["tls_cpu_s_per_byte"];
    for (const char* key : {"send", "recv"}) {
      if (!per.contains(key) || !per[key].is_number() || !(per[key].get<double>() >= 0)) {
        return InvalidArgumentError(where + ".tls_cpu_s_per_byte: key '" + key +
                                    "' must be a number >= 0");
      }
    }
    c.has_tls = true;
    c.tls_send_s_per_byte = per["send"].get<double>();
    c.tls_recv_s_per_byte = per["recv"].get<double>();
    // The plain TCP transfer of the same run: what each end pays without TLS.
    if (t.contains("plain") && t["plain"].is_object() && t.contains("bytes") &&
        t["bytes"].is_number() && t["bytes"].get<double>() > 0) {
      const nlohmann::json& plain = t["plain"];
      const double bytes = t["bytes"].get<double>();
      for (auto [key, field] : {std::pair{"send_cpu_s", &c.tcp_send_s_per_byte},
                                {"recv_cpu_s", &c.tcp_recv_s_per_byte}}) {
        if (!plain.contains(key) || !plain[key].is_number() || plain[key].get<double>() < 0) {
          return InvalidArgumentError(where + ".plain: key '" + key + "' must be a number >= 0");
        }
        *field = plain[key].get<double>() / bytes;
      }
    }
  }
  if (j.contains("signing")) {
    std::string where = "calibration " + source + ": signing";
    DCR_ASSIGN_OR_RETURN(nlohmann::json t,
                         InlineOrFile(j["signing"], source, &where, &c.signing_source));
    if (!t.is_object()) {
      return InvalidArgumentError(where + ": must be the JSON of dcr_bench_sign --json");
    }
    DCR_ASSIGN_OR_RETURN(double sha, PositiveNumber(t, "sha256_bytes_per_s", where));
    DCR_ASSIGN_OR_RETURN(double signs, PositiveNumber(t, "ed25519_signs_per_s", where));
    DCR_ASSIGN_OR_RETURN(double verifies, PositiveNumber(t, "ed25519_verifies_per_s", where));
    c.has_signing = true;
    c.sha256_s_per_byte = 1 / sha;
    c.sign_s_per_manifest = 1 / signs;
    c.verify_s_per_manifest = 1 / verifies;
    if (t.contains("chunks") && t.contains("manifests") && t["chunks"].is_number() &&
        t["manifests"].is_number() && t["manifests"].get<double>() > 0) {
      c.chunks_per_manifest = t["chunks"].get<double>() / t["manifests"].get<double>();
    }
    if (t.contains("delta_bytes") && t.contains("signed_delta_bytes") &&
        t["delta_bytes"].is_number() && t["signed_delta_bytes"].is_number() &&
        t["delta_bytes"].get<double>() > 0) {
      c.signed_size_ratio = t["signed_delta_bytes"].get<double>() / t["delta_bytes"].get<double>();
    }
  }
  if (j.contains("durability")) {
    std::string where = "calibration " + source + ": durability";
    DCR_ASSIGN_OR_RETURN(nlohmann::json t,
                         InlineOrFile(j["durability"], source, &where, &c.commit_source));
    if (!t.is_object() || !t.contains("rates")) {
      return InvalidArgumentError(where +
                                  ": must be the JSON of dcr bench pipeline --json, "
                                  "with 'rates'");
    }
    DCR_ASSIGN_OR_RETURN(c.commit, ParseCommitRates(t["rates"], where));
    if (c.commit.empty()) {
      return InvalidArgumentError(where + ": no rate has 'commit_s_per_storage_byte'");
    }
  } else {
    DCR_ASSIGN_OR_RETURN(c.commit, ParseCommitRates(*arr, "calibration " + source));
    c.commit_source = source;
  }
  std::sort(c.rates.begin(), c.rates.end(),
            [](const RatePoint& a, const RatePoint& b) { return a.change_rate < b.change_rate; });
  return c;
}

StatusOr<Calibration> LoadCalibration(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("calibration file '" + path + "' cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseCalibration(ss.str(), path);
}

}  // namespace dcr::sim::internal
