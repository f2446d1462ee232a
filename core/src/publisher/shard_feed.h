// The per-rank shard side of dcr/publisher_c.h: the layout handle, the C exporter behind the
// Exporter seam, and ShardFeed, which turns each version's rank shards into the trainer's delta
// (TrainDeltaBuilder) and the canonical checkpoint.
//
// Thread safety: ShardFeed is thread-compatible (the publisher's caller serializes it).
#ifndef DCR_CORE_SRC_PUBLISHER_SHARD_FEED_H_
#define DCR_CORE_SRC_PUBLISHER_SHARD_FEED_H_

#include <memory>
#include <string>
#include <vector>

#include "dcr/publisher_c.h"
#include "dcr/status.h"
#include "dcr/statusor.h"
#include "dcr/train.h"

struct dcr_train_layout {
  std::shared_ptr<const dcr::TrainStructure> s;
  std::vector<std::vector<std::string>> buffer_dtypes;  // [rank][buffer] dtype names
  std::string error;
};

namespace dcr::internal {

// The rank shards of one version as the layout holds them: exactly one dcr_shard per buffer of
// every rank, each of the buffer's size. kInvalidArgument naming the rank and buffer for a rank
// or buffer out of range, a duplicate, a NULL data pointer, a wrong size or a missing shard.
StatusOr<ShardSet> CopyShards(const TrainStructure& s, const dcr_shard* shards, size_t n);

// The trainer's exporter callback as an Exporter.
std::shared_ptr<const Exporter> MakeCExporter(std::shared_ptr<const TrainStructure> s,
                                              dcr_export_fn fn, void* user);

struct ShardFeedOptions {
  uint64_t chunk_elems = uint64_t{1} << 22;  // the plan's
  int zstd_level = 1;
  int threads = 0;
};

class ShardFeed {
 public:
  // Discovers the map of `exporter` and prepares the builder on `base`, the shards of version
  // `base_version`. Errors: LayoutMap::Discover's and TrainDeltaBuilder::Create's (those of
  // the exporter callback among them).
  static StatusOr<std::unique_ptr<ShardFeed>> Create(std::shared_ptr<const TrainStructure> s,
                                                     std::shared_ptr<const Exporter> exporter,
                                                     uint64_t base_version, ShardSet base,
                                                     const ShardFeedOptions& options);
  // The canonical content hash of the shards the next version is diffed against.
  Hash128 base_hash() const { return builder_->base_hash(); }
  uint64_t base_version() const { return base_version_; }
  const TrainStructure& structure() const { return *s_; }

  // Version `version` from `next`: its canonical checkpoint exported to `checkpoint_path` and the
  // delta from base_version() built rank by rank to `delta_path` (both written atomically); then
  // `next` is the base. Errors: the exporter's, the builder's, I/O; on error the base stays.
  Status Step(uint64_t version, ShardSet next, const std::string& checkpoint_path,
              const std::string& delta_path);

 private:
  ShardFeed() = default;
  std::shared_ptr<const TrainStructure> s_;
  std::shared_ptr<const Exporter> exporter_;
  std::unique_ptr<TrainDeltaBuilder> builder_;
  ShardFeedOptions options_;
  uint64_t base_version_ = 0;
  ShardSet base_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_PUBLISHER_SHARD_FEED_H_
