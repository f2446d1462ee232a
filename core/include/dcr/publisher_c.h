/* dcr trainer-side C API: a training process hands each new version to a long-lived dcr sender,
 * version by version, as a checkpoint file or as its tensors in memory.
 *
 * The sender is the rank-0 node of a long-lived run (core/docs/training.md, "Publishing from a
 * training process"): its plan (a NodePlan JSON, `dcr run` writes them as plan-0.json) names the
 * versions (number, store prefix), the tree or store, and the base checkpoint the receivers hold;
 * the version *contents* come from the trainer through this API. The receivers are ordinary
 * dcr-node processes with plans of the same run. For each version the sender builds the delta
 * from the joint commit's baseline (the newest version every live receiver committed; over the
 * object store, the version before), streams it, and collects the receivers' commit reports.
 *
 * Flow:
 *   dcr_publisher_open(plan.json, work_dir, &p)         starts the sender (its own thread), or
 *   dcr_publisher_open_scenario(scenario.yaml, 0, base, state_dir, work_dir, &p)
 *   for each version k the plan names, in order:
 *     dcr_publisher_publish_file(p, k, "step-k.safetensors")       or
 *     dcr_publisher_publish_tensors(p, k, tensors, n)              (written under work_dir)
 *       -> returns once version k is out (every live receiver reported or was declared dead),
 *          DCR_OK, or the sender's error
 *   dcr_publisher_close(p)                               waits for the sender, frees p
 *
 * Every function returns a dcr status code (0 = DCR_OK, values of dcr::StatusCode, dcr_c.h's
 * DCR_* names) and never throws or aborts; dcr_publisher_error(p) gives the message of the last
 * failure on `p`. Thread safety: one dcr_publisher is used from one thread at a time (calls on
 * one handle are serialized by the caller); distinct publishers are independent.
 */
#ifndef DCR_CORE_INCLUDE_DCR_PUBLISHER_C_H_
#define DCR_CORE_INCLUDE_DCR_PUBLISHER_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dcr_publisher dcr_publisher;

/* One tensor of a version: name, safetensors dtype ("BF16", "F32", ...), shape (ndim dims) and
 * its bytes (nbytes = product of shape x dtype width), as the canonical checkpoint holds it. */
typedef struct dcr_tensor {
  const char* name;
  const char* dtype;
  const int64_t* shape;
  size_t ndim;
  const void* data;
  uint64_t nbytes;
} dcr_tensor;

/* Starts the sender of the plan at `plan_path` (a NodePlan JSON of rank 0 with versions; their
 * target_path fields are ignored: the trainer hands the contents). `work_dir` (created if
 * missing) holds the checkpoints written by dcr_publisher_publish_tensors. On failure *out is
 * still a handle (for dcr_publisher_error) unless the allocation failed; close it. */
int dcr_publisher_open(const char* plan_path, const char* work_dir, dcr_publisher** out);

/* Starts the sender of rank `rank` of the multi-host run that the scenario at `scenario_path`
 * describes, with no `dcr run` and no plan file: the plan `dcr-node SCENARIO --rank 0` makes
 * (addresses from network.hosts, TLS and signing from the files the scenario names, store
 * prefixes refit/step-<k>, so its receivers are `dcr-node SCENARIO --rank R` processes in the
 * long-lived form). Versions: one per model.checkpoints entry after the base, or, for a preset
 * model, `steps`; their contents come from the trainer. `base_path` (NULL or "":
 * model.checkpoints[0]) is the checkpoint every receiver holds. `state_dir` (NULL or "": none)
 * makes the sender recover, with the in-region store of the scenario's transport.object_store: a
 * trainer started again with the same state_dir resumes at the first version not yet published
 * (the next version to hand is that one). `work_dir` as for dcr_publisher_open.
 * Errors (codes as the DCR_* names): DCR_INVALID_ARGUMENT for a rank other than 0 (a receiver;
 * the publisher is the sender), a scenario that does not parse or places no multi-host run, or
 * recovery without a store; DCR_FAILED_PRECONDITION, naming the state and the version, when
 * `state_dir` holds a run that published every version (a finished run; the same with a plan's
 * state_dir in dcr_publisher_open). */
int dcr_publisher_open_scenario(const char* scenario_path, int rank, const char* base_path,
                                const char* state_dir, const char* work_dir,
                                dcr_publisher** out);

/* Hands version `version` as the safetensors file (or shard directory) at `path`; the file must
 * stay until the publisher is closed (a later version may be built from it as its base).
 * REQUIRES: `version` is the next version of the plan (DCR_INVALID_ARGUMENT otherwise, naming
 * the next one, and for a version a resumed state already published, saying so). Blocks
 * until the version is out; returns DCR_OK or the sender's error. */
int dcr_publisher_publish_file(dcr_publisher* p, uint64_t version, const char* path);

/* Hands version `version` as `n` tensors in memory, in file order, with `n_meta` metadata
 * entries (meta[2i] = key, meta[2i+1] = value; the file's "__metadata__"): written as one
 * safetensors file work_dir/version-<version>.safetensors (atomically), then published as by
 * dcr_publisher_publish_file. The caller's buffers are not kept. */
int dcr_publisher_publish_tensors(dcr_publisher* p, uint64_t version, const dcr_tensor* tensors,
                                  size_t n, const char* const* meta, size_t n_meta);

/* The content hash (lo, hi) of the last version published (zero before any) and the number of
 * receivers that reported committing it. Either pointer may be NULL. */
int dcr_publisher_last(const dcr_publisher* p, uint64_t hash[2], int* receivers_committed);

/* Message of the last failure on `p` ("" if none). Valid until the next call on `p`. */
const char* dcr_publisher_error(const dcr_publisher* p);

/* Ends the session: versions of the plan not yet handed are abandoned (the sender stops before
 * them and its receivers time out waiting). Waits for the sender's thread and frees `p`.
 * Returns DCR_OK when every version was handed and published, else the sender's error. */
int dcr_publisher_close(dcr_publisher* p);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* DCR_CORE_INCLUDE_DCR_PUBLISHER_C_H_ */
