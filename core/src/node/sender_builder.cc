// SenderBuilder (sender_builder.h).
#include "node/sender_builder.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/commitment.h"
#include "dcr/delta.h"
#include "dcr/node.h"
#include "dcr/receiver.h"
#include "dcr/recovery_policy.h"
#include "dcr/relay_policy.h"
#include "dcr/signing.h"
#include "dcr/status.h"
#include "dcr/status_macros.h"
#include "dcr/sums.h"
#include "dcr/transport.h"
#include "internal/mapped_file.h"
#include "node/node_state.h"
#include "node/node_trust.h"
#include "node/trainer_delta.h"
#include "transport/net.h"

namespace dcr::internal {

namespace {

// Collects the streamed delta into blobs (header 0, chunks 1.., trailer last).
class StreamingSink : public DeltaSink {
 public:
  explicit StreamingSink(std::function<Status(BlobKind, std::vector<uint8_t>)> emit)
      : emit_(std::move(emit)) {}
  Status OnHeader(const std::vector<uint8_t>& bytes) override {
    return emit_(BlobKind::kHeader, bytes);
  }
  Status OnChunk(const ChunkHeader&, const std::vector<uint8_t>& bytes) override {
    return emit_(BlobKind::kChunk, bytes);
  }
  // A manifest record travels as a chunk blob: relays forward it like any record, receivers
  // tell it by its magic.
  Status OnManifest(const std::vector<uint8_t>& bytes) override {
    return emit_(BlobKind::kChunk, bytes);
  }
  Status OnTrailer(const std::vector<uint8_t>& bytes) override {
    return emit_(BlobKind::kTrailer, bytes);
  }

 private:
  std::function<Status(BlobKind, std::vector<uint8_t>)> emit_;
};

}  // namespace

Status SenderBuilder::LoadCheckpoints() {
  auto open = [](const std::string& path, std::unique_ptr<Checkpoint>* out) -> Status {
    auto c = Checkpoint::Open(path);
    if (!c.ok()) return c.status().WithContext("sender");
    *out = std::move(*c);
    return Status();
  };
  DCR_RETURN_IF_ERROR(open(plan_.target_path, &target_ckpt_));
  state_->result()->dense_bytes = target_ckpt_->total_tensor_bytes();
  // A delta built here needs the base; the trainer's delta (plan.delta_path) is streamed as
  // it is, checked against the base's hash by RunNodeVersions.
  const bool delta = plan_.method == "delta" && plan_.delta_path.empty();
  if (delta) {
    DCR_RETURN_IF_ERROR(open(plan_.base_path, &base_ckpt_));
    // Refused here, at start, not when the build reaches the tensor: headers only.
    Status compatible = CheckDeltaCompatible(*base_ckpt_, *target_ckpt_);
    if (!compatible.ok()) return compatible.WithContext("sender");
  }
  // Every file of a checkpoint (each shard of a directory).
  auto files_bytes = [](const Checkpoint& c) {
    double sum = 0;
    for (const CheckpointFile& f : c.files()) sum += static_cast<double>(f.size);
    return sum;
  };
  auto make_resident = [](const Checkpoint& c, const std::string& path) -> Status {
    for (const CheckpointFile& f : c.files()) {
      DCR_RETURN_IF_ERROR(
          internal::MakeResident(f.data, f.size, f.name.empty() ? path : path + "/" + f.name));
    }
    return Status();
  };
  const double bytes = files_bytes(*target_ckpt_) + (delta ? files_bytes(*base_ckpt_) : 0.0);
  // Free memory, or the memory cgroup's limit when that is smaller (the page cache is charged
  // against it).
  const double free_bytes = std::min(
      static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE)),
      static_cast<double>(internal::MemoryCgroupLimit()));
  if (bytes <= 0.5 * free_bytes) {
    DCR_RETURN_IF_ERROR(make_resident(*target_ckpt_, plan_.target_path));
    if (delta) DCR_RETURN_IF_ERROR(make_resident(*base_ckpt_, plan_.base_path));
  } else {
    std::fprintf(stderr,
                 "sender: checkpoints (%.1f GB) exceed half the free memory (%.1f GB): "
                 "read during the build\n",
                 bytes / 1e9, free_bytes / 1e9);
  }
  if (delta && !plan_.base_sums.empty()) known_base_hash_ = BaseHashFromSums();
  // Cached: BuildDelta's header uses it.
  if (delta && known_base_hash_ == Hash128{}) base_ckpt_->ContentHash(plan_.build_threads);
  // The delta's changes are found on the plan's device (plan.device "host" | "cuda"); the full
  // reference streams file bytes and needs none.
  DCR_ASSIGN_OR_RETURN(device_, OpenPlanDevice(plan_, delta, "sender"));
  if (!plan_.signing_key.empty()) {  // the delta, or the full stream (node_trust.h)
    auto key = SigningKey::Load(plan_.signing_key);
    if (!key.ok()) return key.status().WithContext("sender");
    signing_key_ = std::move(*key);
  }
  return Status();
}

StatusOr<SignOptions> SenderBuilder::SigningOptions() {
  SignOptions so;
  so.run_id = plan_.run_id;
  if (signing_key_) {
    // The version the delta makes is the plan's target: the final manifest signs its
    // commitment and leaves (dcr/commitment.h).
    auto c = CheckpointCommitment(*target_ckpt_, plan_.build_threads);
    if (!c.ok()) return c.status().WithContext("sender: commitment of the target");
    so.commitment = c->root;
    so.commitment_leaves = std::move(c->leaves);
    std::lock_guard<std::mutex> lock(mu_);
    signed_commitment_ = c->root;
  }
  return so;
}

void SenderBuilder::Build() {
  BlobId next = 0;
  std::vector<std::vector<uint8_t>> held;  // shuffle_seed: chunks held back
  std::function<Status(BlobKind, std::vector<uint8_t>)> emit_now;
  auto emit = [&](BlobKind kind, std::vector<uint8_t> bytes) -> Status {
    if (plan_.shuffle_seed == 0 || kind == BlobKind::kHeader) {
      return emit_now(kind, std::move(bytes));
    }
    if (kind == BlobKind::kChunk) {
      held.push_back(std::move(bytes));
      return Status();
    }
    std::mt19937_64 rng(plan_.shuffle_seed);
    std::shuffle(held.begin(), held.end(), rng);
    for (auto& h : held) DCR_RETURN_IF_ERROR(emit_now(BlobKind::kChunk, std::move(h)));
    return emit_now(kind, std::move(bytes));
  };
  emit_now = [&](BlobKind kind, std::vector<uint8_t> bytes) -> Status {
    auto b = std::make_shared<BlobBuf>();
    b->info = BlobInfo{next++, kind, bytes.size()};
    b->bytes = std::move(bytes);
    state_->Store(b);
    const double now = WallNow();
    state_->Update([&](NodeResult* r) {
      NodeState::MarkBlob(r, now);
      r->payload_bytes += b->info.size;
      r->blobs++;
    });
    queue_->Post(event::BlobProduced{b->info});
    return Status();
  };
  Status s;
  if (plan_.method == "delta" && !plan_.delta_path.empty()) {  // the trainer's delta
    StreamingSink stream(emit);
    StatusOr<SignOptions> so = SigningOptions();
    if (!so.ok()) {
      queue_->Fatal(so.status());
      return;
    }
    SigningSink signing(signing_key_.get(), *std::move(so), &stream);
    s = internal::StreamDeltaFile(plan_.delta_path,
                                  signing_key_ ? static_cast<DeltaSink*>(&signing) : &stream);
  } else if (plan_.method == "delta") {  // checkpoints loaded by LoadCheckpoints
    DeltaOptions o;
    o.chunk_elems = plan_.chunk_elems;
    o.zstd_level = plan_.zstd_level;
    o.context_coding = plan_.context_coding;
    o.context_classes = plan_.context_classes;
    o.threads = plan_.build_threads;
    o.known_base_hash = known_base_hash_;
    if (plan_.version > 0) {  // the version this refit delivers, from its base version
      o.base_version =
          plan_.base_version >= 0 ? static_cast<uint64_t>(plan_.base_version) : plan_.version - 1;
      o.target_version = plan_.version;
    } else if (plan_.base_version >= 0) {  // one refit numbered by its deployment's state
      o.base_version = static_cast<uint64_t>(plan_.base_version);
      o.target_version = o.base_version + 1;
    }
    StreamingSink stream(emit);
    StatusOr<SignOptions> so = SigningOptions();
    if (!so.ok()) {
      queue_->Fatal(so.status());
      return;
    }
    SigningSink signing(signing_key_.get(), *std::move(so), &stream);
    DeltaSink* sink = signing_key_ ? static_cast<DeltaSink*>(&signing) : &stream;
    // device_ null (device "cpu"): BuildDelta's host diff.
    auto st = BuildDeltaOnDevice(base_ckpt_.get(), *target_ckpt_, o, device_.get(), sink);
    if (st.ok()) {
      state_->Update([&](NodeResult* r) { r->dense_bytes = st->dense_bytes; });
      if (!plan_.target_sums.empty()) {
        // The refit does not depend on it: a failed write costs the next version a full hash.
        Status ws = WriteSums(plan_.target_sums,
                              ComputeSums(*target_ckpt_, st->target_hash, plan_.build_threads));
        if (!ws.ok()) {
          std::fprintf(stderr, "sender: target sums not written: %s\n", ws.ToString().c_str());
        }
      }
    }
    s = st.status();
  } else if (signing_key_ != nullptr) {  // signed slices (node_trust.h FullStreamSigner)
    internal::FullStreamSigner signer(signing_key_.get(), plan_.run_id, plan_.version, emit);
    s = FullStreamBlobs(
        plan_.target_path, plan_.full_slice_bytes,
        [&signer](BlobKind k, std::vector<uint8_t> b) { return signer(k, std::move(b)); });
  } else {
    s = FullStreamBlobs(plan_.target_path, plan_.full_slice_bytes, emit);
  }
  if (!s.ok()) queue_->Fatal(s.WithContext("sender: building the stream"));
}

Hash128 SenderBuilder::BaseHashFromSums() const {
  auto sums = ReadSums(plan_.base_sums);
  Status ok = sums.ok() ? CheckSums(*base_ckpt_, *sums, plan_.build_threads) : sums.status();
  if (!ok.ok()) {
    std::fprintf(stderr, "sender: base sums not used, hashing the base: %s\n",
                 ok.ToString().c_str());
    return Hash128{};
  }
  return sums->content_hash;
}

}  // namespace dcr::internal
