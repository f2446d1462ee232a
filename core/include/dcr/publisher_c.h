/* dcr trainer-side C API: a training process hands each new version to a long-lived dcr sender,
 * version by version, as a checkpoint file, as its tensors in memory, or as its per-rank shards
 * (below, "Per-rank shards").
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
 *     dcr_publisher_publish_tensors(p, k, tensors, n)              (written under work_dir) or
 *     dcr_publisher_publish_shards(p, k, shards, n)                (after attach_shards)
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
 * model, `steps`, or, for a scenario with model.base (a deployment), open-ended: 1, 2, ... as
 * many as the trainer hands, ending when it closes the publisher; their contents come from the
 * trainer. `base_path` (NULL or "":
 * model.checkpoints[0]) is the checkpoint every receiver holds. `state_dir` (NULL or "": none)
 * makes the sender recover, with the in-region store of the scenario's transport.object_store: a
 * trainer started again with the same state_dir resumes at the first version not yet published
 * (the next version to hand is that one). `work_dir` as for dcr_publisher_open.
 * Errors (codes as the DCR_* names): DCR_INVALID_ARGUMENT for a rank other than 0 (a receiver;
 * the publisher is the sender), a scenario that does not parse or places no multi-host run, or
 * recovery without a store; DCR_FAILED_PRECONDITION, naming the state and the version, when
 * `state_dir` holds a run that published every version (a finished run; the same with a plan's
 * state_dir in dcr_publisher_open). With network.metrics_port (a plan's metrics_address), the
 * publisher serves rank 0's /metrics and /healthz as dcr-node does, until it is closed; an
 * address it cannot listen on fails the open with the listener's error. */
int dcr_publisher_open_scenario(const char* scenario_path, int rank, const char* base_path,
                                const char* state_dir, const char* work_dir, dcr_publisher** out);

/* Hands version `version` as the safetensors file (or shard directory) at `path`; the file must
 * stay while a later version may be built from it as its base: until dcr_publisher_baseline
 * passes `version` (or the publisher is closed).
 * REQUIRES: `version` is the next version of the plan (DCR_INVALID_ARGUMENT otherwise, naming
 * the next one, and for a version a resumed state already published, saying so). Blocks
 * until the version is out; returns DCR_OK or the sender's error. */
int dcr_publisher_publish_file(dcr_publisher* p, uint64_t version, const char* path);

/* Hands version `version` as `n` tensors in memory, in file order, with `n_meta` metadata
 * entries (meta[2i] = key, meta[2i+1] = value; the file's "__metadata__"): written as one
 * safetensors file work_dir/version-<version>.safetensors (atomically), then published as by
 * dcr_publisher_publish_file. The caller's buffers are not kept.
 *
 * What work_dir keeps: the files the publisher writes there (version-<k>.safetensors, and
 * version-<k>.dcr for shards) are removed once the sender releases version k, when the
 * baseline (dcr_publisher_baseline) passes it: no delta is built from it again and a sender
 * restarted on the same state does not read it (its catch-up copies are the in-region store's,
 * under the scenario's retention). So work_dir holds the checkpoints from the baseline to the
 * newest version: one or two while every live receiver commits each version, never one per
 * version of the run; a live receiver that falls behind holds the baseline back until its
 * receivers.deadline declares it dead. A resumed publisher removes what an earlier one on the
 * same work_dir left below the baseline. */
int dcr_publisher_publish_tensors(dcr_publisher* p, uint64_t version, const dcr_tensor* tensors,
                                  size_t n, const char* const* meta, size_t n_meta);

/* ---- Per-rank shards (core/docs/training.md) ----
 *
 * A trainer whose parameters live as Megatron-like rank shards hands those instead of canonical
 * tensors. The layout (dcr_train_layout) is dcr's placement of a model preset under a parallel
 * layout ("tp=1,pp=2,dp=2,dist_opt=1", dcr/train.h TrainLayout): which buffers each model-parallel
 * rank holds and where every parameter sits in them. The trainer's exporter (its framework's
 * ordinary converter from rank shards to canonical tensors) is a callback. Flow:
 *   dcr_train_layout_open("tiny", "tp=1,pp=2,dp=2,dist_opt=1", &l)
 *   dcr_publisher_attach_shards(p, l, export_fn, user, base_version, base_shards, n)
 *   for each version k: dcr_publisher_publish_shards(p, k, shards, n)
 * Each version's shards are diffed rank by rank against the version before (TrainDeltaBuilder:
 * no canonical tensor is assembled for the delta) and the canonical checkpoint is exported once
 * (work_dir/version-<k>.safetensors): the base a later delta may be built from and what the
 * sender falls back to. The sender streams the trainer's delta when its base is the version the
 * delta must be built from (the joint commit's baseline; over the object store, the version
 * before) with that version's content hash, in a run that does not context-code its deltas;
 * otherwise (the version before came as a file or tensors, the shards the builder holds are of
 * another version, or the plan context-codes the long link while the trainer's delta is plain)
 * it builds the delta from the canonical checkpoints. dcr_publisher_last_delta says which went out.
 * Cost on the trainer: one copy of the shards in host memory (the base of the next diff) and one
 * export per version. */

typedef struct dcr_train_layout dcr_train_layout;

/* One buffer of a model-parallel rank: its name, safetensors dtype and element count. */
typedef struct dcr_train_buffer {
  const char* name;
  const char* dtype;
  uint64_t numel;
} dcr_train_buffer;

/* One training parameter of a rank: Megatron-style name (unique within the rank), the buffer it
 * lives in, its element offset there, its element count and local shape; replica != 0 for a copy
 * of a parameter held (and exported) on another rank. */
typedef struct dcr_train_param {
  const char* name;
  int buffer;
  uint64_t offset;
  uint64_t numel;
  const int64_t* shape;
  size_t ndim;
  int replica;
} dcr_train_param;

/* The bytes of buffer `buffer` of model-parallel rank `rank` (nbytes = the buffer's numel x its
 * dtype width). Rank ids: (pp * ep + ep_rank) * tp + tp_rank. */
typedef struct dcr_shard {
  int rank;
  int buffer;
  const void* data;
  uint64_t nbytes;
} dcr_shard;

/* What an exporter reads shards through. */
typedef struct dcr_shard_reader dcr_shard_reader;

/* Elements [begin, begin + count) of buffer `buffer` of rank `rank`, as bytes; NULL when the
 * range is outside the buffer. Valid during the exporter call it was given to. */
const void* dcr_shard_read(const dcr_shard_reader* shards, int rank, int buffer, uint64_t begin,
                           uint64_t count);

/* The trainer's exporter: writes canonical tensor `tensor` (index as dcr_train_layout_tensor)
 * to `out` (the tensor's nbytes), reading the shards only through `shards`. Returns 0, or a
 * DCR_* code that fails the call it runs under. Called concurrently for distinct tensors, and
 * on probe shards (coordinate-tagged bits, map discovery) besides the trainer's own. */
typedef int (*dcr_export_fn)(void* user, const dcr_shard_reader* shards, size_t tensor, void* out);

/* The placement of model preset `model` ("tiny", ..., dcr/model.h) under `layout` (TrainLayout
 * text). On failure (DCR_INVALID_ARGUMENT naming the preset or the layout field) *out is still a
 * handle for dcr_train_layout_error unless the allocation failed; close it. */
int dcr_train_layout_open(const char* model, const char* layout, dcr_train_layout** out);
/* The placement that the layout spec at `spec_path` describes for the tensors of the checkpoint
 * at `checkpoint_path` (any tensor set, no preset): a JSON file
 *   {"ranks": 2, "tensors": [{"tensor": "w", "split": "rows", "ranks": [0, 1]}, ...]}
 * with one entry per tensor: "rows" / "columns" cut dimension 0 / 1 into equal parts, part i on
 * ranks[i]; "whole" puts it on every listed rank (the first its owner, the others replicas).
 * Each rank holds one buffer per parameter, named as the tensor (dcr/train.h
 * TrainStructure::FromLayoutSpec). Errors: DCR_INVALID_ARGUMENT naming the spec and the entry
 * (unknown tensor, a tensor placed twice or not at all, a rank holding nothing, a dimension the
 * split does not divide, ...); the checkpoint's or the file's errors. On failure *out is still
 * a handle for dcr_train_layout_error unless the allocation failed; close it. */
int dcr_train_layout_open_spec(const char* spec_path, const char* checkpoint_path,
                               dcr_train_layout** out);
const char* dcr_train_layout_error(const dcr_train_layout* l);
void dcr_train_layout_close(dcr_train_layout* l);
/* Model-parallel ranks; buffers and parameters of rank `rank` (0 for a bad rank). */
int dcr_train_layout_ranks(const dcr_train_layout* l);
size_t dcr_train_layout_buffers(const dcr_train_layout* l, int rank);
size_t dcr_train_layout_params(const dcr_train_layout* l, int rank);
/* Entry `i` of rank `rank` into *out (strings and shapes owned by l). DCR_INVALID_ARGUMENT for an
 * index out of range. */
int dcr_train_layout_buffer(const dcr_train_layout* l, int rank, size_t i, dcr_train_buffer* out);
int dcr_train_layout_param(const dcr_train_layout* l, int rank, size_t i, dcr_train_param* out);
/* Index of the parameter called `name` on rank `rank`, or -1. */
long dcr_train_layout_find_param(const dcr_train_layout* l, int rank, const char* name);
/* Canonical tensors (sorted by name), each as a dcr_tensor without data. */
size_t dcr_train_layout_tensors(const dcr_train_layout* l);
int dcr_train_layout_tensor(const dcr_train_layout* l, size_t t, dcr_tensor* out);
/* Exports `shards` (one per buffer of every rank) as the canonical safetensors file at `path`
 * (atomically), with the exporter: the dense checkpoint the deltas are checked against. */
int dcr_train_layout_export(const dcr_train_layout* l, dcr_export_fn fn, void* user,
                            const dcr_shard* shards, size_t n, const char* path);

/* Gives the publisher the layout, the exporter and the shards of version `base_version` (the
 * version the next dcr_publisher_publish_shards is diffed against; 0 = the plan's base, which
 * the receivers hold). Probes the exporter once (map discovery) and copies the shards. For
 * base_version 0 the shards' canonical content hash must be the base checkpoint's
 * (DCR_FAILED_PRECONDITION naming both hashes otherwise). `l` may be closed after the call.
 * Shard errors as for dcr_publisher_publish_shards. Attaching again replaces the shards. */
int dcr_publisher_attach_shards(dcr_publisher* p, const dcr_train_layout* l, dcr_export_fn fn,
                                void* user, uint64_t base_version, const dcr_shard* shards,
                                size_t n);

/* Hands version `version` as its rank shards: exactly one dcr_shard per buffer of every rank,
 * in any order, each of the buffer's size. REQUIRES: attached shards. Errors, before anything is
 * sent: DCR_INVALID_ARGUMENT for a version out of order (as dcr_publisher_publish_file), a rank
 * or buffer outside the layout, a duplicate, a missing shard or a wrong size (each named with
 * its rank, buffer name and the expected bytes); DCR_FAILED_PRECONDITION with no shards
 * attached. Then as dcr_publisher_publish_file (blocks until the version is out). The caller's
 * buffers are not kept. */
int dcr_publisher_publish_shards(dcr_publisher* p, uint64_t version, const dcr_shard* shards,
                                 size_t n);

/* Of the last version published: the version its delta was built from, and from_shards = 1 when
 * the trainer's delta (built from the shards) went out, 0 when the sender built it from the
 * canonical checkpoints. Either pointer may be NULL. */
int dcr_publisher_last_delta(const dcr_publisher* p, uint64_t* base_version, int* from_shards);

/* The content hash (lo, hi) of the last version published (zero before any) and the number of
 * receivers that reported committing it. Either pointer may be NULL. */
int dcr_publisher_last(const dcr_publisher* p, uint64_t hash[2], int* receivers_committed);

/* The lowest version whose checkpoint the sender may still build a delta from (the joint
 * commit's baseline over the relay tree; over the object store, the last version out); 0 before
 * the first version is out. The checkpoints handed of versions below it are no longer read: the
 * trainer may delete them (the publisher removes those it wrote under work_dir). */
int dcr_publisher_baseline(const dcr_publisher* p, uint64_t* version);

/* The version the publisher takes next: the plan's first version, or after a resume (a state_dir
 * an earlier publisher left) the first version that state does not record as published; the one
 * dcr_publisher_publish_* must be given next. DCR_FAILED_PRECONDITION when the plan names no more
 * versions or the sender has ended (its error then). */
int dcr_publisher_next_version(const dcr_publisher* p, uint64_t* version);

/* Message of the last failure on `p` ("" if none). Valid until the next call on `p`. */
const char* dcr_publisher_error(const dcr_publisher* p);

/* Ends the session: versions of the plan not yet handed are abandoned (the sender stops before
 * them and its receivers time out waiting; an open-ended plan's run simply ends there, its
 * receivers waiting for a next version until they are stopped). Waits for the sender's thread
 * and frees `p`. Returns DCR_OK when every version was handed and published (an open-ended
 * plan: every version handed), else the sender's error. */
int dcr_publisher_close(dcr_publisher* p);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DCR_CORE_INCLUDE_DCR_PUBLISHER_C_H_ */
