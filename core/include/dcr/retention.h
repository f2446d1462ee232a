// Retention and garbage collection of an object store's versions within a disk budget.
//
// A store that long-lived runs publish to holds, per version, one prefix P of blobs
// ("P/<10 digits>.hdr|chk|trl", relay_policy.h's ObjectKey) together with what belongs to it:
// the commit reports a recovering receiver leaves ("P/reports/<rank>"), the overwrite forms of
// its chunks ("ow/P/<chunk>") and anything else under "P/". A prefix is one *version object*: a
// delta from version b to version t, a full frame of version t (kFlagNoBase), or a composed
// catch-up delta from b to t; its header blob names b and t. CollectStore scans the prefixes
// under a root, decides for each whether it is needed, kept or removed, and deletes the removed
// ones.
//
// What is needed (never removed, whatever the budget):
//   * every version object whose target is newer than the newest committed version B (a version
//     in flight: its receivers recover from it);
//   * every version object whose target is B (its delta, its full frame, catch-up deltas to it:
//     what a restarted, late or returning receiver of B fetches);
//   * every delta on the chain from the oldest version a live receiver holds (`oldest_held`) up
//     to B (targets in (oldest_held, B]), unless the store holds a full frame of B (a catch-up
//     then needs only that frame).
// Kept while the budget allows: the newest `keep_versions` versions at or below B. Removed: the
// rest, oldest first, then kept ones (oldest first) while the store is over `budget_bytes`.
// When what is needed alone exceeds the budget, nothing needed is removed and CollectStore
// returns kResourceExhausted naming the needed bytes and the budget (after removing what it may).
// Objects under the root that belong to no version object (no blob keys) are left alone and
// counted as `other_bytes`; a prefix whose header is missing or unreadable is left alone too.
//
// Only what the trainer signed counts (RetentionOptions::trust): whoever can put objects in a
// store must not thereby delete them. With the trainer's public key, a version object is counted
// (committed, kept, needed or removed) only when its header is signed and the last manifest
// record among its chunk blobs is a final manifest that verifies against the key (and names the
// deployment, RetentionOptions::run_id): the trainer finished building that version. Anything
// else (an unsigned or foreign header, fake versions, a prefix of a lone tombstone) is
// "unsigned": never removed, never the committed version, named in the report. A store that
// holds signed versions is refused without the key (kFailedPrecondition), before anything is
// deleted. Without a key and without signed versions, every readable header counts.
//
// Crash safety: a version object is removed in an order that keeps the store consistent at
// every instant. First a tombstone "P/gc-removing" (naming the version) is put, then the trailer
// is deleted (so the prefix no longer looks complete to any reader), then the chunks, reports,
// overwrite forms and other objects, the final manifest, the header, and the tombstone last. A
// tombstone is unsigned, so it decides nothing with a key: an interrupted removal still has its
// header and final manifest, so the next collection decides it again by the rules above (an
// incomplete publish older than the committed version is removed) and finishes it. Without a
// key, a prefix with a tombstone is being removed: a later CollectStore finishes it first.
//
// Thread safety: CollectStore is self-contained; two concurrent collections of one store are
// safe (deletes of absent keys succeed) but may report the same objects.
#ifndef DCR_CORE_INCLUDE_DCR_RETENTION_H_
#define DCR_CORE_INCLUDE_DCR_RETENTION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dcr/object_store.h"
#include "dcr/signing.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

struct RetentionOptions {
  // Keys scanned: those under this root ("" = the whole store; else "<root>/..." and
  // "ow/<root>/..."). Default "".
  std::string root;
  // Most bytes the scanned objects may take (0 = no budget). Default 0.
  uint64_t budget_bytes = 0;
  // Versions at or below the committed one to keep while the budget allows (0 = only what is
  // needed). Default 2.
  int keep_versions = 2;
  // The newest committed version (the joint commit's baseline). Unset: the newest target of a
  // complete version object (one with its trailer). Default unset.
  std::optional<uint64_t> committed;
  // The oldest version a live receiver holds (it catches up from there). Unset: every live
  // receiver holds the committed version. Default unset.
  std::optional<uint64_t> oldest_held;
  // The trainer's public key: only versions it signed count (see above). Default null (a store
  // of unsigned versions; one with signed versions is refused).
  std::shared_ptr<const TrustKey> trust;
  // With `trust`: the final manifests must name this deployment (Manifest::run_id). Default
  // unset (any).
  std::optional<uint64_t> run_id;
  // Decide and report, delete nothing. Default false.
  bool dry_run = false;
  // Called after each object the collection deleted, with the number deleted so far (a test
  // tool's fault point: `dcr gc --fault-kill-after-deletes`). Empty (the default): nothing.
  std::function<void(int64_t deletes)> after_delete;
};

// One version object as CollectStore saw it.
struct RetainedVersion {
  std::string prefix;
  uint64_t base = 0;    // the base version (0 for a full frame)
  uint64_t target = 0;  // the version it produces
  bool full_frame = false;
  bool complete = false;  // its trailer is present
  uint64_t objects = 0;
  uint64_t bytes = 0;
  bool signed_ok = false;  // its final manifest verified (RetentionOptions::trust)
  bool tombstone = false;  // it holds a "gc-removing" tombstone
  std::string decision;    // "needed" | "kept" | "removed" | "unknown" | "unsigned"
  std::string why;         // the rule that decided it
};

struct RetentionReport {
  std::optional<uint64_t> committed;  // the committed version used (unset: no version object)
  uint64_t bytes_before = 0;          // every scanned object
  uint64_t bytes_after = 0;           // what remains (dry run: what would remain)
  uint64_t needed_bytes = 0;
  uint64_t other_bytes = 0;     // objects of no version object
  uint64_t unsigned_bytes = 0;  // version objects left alone as unsigned
  uint64_t removed_objects = 0;
  uint64_t removed_bytes = 0;
  std::vector<RetainedVersion> versions;  // by target, then prefix
  std::string budget_error;               // why the budget is not met ("" when it is)
};

// Scans `store` under options.root and removes what the rules above allow. `report` is filled
// either way (also on error). Errors: the store's (List, Get, Put, Delete); kResourceExhausted
// when the needed bytes exceed options.budget_bytes (nothing needed was removed);
// kFailedPrecondition for a store holding signed versions without options.trust.
Status CollectStore(ObjectStore* store, const RetentionOptions& options, RetentionReport* report);

// The report as JSON (an object: committed, bytes_before, bytes_after, needed_bytes,
// other_bytes, unsigned_bytes, removed_objects, removed_bytes, budget_error, versions[...]).
std::string RetentionReportToJson(const RetentionReport& report);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_RETENTION_H_
