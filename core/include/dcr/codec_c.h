/* dcr C API for in-memory tensors: build a delta from two tensor sets held by the caller, and apply
 * a delta in place to a tensor set, all or nothing. For programs that hold their weights in their
 * own memory (a Python trainer or engine through ctypes, a C++ runtime) rather than in safetensors
 * files.
 *
 * Tensors are described by dcr_tensor (dcr/publisher_c.h, the trainer side's descriptor): a name
 * (unique within its set), a safetensors dtype string ("BF16", "F16", "F32", "F64", "I8", "U8",
 * "F8_E4M3", ... as dcr/dtype.h parses them; unknown strings are refused), a shape (ndim 0 for a
 * scalar), the host address of element 0 of its row-major, contiguous, little-endian bytes (NULL
 * only without elements) and nbytes, which must equal the product of the shape times the dtype's
 * width. The descriptors are borrowed for the duration of a call. dcr_apply_delta writes the bytes
 * at `data` in place (the pointer is const only because the type is shared with the publisher).
 * A tensor set is what a safetensors file with those tensors would hold: the delta's bytes are
 * those `dcr diff` writes for the two files, and its base and target hashes are the files'
 * content hashes.
 *
 * Every function returns a dcr status code (0 = OK, the values of dcr::StatusCode in dcr/status.h;
 * dcr_c.h names the common ones) and never throws or aborts; dcr_last_error() (dcr_c.h) gives the
 * message of the calling thread's last failure.
 * Thread safety: the functions are thread-safe; concurrent calls must not write the same tensors.
 */
#ifndef DCR_CORE_INCLUDE_DCR_CODEC_C_H_
#define DCR_CORE_INCLUDE_DCR_CODEC_C_H_

#include <stddef.h>
#include <stdint.h>

#include "dcr/dcr_c.h"
#include "dcr/publisher_c.h" /* dcr_tensor */

#ifdef __cplusplus
extern "C" {
#endif

/* Value coding of a delta (DeltaOptions::value_policy). */
enum {
  DCR_VALUES_AUTO = 0, /* ulp differences for float dtypes, XOR for the rest */
  DCR_VALUES_XOR = 1,
  DCR_VALUES_ULP = 2,
  DCR_VALUES_ABSOLUTE = 3, /* overwrite values: the delta applies over any bits (repairs) */
};

/* Options of dcr_encode_delta and dcr_apply_delta. Initialise with dcr_codec_options_init; a NULL
 * options pointer means the defaults. Fields an operation does not use are ignored. */
typedef struct dcr_codec_options {
  int32_t threads; /* worker threads; 0 (default) = hardware concurrency */
  /* ---- encode (dcr/delta.h DeltaOptions; the bytes depend on these) ---- */
  uint64_t chunk_elems;        /* grid cell size in elements; default 2^22 */
  uint64_t small_tensor_elems; /* tensors below this are batched into shared chunks; 2^16 */
  int32_t zstd_level;          /* default 1 */
  int32_t value_policy;        /* DCR_VALUES_*; default DCR_VALUES_AUTO */
  uint64_t base_version;       /* version numbers written in the header; default 0 -> 1 */
  uint64_t target_version;
  int32_t context_coding;  /* 1: context-code chunks where smaller (`dcr diff --wan-context`;
                            * the receiver needs the base bits of every covered element);
                            * default 0 */
  int32_t context_classes; /* with context_coding: most exponent classes per chunk, 1..16;
                            * default 16 */
  int32_t full;            /* 1: a full frame, applicable without the base; default 0 */
  /* ---- apply ---- */
  /* The tensors' content hash if the caller knows it (the target_hash of the previous apply);
   * {0, 0} (default) = compute it, a full read of the tensors. The value is taken on trust for
   * the elements the delta does not change; at the changed ones every relative chunk still
   * checks the bits it replaces (a mismatch refuses the delta and restores the tensors). */
  uint64_t known_base_hash[2];
} dcr_codec_options;

void dcr_codec_options_init(dcr_codec_options* options);

/* What dcr_apply_delta did. */
typedef struct dcr_apply_result {
  uint64_t chunks;       /* chunk records applied */
  uint64_t changes;      /* changed elements */
  uint64_t base_version; /* the delta header's version numbers */
  uint64_t target_version;
  uint64_t target_hash[2]; /* content hash of the tensors now (lo, hi) */
} dcr_apply_result;

/* Builds the delta from the tensor set `base` (n_base tensors) to `target` (n_target tensors) into
 * a buffer allocated by dcr: *out receives it and *out_size its size; free it with
 * dcr_bytes_free. `base` may be NULL (n_base 0) only with options->full. The two sets must have
 * the same names, dtypes and shapes (any order): DCR_FAILED_PRECONDITION naming the first
 * difference otherwise. DCR_INVALID_ARGUMENT for a bad descriptor (NULL name, dtype or data,
 * unknown dtype, nbytes that disagrees with the shape, a name given twice) or bad options.
 * Memory: a copy of both sets is made for the build, plus the delta. On error *out is NULL and
 * *out_size 0. */
int dcr_encode_delta(const dcr_tensor* base, size_t n_base, const dcr_tensor* target,
                     size_t n_target, const dcr_codec_options* options, uint8_t** out,
                     size_t* out_size);
void dcr_bytes_free(uint8_t* bytes);

/* Applies the delta `delta[0, size)` in place to the tensor set `tensors` (n tensors), which
 * must hold the delta's base (any order; every tensor of the delta's inventory, no other).
 * All or nothing: on any error the tensors hold exactly the bytes they held before the call.
 * Checks before the first write: the delta's header, trailer and chunk table (DCR_DATA_LOSS when
 * corrupt or truncated), the tensor set against the delta's inventory (DCR_INVALID_ARGUMENT
 * naming the tensor whose name, dtype or shape differs), the tensors' content hash against the
 * delta's base hash (DCR_FAILED_PRECONDITION naming both; not for a full frame). Then each chunk
 * is checked (checksums, its base bits) and applied, and the result's content hash is compared
 * with the delta's target hash; a failure there (DCR_DATA_LOSS, DCR_FAILED_PRECONDITION) takes
 * back every applied chunk. Memory beyond a copy of the delta: the old bits of the chunks with
 * overwrite values or context coding (their covered elements), kept until the apply ends.
 * `result` may be NULL. */
int dcr_apply_delta(const dcr_tensor* tensors, size_t n, const void* delta, size_t size,
                    const dcr_codec_options* options, dcr_apply_result* result);

/* One blob of a delta as a transport sends it (dcr_receiver_begin / _apply_chunk / _finish of
 * dcr_c.h take them): [offset, offset + size) of the delta's bytes. */
typedef struct dcr_delta_part {
  uint64_t offset;
  uint64_t size;
} dcr_delta_part;

/* Splits the delta `delta[0, size)` into its blobs: parts[0] the file header, then each chunk
 * record of the trailer's chunk table in table order, then the trailer. *count receives the
 * number of parts (chunks + 2); at most `cap` are written (call with cap 0 to size the array).
 * DCR_DATA_LOSS for a corrupt or truncated delta. */
int dcr_delta_parts(const void* delta, size_t size, dcr_delta_part* parts, size_t cap,
                    size_t* count);

/* The content hash (dcr/hash.h) of a tensor set: what a delta built from it names as its base. */
int dcr_tensors_hash(const dcr_tensor* tensors, size_t n, int32_t threads, uint64_t hash[2]);

/* ---- applying through a placement map ----
 * An engine that holds the weights in its own layout (fused, sliced, transposed, padded, tied)
 * keeps a canonical copy of the checkpoint (the tensor set) and a placement map: where each
 * canonical element lies, bit for bit, in the engine's buffers. dcr_apply_delta_placed applies a
 * delta to the canonical copy all or nothing, then writes the new bits of the changed elements
 * alone into the engine's buffers; elements the delta does not change are neither read nor
 * written there. */

/* One bit-preserving placement given as data: for i < count, element src[i] of tensor `tensor`
 * (an index into the tensor set given to dcr_placement_map_create) is held, bit for bit, at element
 * dst_index[i] of the buffer at `dst`, an array of dst_elements elements of the tensor's width
 * (host memory). The arrays are borrowed for the duration of dcr_placement_map_create. */
typedef struct dcr_placement {
  uint32_t tensor;
  void* dst;
  uint64_t dst_elements;
  uint64_t count;
  const int64_t* src;
  const int64_t* dst_index;
} dcr_placement;

typedef struct dcr_placement_map dcr_placement_map;

/* Builds the map of `placements` over the tensor set `tensors` (its names, dtypes and shapes are
 * kept; its data is not). The map keeps the `dst` addresses: the buffers must stay where they are
 * while the map is used. DCR_INVALID_ARGUMENT for a bad descriptor, a tensor index out of range,
 * an index outside its tensor or buffer, or two placements writing the same destination bytes.
 * Memory: 16 bytes per placed element. Free with dcr_placement_map_free. */
int dcr_placement_map_create(const dcr_tensor* tensors, size_t n, const dcr_placement* placements,
                             size_t n_placements, dcr_placement_map** out);
void dcr_placement_map_free(dcr_placement_map* map);
/* Elements placed (the sum of the placements' counts). */
uint64_t dcr_placement_map_elements(const dcr_placement_map* map);

/* dcr_apply_delta on `tensors` (the same checks, failure codes and all-or-nothing outcome: on error
 * the tensors and every destination buffer hold the bytes they held before the call), then, once
 * the delta is committed, writes the new bits of every changed element to each of its placed
 * destinations. `tensors` must be the map's tensor set (same names, dtypes and shapes, same
 * order): DCR_INVALID_ARGUMENT otherwise. `changed` (may be NULL) receives n flags: 1 for each
 * tensor with at least one changed element (a converted copy of it needs re-loading), else 0.
 * `written` (may be NULL) receives n counts: the destination elements written for each tensor.
 * DCR_INTERNAL only if a chunk that was applied fails to decode again: the tensors then hold the
 * target (`result` says which), `changed` and `written` what was written, and the destinations
 * are partly written (rewrite them with dcr_placement_map_write). */
int dcr_apply_delta_placed(const dcr_tensor* tensors, size_t n, const void* delta, size_t size,
                           const dcr_placement_map* map, const dcr_codec_options* options,
                           dcr_apply_result* result, uint8_t* changed, uint64_t* written);

/* Writes every placed element of the tensors flagged in `which` (n flags; NULL = all) from
 * `tensors` (the map's tensor set) to its destinations: the repair after an interrupted update.
 * `threads`: 0 = hardware concurrency. `written` (may be NULL) receives n counts: the destination
 * elements written for each tensor. */
int dcr_placement_map_write(const dcr_placement_map* map, const dcr_tensor* tensors, size_t n,
                            const uint8_t* which, int32_t threads, uint64_t* written);

/* ---- tensors in device memory ----
 * The *_device functions take the same arguments as the functions above plus the device every
 * tensor of the call lives on: `data` of each descriptor is then an address in that device's
 * memory (a CUDA device pointer, as torch's data_ptr() of a CUDA tensor gives it). They run the
 * device path of dcr/device.h: the content hash is computed on the device (Device::RangeHash),
 * a delta is applied by gathering the old bits of each chunk's changes and scattering the new
 * ones on the device (nothing of the model is copied to the host), and encoding downloads the
 * tensors, one at a time in pieces of at most 64 MiB, into the host copy the build reads (the
 * memory of dcr_encode_delta). Results, failure codes and the all-or-nothing outcome are those
 * of the host functions: on any error of an apply, the device bytes the call changed are
 * restored from the chunks (or from the old bits kept for overwrite chunks) before it returns.
 * Context-coded deltas (context_coding) are refused by the device apply (DCR_DATA_LOSS or
 * DCR_FAILED_PRECONDITION, the tensors unchanged): build deltas for devices without it.
 * A NULL device, or kind DCR_DEVICE_CPU, is the host function itself.
 *
 * Streams: every device operation runs on dcr's own streams and is complete when the call
 * returns. The caller orders its own work around the call: before it, the writes of the
 * caller's streams to the tensors must be complete (e.g. torch.cuda.current_stream().
 * synchronize()); after it, the caller's streams see the new bytes.
 *
 * Kinds: DCR_DEVICE_CUDA (the CUDA device `ordinal`; code 5, dcr::StatusCode::kUnavailable,
 * naming the reason when dcr was built without CUDA or the device is absent) and
 * DCR_DEVICE_HOST, the host backend of dcr/device.h: the same device code path run by the CPU
 * over host memory (ordinal 0), for tests and CI without a GPU. Its tensors are host addresses;
 * the backend takes the call's tensors (or a map's destination buffers) as its memory, and its
 * range-checked operations (hash, download) refuse other addresses with DCR_INVALID_ARGUMENT.
 * All tensors of one call are on the one device given: a call never mixes devices. */
enum {
  DCR_DEVICE_CPU = 0,  /* host memory, the host functions */
  DCR_DEVICE_HOST = 1, /* the host backend of the device path */
  DCR_DEVICE_CUDA = 2,
};

typedef struct dcr_device {
  int32_t kind;    /* DCR_DEVICE_* */
  int32_t ordinal; /* the CUDA device index; 0 for the host backend */
} dcr_device;

/* dcr_encode_delta over tensors on `device` (base and target on the same device). Memory on the
 * host as dcr_encode_delta's; DCR_INVALID_ARGUMENT for an unknown kind or a bad ordinal. */
int dcr_encode_delta_device(const dcr_device* device, const dcr_tensor* base, size_t n_base,
                            const dcr_tensor* target, size_t n_target,
                            const dcr_codec_options* options, uint8_t** out, size_t* out_size);

/* dcr_apply_delta over tensors on `device`. Device memory: none beyond the device backend's
 * staging; host memory: a copy of the delta, the chunks' change lists as they are applied, and
 * the old bits of overwrite chunks (as dcr_apply_delta). */
int dcr_apply_delta_device(const dcr_device* device, const dcr_tensor* tensors, size_t n,
                           const void* delta, size_t size, const dcr_codec_options* options,
                           dcr_apply_result* result);

/* dcr_tensors_hash over tensors on `device`. */
int dcr_tensors_hash_device(const dcr_device* device, const dcr_tensor* tensors, size_t n,
                            int32_t threads, uint64_t hash[2]);

/* dcr_placement_map_create whose destination buffers (each placement's `dst`) are in the memory
 * of `device`, while the canonical tensor set stays in host memory: the engine keeps its
 * parameters on the GPU and the canonical copy on the host (no second copy of the model on the
 * device). dcr_apply_delta_placed then applies the delta to the host tensors, all or nothing as
 * always, and once it committed scatters the new bits of the changed elements to their device
 * destinations (Device::Scatter, in batches of at most 65536 elements); dcr_placement_map_write
 * scatters every placed element. A failure of a device write is reported as those functions
 * report a failed placement write (DCR_INTERNAL for dcr_apply_delta_placed: rewrite with
 * dcr_placement_map_write). With kind DCR_DEVICE_HOST the destinations are host memory written
 * through the host backend. The map keeps the device open while it lives. */
int dcr_placement_map_create_device(const dcr_device* device, const dcr_tensor* tensors, size_t n,
                                    const dcr_placement* placements, size_t n_placements,
                                    dcr_placement_map** out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DCR_CORE_INCLUDE_DCR_CODEC_C_H_ */
