/* dcr C API: the copy hook and the receiver entry points, for serving runtimes written in other
 * languages or built separately (vLLM, SGLang, TensorRT-LLM through ctypes/cffi or C++).
 *
 * Flow for a runtime:
 *   1. dcr_recorder_begin(checkpoint path) -> the checkpoint is mapped by dcr; the runtime's own
 *      loader reads tensors from dcr_recorder_tensor_data() (or from its own mapping of the same
 *      file, declared with dcr_recorder_add_source) and copies them into its storage as usual.
 *      Declare storage with dcr_recorder_add_buffer, and say which tensor is being loaded with
 *      dcr_recorder_set_tensor (converted writes are attributed to it). Copies are seen through the
 *      interposed memcpy family (and cudaMemcpy* with dcr::cuda); a runtime that copies some other
 *      way reports them with dcr_copy_hook_note.
 *   2. dcr_recorder_end() -> a dcr_receiver: placement map + the base version's hash.
 *   3. Per delta: dcr_receiver_begin(header bytes), dcr_receiver_apply_chunk(record bytes) for each
 *      chunk record as it arrives (any order), dcr_receiver_finish(trailer bytes). Converted
 * tensors are handed back through the reload callback (re-run your loader on them) before finish
 *      returns; the runtime may serve the new version only when finish returned DCR_OK.
 * A dcr_receiver is the C face of dcr::ServingReplica (dcr/runtime.h) attached to the recorded
 * buffers: begin / apply_chunk / finish are Receiver::Begin / ApplyRecord / Commit (dcr/receiver.h)
 * with the same checks and failure codes.
 *
 * Every function returns a dcr status code (0 = OK, values of dcr::StatusCode) and never throws or
 * aborts; dcr_last_error() gives the message of the calling thread's last failure.
 * Thread safety: one receiver per thread at a time; the copy hook is process-wide.
 */
#ifndef DCR_CORE_INCLUDE_DCR_DCR_C_H_
#define DCR_CORE_INCLUDE_DCR_DCR_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The C ABI of this header. It grows by one whenever a function's signature, a struct's layout or
 * an enum value of this header or of publisher_c.h changes; functions are only ever added at the
 * same ABI. A program loading libdcr at run time compares dcr_c_abi_version() with the value it was
 * written against. */
#define DCR_C_ABI_VERSION 1
int dcr_c_abi_version(void);

enum {
  DCR_OK = 0,
  DCR_INVALID_ARGUMENT = 1,
  DCR_NOT_FOUND = 2,
  DCR_DATA_LOSS = 3,
  DCR_FAILED_PRECONDITION = 4,
  DCR_INTERNAL = 8,
};

/* Kinds of observed copies. */
enum {
  DCR_COPY_HOST = 0, /* memcpy / memmove */
  DCR_COPY_HOST_TO_DEVICE = 1,
  DCR_COPY_DEVICE_TO_DEVICE = 2,
  DCR_COPY_DEVICE_TO_HOST = 3,
  DCR_COPY_FILL = 4, /* memset / cudaMemset: src is NULL, the value is constant */
};

/* ---- the copy hook (process-wide) ---- */
typedef void (*dcr_copy_observer_fn)(void* ctx, void* dst, const void* src, size_t n, int kind);
/* Installs the observer; DCR_FAILED_PRECONDITION if one is already installed. */
int dcr_copy_hook_install(dcr_copy_observer_fn fn, void* ctx);
void dcr_copy_hook_remove(void);
int dcr_copy_hook_active(void);
/* Reports a copy the interposed symbols cannot see (for example from a preloaded shim around the
 * runtime's own copy function). No-op when no observer is installed. */
void dcr_copy_hook_note(void* dst, const void* src, size_t n, int kind);

/* ---- recording and receiving ---- */
typedef struct dcr_recorder dcr_recorder;
typedef struct dcr_receiver dcr_receiver;

/* Maps the safetensors file at `path` and starts recording copies. A sharded checkpoint (a
 * directory of shards) is refused with DCR_INVALID_ARGUMENT: pass one safetensors file. */
int dcr_recorder_begin(const char* path, dcr_recorder** out);
/* Pointer to tensor `name`'s bytes in dcr's mapping (NULL if absent). */
const void* dcr_recorder_tensor_data(dcr_recorder* r, const char* name, uint64_t* nbytes);
/* Declares another mapping of the same file (the runtime's own mmap): copies from it count too. */
int dcr_recorder_add_source(dcr_recorder* r, const void* file_base, uint64_t file_size);
/* Declares a storage buffer (host or device address range). */
int dcr_recorder_add_buffer(dcr_recorder* r, const char* name, void* data, uint64_t nbytes);
/* The tensor the loader is placing now (NULL: none; writes then count as constants). */
int dcr_recorder_set_tensor(dcr_recorder* r, const char* name);

/* Re-load callback: the runtime re-runs its loader for one tensor with these canonical bytes. */
typedef int (*dcr_reload_fn)(void* ctx, const char* tensor, const void* data, uint64_t nbytes);

/* Ends recording and builds the receiver for the recorded buffers (host buffers are written in
 * place; the receiver keeps shadows of converted tensors). Frees the recorder. */
int dcr_recorder_end(dcr_recorder* r, dcr_reload_fn reload, void* reload_ctx, dcr_receiver** out);

int dcr_receiver_begin(dcr_receiver* rx, const void* header, size_t size);
int dcr_receiver_apply_chunk(dcr_receiver* rx, const void* record, size_t size);
/* Returns DCR_OK only when every chunk was applied and the version hash matches (committed). */
int dcr_receiver_finish(dcr_receiver* rx, const void* trailer, size_t size);
/* Compares what dcr holds of the runtime's storage (every bit-preserving placement and every
 * canonical shadow) with the safetensors checkpoint at `target_path`, byte for byte: DCR_OK if
 * equal, DCR_DATA_LOSS naming the first difference. Converted regions are the runtime's loader's.
 */
int dcr_receiver_verify(const dcr_receiver* rx, const char* target_path);
/* The last committed version: its number (0 for the recorded checkpoint), content hash (lo, hi)
 * and whether a delta is in progress (1) or not (0). Any pointer may be NULL. */
int dcr_receiver_version(const dcr_receiver* rx, uint64_t* number, uint64_t hash[2], int* in_delta);
/* Placement summary: bytes placed bit-preserving, converted and constant. */
void dcr_receiver_stats(const dcr_receiver* rx, uint64_t* bit_preserving, uint64_t* converted,
                        uint64_t* constant);
void dcr_receiver_free(dcr_receiver* rx);

/* Message of the calling thread's last error ("" if none). */
const char* dcr_last_error(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DCR_CORE_INCLUDE_DCR_DCR_C_H_ */
