#include "dcr/retention.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "dcr/delta.h"
#include "dcr/manifest.h"
#include "dcr/relay_policy.h"
#include "dcr/status_macros.h"

namespace dcr {

namespace {

constexpr const char* kTombstone = "gc-removing";

// The objects of one version prefix.
struct Group {
  RetainedVersion v;
  std::vector<ObjectInfo> header, chunks, trailer, other;
  bool tombstoned = false;
  bool header_ok = false;
  bool signed_header = false;
  std::string manifest_key;  // its final manifest (signed_ok)
  std::string unsigned_why;  // why it does not count (with a trust key)
};

// Most chunk blobs read, from the last one back, to find a version's last manifest record.
constexpr int kManifestSearch = 4096;

// The version prefix of `key` when it names a blob ("P/<10 digits>.<kind>"), else "".
std::string BlobPrefix(const std::string& key) {
  const size_t slash = key.rfind('/');
  if (slash == std::string::npos || slash == 0) return "";
  const std::string p = key.substr(0, slash);
  return ParseObjectKey(p, key).ok() ? p : "";
}

// The prefix of a tombstone key ("P/gc-removing"), else "".
std::string TombstonePrefix(const std::string& key) {
  const size_t slash = key.rfind('/');
  if (slash == std::string::npos || slash == 0) return "";
  return key.compare(slash + 1, std::string::npos, kTombstone) == 0 ? key.substr(0, slash) : "";
}

// The longest prefix of `prefixes` that `key` lies under ("P/..."), or null.
const std::string* Owner(const std::set<std::string>& prefixes, const std::string& key) {
  size_t slash = key.rfind('/');
  while (slash != std::string::npos && slash > 0) {
    auto it = prefixes.find(key.substr(0, slash));
    if (it != prefixes.end()) return &*it;
    slash = key.rfind('/', slash - 1);
  }
  return nullptr;
}

std::string V(uint64_t n) { return "v" + std::to_string(n); }

class Collector {
 public:
  Collector(ObjectStore* store, const RetentionOptions& o, RetentionReport* r)
      : store_(store), o_(o), r_(r) {}

  Status Run() {
    DCR_RETURN_IF_ERROR(Scan());
    Decide();
    if (o_.dry_run) return BudgetStatus();
    // Interrupted removals first, then the rest oldest first (the order of `groups_`).
    for (int pass = 0; pass < 2; ++pass) {
      for (Group& g : groups_) {
        if (g.v.decision != "removed" || g.tombstoned != (pass == 0)) continue;
        DCR_RETURN_IF_ERROR(Remove(&g));
      }
    }
    return BudgetStatus();
  }

 private:
  Status Scan() {
    const std::string main = o_.root.empty() ? "" : o_.root + "/";
    DCR_ASSIGN_OR_RETURN(std::vector<ObjectInfo> listed, store_->List(main));
    DCR_ASSIGN_OR_RETURN(std::vector<ObjectInfo> ow, store_->List("ow/" + main));
    std::set<std::string> prefixes;
    for (const ObjectInfo& o : listed) {
      if (o_.root.empty() && o.key.compare(0, 3, "ow/") == 0) continue;  // the second listing's
      std::string p = BlobPrefix(o.key);
      if (p.empty()) p = TombstonePrefix(o.key);
      if (!p.empty()) prefixes.insert(p);
    }
    std::map<std::string, Group> by_prefix;
    // `path`: the key, or an overwrite form's key without "ow/" (`blob_key` false).
    auto place = [&](const ObjectInfo& o, const std::string& path, bool blob_key) {
      r_->bytes_before += o.size;
      const std::string* p = Owner(prefixes, path);
      if (p == nullptr) {
        r_->other_bytes += o.size;
        return;
      }
      Group& g = by_prefix[*p];
      g.v.prefix = *p;
      ++g.v.objects;
      g.v.bytes += o.size;
      auto blob = ParseObjectKey(*p, o.key);
      if (!blob_key || !blob.ok()) {
        if (o.key == *p + "/" + kTombstone) g.tombstoned = true;
        g.other.push_back(o);
      } else if (blob->kind == BlobKind::kHeader) {
        g.header.push_back(o);
      } else if (blob->kind == BlobKind::kTrailer) {
        g.trailer.push_back(o);
      } else {
        g.chunks.push_back(o);
      }
    };
    for (const ObjectInfo& o : listed) {
      if (o_.root.empty() && o.key.compare(0, 3, "ow/") == 0) continue;
      place(o, o.key, true);
    }
    for (const ObjectInfo& o : ow) {
      place(o, o.key.substr(3), false);
    }
    for (auto& [p, g] : by_prefix) {
      g.v.complete = !g.trailer.empty();
      if (!g.header.empty()) {
        auto bytes = store_->Get(g.header.front().key);
        if (!bytes.ok() && !bytes.status().IsNotFound()) return bytes.status();
        if (bytes.ok()) {
          size_t used = 0;
          auto h = ParseFileHeader(bytes->data(), bytes->size(), &used);
          if (h.ok()) {
            g.header_ok = true;
            g.signed_header = (h->flags & kFlagSigned) != 0;
            g.v.full_frame = (h->flags & kFlagNoBase) != 0;
            g.v.base = g.v.full_frame ? 0 : h->base_version;
            g.v.target = h->target_version;
            if (o_.trust) DCR_RETURN_IF_ERROR(CheckSigned(*bytes, &g));
          }
        }
      }
      g.v.tombstone = g.tombstoned;
      if (o_.trust && !g.v.signed_ok && g.unsigned_why.empty()) {
        g.unsigned_why = g.header.empty() ? "no header" : "no readable header";
      }
      if (!o_.trust && g.signed_header) {
        return FailedPreconditionError(
            "the store holds signed versions (" + g.v.prefix +
            "): give the trainer's public key (dcr gc --trust KEY), so that only versions it "
            "signed count; nothing was deleted");
      }
      groups_.push_back(std::move(g));
    }
    std::sort(groups_.begin(), groups_.end(), [](const Group& a, const Group& b) {
      return a.v.target != b.v.target ? a.v.target < b.v.target : a.v.prefix < b.v.prefix;
    });
    return Status();
  }

  // With a trust key: whether group `g` (its header `header` parsed) is a version the trainer
  // signed: a signed header and, as the last manifest record among its chunk blobs, a final
  // manifest that verifies for that header (signer, signature, deployment, versions). Sets
  // g->v.signed_ok and g->manifest_key, else g->unsigned_why. Errors: the store's.
  Status CheckSigned(const std::vector<uint8_t>& header, Group* g) {
    if (!g->signed_header) {
      g->unsigned_why = "its header is not signed";
      return Status();
    }
    StreamVerifier verifier(o_.trust, o_.run_id);
    Status begun = verifier.Begin(header.data(), header.size());
    if (!begun.ok()) {
      g->unsigned_why = begun.message();
      return Status();
    }
    std::vector<ObjectInfo> chunks = g->chunks;
    std::sort(chunks.begin(), chunks.end(),
              [](const ObjectInfo& a, const ObjectInfo& b) { return a.key > b.key; });
    int searched = 0;
    for (const ObjectInfo& c : chunks) {
      if (++searched > kManifestSearch) break;
      auto magic = store_->GetRange(c.key, 0, 4);
      if (!magic.ok()) {
        if (magic.status().IsNotFound()) continue;
        return magic.status();
      }
      if (!IsManifestRecord(magic->data(), magic->size())) continue;
      auto rec = store_->Get(c.key);
      if (!rec.ok()) {
        if (rec.status().IsNotFound()) continue;
        return rec.status();
      }
      size_t used = 0;
      auto m = ParseManifest(rec->data(), rec->size(), &used);
      if (!m.ok()) {
        g->unsigned_why = "its last manifest " + c.key + ": " + m.status().message();
        return Status();
      }
      if (!m->final) {
        g->unsigned_why =
            "its last manifest is not the final one (the trainer has not finished it)";
        return Status();
      }
      std::vector<uint64_t> listed;
      Status ok = verifier.AddManifest(rec->data(), rec->size(), &listed);
      if (!ok.ok()) {
        g->unsigned_why = ok.message();
        return Status();
      }
      g->v.signed_ok = true;
      g->manifest_key = c.key;
      return Status();
    }
    g->unsigned_why = "no final manifest signed by the trainer";
    return Status();
  }

  // Whether group `g` counts: with a trust key only a signed one does.
  bool Counts(const Group& g) const { return !o_.trust || g.v.signed_ok; }

  void Decide() {
    std::optional<uint64_t> b = o_.committed;
    if (!b) {
      for (const Group& g : groups_) {
        if (g.header_ok && g.v.complete && Counts(g) && (o_.trust || !g.tombstoned)) {
          b = std::max(b.value_or(0), g.v.target);
        }
      }
    }
    r_->committed = b;
    bool frame_of_b = false;
    std::set<uint64_t, std::greater<uint64_t>> targets;  // complete versions at or below B
    for (const Group& g : groups_) {
      if (!g.header_ok || !Counts(g) || (!o_.trust && g.tombstoned) || !b) continue;
      if (g.v.target == *b && g.v.full_frame && g.v.complete) frame_of_b = true;
      if (g.v.target <= *b && g.v.complete) targets.insert(g.v.target);
    }
    std::set<uint64_t> keep;
    for (uint64_t t : targets) {
      if (static_cast<int>(keep.size()) >= o_.keep_versions) break;
      keep.insert(t);
    }
    for (Group& g : groups_) {
      RetainedVersion& v = g.v;
      if (!Counts(g)) {
        Set(&v, "unsigned",
            "not a version the trainer signed (" + g.unsigned_why + ")" +
                (g.tombstoned ? "; its gc-removing tombstone is ignored" : "") +
                ": left alone, never counted");
      } else if (g.tombstoned && !o_.trust) {
        Set(&v, "removed", "an interrupted removal, finished");
      } else if (!g.header_ok) {
        Set(&v, "unknown", "no readable header: left alone");
      } else if (!b) {
        Set(&v, "needed", "no version is complete yet: in flight");
      } else if (v.target > *b) {
        Set(&v, "needed", "in flight (newer than the committed " + V(*b) + ")");
      } else if (v.target == *b) {
        Set(&v, "needed", "the committed version " + V(*b));
      } else if (o_.oldest_held && v.target > *o_.oldest_held && !frame_of_b) {
        Set(&v, "needed", "on the catch-up chain from " + V(*o_.oldest_held) + " to " + V(*b));
      } else if (!v.complete) {
        Set(&v, "removed", "an incomplete publish older than the committed " + V(*b));
      } else if (keep.count(v.target) != 0) {
        Set(&v, "kept", "among the newest " + std::to_string(o_.keep_versions) + " versions");
      } else {
        Set(&v, "removed",
            "older than the newest " + std::to_string(o_.keep_versions) + " versions");
      }
    }
    for (Group& g : groups_) {
      if (o_.trust && g.tombstoned && g.v.decision == "removed") {
        g.v.why = "an interrupted removal, finished (" + g.v.why + ")";
      } else if (o_.trust && g.tombstoned && g.v.decision != "unsigned") {
        g.v.why += " (its gc-removing tombstone is unsigned: ignored)";
      }
      if (g.v.decision == "unsigned") r_->unsigned_bytes += g.v.bytes;
    }
    uint64_t after = r_->bytes_before;
    for (const Group& g : groups_) {
      if (g.v.decision == "removed") after -= g.v.bytes;
      if (g.v.decision == "needed" || g.v.decision == "unknown" || g.v.decision == "unsigned") {
        r_->needed_bytes += g.v.bytes;
      }
    }
    if (o_.budget_bytes > 0) {
      for (Group& g : groups_) {  // oldest first
        if (after <= o_.budget_bytes) break;
        if (g.v.decision != "kept") continue;
        Set(&g.v, "removed", "over the budget of " + std::to_string(o_.budget_bytes) + " bytes");
        after -= g.v.bytes;
      }
      if (after > o_.budget_bytes) {
        r_->budget_error = "budget of " + std::to_string(o_.budget_bytes) +
                           " bytes cannot be met: " + std::to_string(after) +
                           " bytes remain, of which " + std::to_string(r_->needed_bytes) +
                           " are needed (in flight, the committed version, catch-up) and " +
                           std::to_string(r_->other_bytes) + " belong to no version";
      }
    }
    r_->bytes_after = after;
    for (const Group& g : groups_) r_->versions.push_back(g.v);
  }

  static void Set(RetainedVersion* v, const char* decision, const std::string& why) {
    v->decision = decision;
    v->why = why;
  }

  Status Delete(const ObjectInfo& o) {
    DCR_RETURN_IF_ERROR(store_->Delete(o.key));
    ++r_->removed_objects;
    r_->removed_bytes += o.size;
    ++deletes_;
    if (o_.after_delete) o_.after_delete(deletes_);
    return Status();
  }

  // Removes one version object in the crash-safe order (see the header).
  Status Remove(Group* g) {
    const std::string tomb = g->v.prefix + "/" + kTombstone;
    if (!g->tombstoned) {
      const std::string note = "removing version " + std::to_string(g->v.target) + "\n";
      DCR_RETURN_IF_ERROR(store_->Put(tomb, note.data(), note.size()));
    }
    for (const ObjectInfo& o : g->trailer) DCR_RETURN_IF_ERROR(Delete(o));
    // The final manifest goes with the header, last: until then the object stays one the
    // trainer signed, which the next collection finishes.
    const ObjectInfo* manifest = nullptr;
    for (auto it = g->chunks.rbegin(); it != g->chunks.rend(); ++it) {
      if (it->key == g->manifest_key) {
        manifest = &*it;
        continue;
      }
      DCR_RETURN_IF_ERROR(Delete(*it));
    }
    for (const ObjectInfo& o : g->other) {
      if (o.key != tomb) DCR_RETURN_IF_ERROR(Delete(o));
    }
    if (manifest != nullptr) DCR_RETURN_IF_ERROR(Delete(*manifest));
    for (const ObjectInfo& o : g->header) DCR_RETURN_IF_ERROR(Delete(o));
    return store_->Delete(tomb);
  }

  Status BudgetStatus() const {
    if (r_->budget_error.empty()) return Status();
    return ResourceExhaustedError(r_->budget_error);
  }

  ObjectStore* store_;
  const RetentionOptions& o_;
  RetentionReport* r_;
  std::vector<Group> groups_;
  int64_t deletes_ = 0;
};

}  // namespace

Status CollectStore(ObjectStore* store, const RetentionOptions& options, RetentionReport* report) {
  *report = RetentionReport();
  if (options.keep_versions < 0) {
    return InvalidArgumentError("retention: keep_versions must be >= 0");
  }
  Collector c(store, options, report);
  return c.Run();
}

std::string RetentionReportToJson(const RetentionReport& r) {
  nlohmann::ordered_json j;
  j["committed"] = r.committed ? nlohmann::ordered_json(*r.committed) : nlohmann::ordered_json();
  j["bytes_before"] = r.bytes_before;
  j["bytes_after"] = r.bytes_after;
  j["needed_bytes"] = r.needed_bytes;
  j["other_bytes"] = r.other_bytes;
  j["unsigned_bytes"] = r.unsigned_bytes;
  j["removed_objects"] = r.removed_objects;
  j["removed_bytes"] = r.removed_bytes;
  j["budget_error"] = r.budget_error;
  j["versions"] = nlohmann::ordered_json::array();
  for (const RetainedVersion& v : r.versions) {
    j["versions"].push_back({{"prefix", v.prefix},
                             {"base", v.base},
                             {"target", v.target},
                             {"full_frame", v.full_frame},
                             {"complete", v.complete},
                             {"signed", v.signed_ok},
                             {"tombstone", v.tombstone},
                             {"objects", v.objects},
                             {"bytes", v.bytes},
                             {"decision", v.decision},
                             {"why", v.why}});
  }
  return j.dump(2);
}

}  // namespace dcr
