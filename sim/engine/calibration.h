// Compute-cost calibration for the simulator: the JSON written by `dcr bench codec --json`.
//
// Recognised keys (others are ignored and kept verbatim in `raw`):
//   memcpy_bytes_per_s                 single-core memcpy bandwidth of the machine
//   rates: [{change_rate, encode_bytes_per_s, decode_apply_bytes_per_s, ...}]
//     (the array may also be named "results"; the rate key may be "rate"). Bandwidths are
//     bytes of dense tensor per second per core.
// Optional: "device" (a string naming the machine), "cores" (cores used by the bench).
// Optional per rate, the context-coded delta's speeds (format version 8, `dcr bench codec --json`;
// its size comes from the payload model, not from here): context_encode_bytes_per_s,
//   context_decode_apply_bytes_per_s;
//   context_transcode_bytes_per_s (decode context + apply + plain re-encode, what an edge relay
//   does; when absent, decode+apply followed by the plain encoder's speed, a bound from above).
//   Present for every rate or for none. Optional top-level "context_classes": the class cap they
//   were measured at (default 16).
// Optional "tls": the JSON `dcr_bench_tls --json` writes, inline or as the name of that file
// (relative to the calibration file's directory); the simulator reads its
//   tls_cpu_s_per_byte: {send, recv}: CPU seconds mutual TLS adds per byte at the sending and at
//   the receiving end of one relay-tree edge (TLS minus plain TCP, same run), and, when the
//   block has them, plain: {send_cpu_s, recv_cpu_s} over "bytes": what each end of the plain
//   TCP transfer of the same run spends per byte (the sockets themselves, TLS or not).
// Optional "signing": the JSON `dcr_bench_sign --json` writes, inline or as a file name; read:
//   sha256_bytes_per_s, ed25519_signs_per_s, ed25519_verifies_per_s (one core), and when given
//   chunks / manifests (chunks per manifest record) and signed_delta_bytes / delta_bytes (the
//   manifest records' share of the stream).
// Optional, the commitment of a signed version (dcr/commitment.h; `dcr bench pipeline --json` and
// `dcr bench codec --json`): commitment_bytes_per_s, SHA-256 Merkle leaves over tensor bytes per
// second of one core's CPU time (CommitmentOf with one thread), and commitment_wall_bytes_per_s
// (the same from wall time).
// Optional, verify_bytes_per_s (`dcr bench pipeline --json`): a receiver's comparison of what it
// holds with the target file (VerifyFile, as dcr run's receivers do after each commit), tensor
// bytes per second of one core's CPU time.
// Optional, the durable receivers' commit (`dcr bench pipeline --json`: a durable `cpu` receiver,
// core/src/node/node_recovery.h, through the shipped code): per rate commit_s_per_storage_byte
// (wall seconds its Commit takes, the version log's fsyncs and the journal's commit record,
// per byte of storage, after the delta was applied at the bench's speed) and
// plain_write_bytes_per_s (the same run's reference: write + fdatasync) and
// durable_apply_cpu_s_per_storage_byte (CPU the durable apply adds to a plain one), either in
// the rates above or in a "durability" block (inline, or the name of a file, with its own
// "rates").
//
// Thread safety: value types and pure functions.
#ifndef DCR_SIM_ENGINE_CALIBRATION_H_
#define DCR_SIM_ENGINE_CALIBRATION_H_

#include <string>
#include <vector>

#include "dcr/delta.h"
#include "dcr/statusor.h"

namespace dcr::sim::internal {

struct RatePoint {
  double change_rate = 0;
  double encode_bytes_per_s = 0;
  double decode_apply_bytes_per_s = 0;
  // Wall-clock variants (`*_wall_bytes_per_s`, optional; 0 when absent): what a loaded machine
  // actually delivered during the bench.
  double encode_wall_bytes_per_s = 0;
  double decode_apply_wall_bytes_per_s = 0;
  // Context-coded (0 when absent).
  double context_encode_bytes_per_s = 0;
  double context_decode_apply_bytes_per_s = 0;
  double context_transcode_bytes_per_s = 0;
};

// The durable receiver's commit at one change rate.
struct CommitPoint {
  double change_rate = 0;
  double s_per_storage_byte = 0;       // wall seconds of Commit per byte of receiver storage
  double plain_write_bytes_per_s = 0;  // reference write + fdatasync, same run (0: absent)
  // CPU seconds per byte of storage the durable apply adds to a plain one (write faults on the
  // mapping, writeback started per chunk; optional, 0 when absent).
  double apply_cpu_s_per_storage_byte = 0;
};

struct Calibration {
  std::string source;  // path it was read from
  std::string raw;     // the file's JSON text, recorded in results
  double memcpy_bytes_per_s = 0;
  double memcpy_wall_bytes_per_s = 0;  // optional, 0 when absent
  // Optional (`dcr bench pipeline`): cores the machine actually gave the bench's multi-threaded
  // build (process CPU seconds / wall seconds); 0 when absent.
  double available_cores = 0;
  // The commitment pass (CommitmentOf) per core: tensor bytes per second; 0 when absent.
  double commitment_bytes_per_s = 0;
  double commitment_wall_bytes_per_s = 0;  // optional, 0 when absent
  // A receiver's byte comparison with the target file after its commit (VerifyFile, one thread):
  // bytes of storage per second of CPU; 0 when absent.
  double verify_bytes_per_s = 0;
  bool has_commitment() const { return commitment_bytes_per_s > 0; }
  std::vector<RatePoint> rates;  // sorted by change_rate
  bool has_tls = false;          // a "tls" block was given
  std::string tls_source;        // the file it came from
  bool has_signing = false;      // a "signing" block was given
  std::string signing_source;
  double sha256_s_per_byte = 0;      // SHA-256 of chunk records, one core
  double sign_s_per_manifest = 0;    // Ed25519 signature of one manifest record
  double verify_s_per_manifest = 0;  // its verification
  double chunks_per_manifest = 32;
  double signed_size_ratio = 1;  // signed stream bytes / unsigned
  double tls_send_s_per_byte = 0, tls_recv_s_per_byte = 0;
  double tcp_send_s_per_byte = 0, tcp_recv_s_per_byte = 0;  // plain TCP (0: not calibrated)
  // The durable receivers' commit (sorted by change_rate); empty when not calibrated.
  std::vector<CommitPoint> commit;
  std::string commit_source;
  bool has_commit() const { return !commit.empty(); }
  // Linear interpolation in change rate, clamped to the measured range. REQUIRES: has_commit().
  double CommitSPerStorageByte(double rate) const;
  double PlainWriteBytesPerS(double rate) const;
  double DurableApplyCpuSPerStorageByte(double rate) const;

  // Switches every bandwidth to its wall-clock variant where the file has one.
  void UseWallClock();

  // Linear interpolation in change rate, clamped to the measured range.
  double EncodeBytesPerS(double rate) const;
  double DecodeApplyBytesPerS(double rate) const;
  // Context-coded delta (has_context): speeds per core, measured with at most context_classes
  // classes per chunk (the bench JSON's "context_classes"; files without it were measured at the
  // default, kContextClassesMax).
  bool has_context = false;
  int context_classes = kContextClassesMax;
  double ContextEncodeBytesPerS(double rate) const;
  double ContextTranscodeBytesPerS(double rate) const;
};

// Parses the JSON text. kInvalidArgument naming the missing or bad key.
StatusOr<Calibration> ParseCalibration(const std::string& json_text, const std::string& source);
// Reads and parses a file. kNotFound if it cannot be read.
StatusOr<Calibration> LoadCalibration(const std::string& path);

}  // namespace dcr::sim::internal

#endif  // DCR_SIM_ENGINE_CALIBRATION_H_
