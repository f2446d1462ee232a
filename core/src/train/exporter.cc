// The exporter's generic part: whole checkpoints from ExportTensor (in parallel over tensors).
#include "dcr/status_macros.h"
#include "dcr/train.h"
#include "train/train_internal.h"

namespace dcr {

StatusOr<std::vector<uint8_t>> Exporter::ExportAll(const ShardReader& shards, int threads) const {
  const auto& canon = structure().canonical();
  std::vector<uint64_t> off(canon.size() + 1, 0);
  for (size_t i = 0; i < canon.size(); ++i) off[i + 1] = off[i] + canon[i].nbytes();
  std::vector<uint8_t> out(off.back());
  std::vector<Status> st(canon.size());
  internal::ParallelForEach(canon.size(), threads, [&](uint64_t i) {
    st[i] = ExportTensor(shards, i, out.data() + off[i]);
  });
  for (auto& x : st) DCR_RETURN_IF_ERROR(x);
  return out;
}

namespace {
std::vector<TensorView> Views(const std::vector<TensorSpec>& canon, const uint8_t* data) {
  std::vector<TensorView> v;
  uint64_t off = 0;
  for (const auto& t : canon) {
    v.push_back(TensorView{t.name, t.dtype, t.shape, data + off, t.nbytes()});
    off += t.nbytes();
  }
  return v;
}
}  // namespace

StatusOr<std::vector<uint8_t>> Exporter::ExportFileImage(const ShardReader& shards,
                                                         int threads) const {
  DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> data, ExportAll(shards, threads));
  return SafetensorsImage(Views(structure().canonical(), data.data()));
}

Status Exporter::ExportFile(const ShardReader& shards, const std::string& path, int threads) const {
  DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> data, ExportAll(shards, threads));
  return WriteSafetensors(path, Views(structure().canonical(), data.data()));
}

Status Exporter::ExportDirectory(const ShardReader& shards, const std::string& dir,
                                 uint64_t shard_bytes, int threads) const {
  DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> data, ExportAll(shards, threads));
  return WriteShardedCheckpoint(dir, Views(structure().canonical(), data.data()), shard_bytes);
}

}  // namespace dcr
