// dcr/publisher_c.h's layout functions and the per-rank shard feed (shard_feed.h).
#include "publisher/shard_feed.h"

#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/model.h"
#include "dcr/status_macros.h"

struct dcr_shard_reader {
  const dcr::ShardReader* reader;
  const dcr::TrainStructure* s;
};

namespace dcr::internal {

namespace {

std::string BufferName(const TrainStructure& s, int r, int b) {
  return "rank " + std::to_string(r) + " buffer " + std::to_string(b) + " (" +
         s.ranks()[r].buffers[b].name + ")";
}

class CExporter : public Exporter {
 public:
  CExporter(std::shared_ptr<const TrainStructure> s, dcr_export_fn fn, void* user)
      : Exporter(std::move(s)), fn_(fn), user_(user) {}
  Status ExportTensor(const ShardReader& shards, size_t t, uint8_t* out) const override {
    if (t >= structure().canonical().size()) {
      return InvalidArgumentError("exporter: tensor index " + std::to_string(t) + " out of range");
    }
    dcr_shard_reader reader{&shards, &structure()};
    const int rc = fn_(user_, &reader, t, out);
    if (rc == 0) return Status();
    const StatusCode code = rc > 0 && rc <= static_cast<int>(StatusCode::kAborted)
                                ? static_cast<StatusCode>(rc)
                                : StatusCode::kInternal;
    return Status(code, "the trainer's exporter returned " + std::to_string(rc) + " for tensor " +
                            structure().canonical()[t].name);
  }

 private:
  dcr_export_fn fn_;
  void* user_;
};

}  // namespace

StatusOr<ShardSet> CopyShards(const TrainStructure& s, const dcr_shard* shards, size_t n) {
  if (shards == nullptr && n > 0) return InvalidArgumentError("shards is NULL");
  ShardSet set;
  set.buffers.resize(s.ranks().size());
  std::vector<std::vector<bool>> seen(s.ranks().size());
  for (size_t r = 0; r < s.ranks().size(); ++r) {
    set.buffers[r].resize(s.ranks()[r].buffers.size());
    seen[r].assign(s.ranks()[r].buffers.size(), false);
  }
  for (size_t i = 0; i < n; ++i) {
    const dcr_shard& d = shards[i];
    if (d.rank < 0 || d.rank >= static_cast<int>(s.ranks().size())) {
      return InvalidArgumentError("shard " + std::to_string(i) + ": rank " +
                                  std::to_string(d.rank) + " outside the layout's " +
                                  std::to_string(s.ranks().size()) + " model-parallel ranks");
    }
    const RankSpec& rk = s.ranks()[d.rank];
    if (d.buffer < 0 || d.buffer >= static_cast<int>(rk.buffers.size())) {
      return InvalidArgumentError(
          "shard " + std::to_string(i) + ": rank " + std::to_string(d.rank) + " has no buffer " +
          std::to_string(d.buffer) + " (it holds " + std::to_string(rk.buffers.size()) + ")");
    }
    const std::string what = BufferName(s, d.rank, d.buffer);
    if (seen[d.rank][d.buffer])
      return InvalidArgumentError("shard " + std::to_string(i) + ": " + what + " given twice");
    const BufferSpec& b = rk.buffers[d.buffer];
    const uint64_t want = b.numel * static_cast<uint64_t>(b.width());
    if (d.nbytes != want) {
      return InvalidArgumentError("shard " + std::to_string(i) + ": " + what + " has " +
                                  std::to_string(d.nbytes) + " bytes; the layout's buffer holds " +
                                  std::to_string(b.numel) + " " + std::string(DTypeName(b.dtype)) +
                                  " elements = " + std::to_string(want) + " bytes");
    }
    if (d.data == nullptr && want > 0) {
      return InvalidArgumentError("shard " + std::to_string(i) + ": " + what + ": data is NULL");
    }
    seen[d.rank][d.buffer] = true;
    const auto* p = static_cast<const uint8_t*>(d.data);
    set.buffers[d.rank][d.buffer].assign(p, p + want);
  }
  for (size_t r = 0; r < seen.size(); ++r) {
    for (size_t b = 0; b < seen[r].size(); ++b) {
      if (!seen[r][b]) {
        return InvalidArgumentError(
            "missing shard: " + BufferName(s, static_cast<int>(r), static_cast<int>(b)) +
            " (one shard per buffer of every rank: " + std::to_string(n) + " given)");
      }
    }
  }
  return set;
}

std::shared_ptr<const Exporter> MakeCExporter(std::shared_ptr<const TrainStructure> s,
                                              dcr_export_fn fn, void* user) {
  return std::make_shared<CExporter>(std::move(s), fn, user);
}

StatusOr<std::unique_ptr<ShardFeed>> ShardFeed::Create(std::shared_ptr<const TrainStructure> s,
                                                       std::shared_ptr<const Exporter> exporter,
                                                       uint64_t base_version, ShardSet base,
                                                       const ShardFeedOptions& options) {
  std::unique_ptr<ShardFeed> f(new ShardFeed());
  f->s_ = std::move(s);
  f->exporter_ = std::move(exporter);
  f->options_ = options;
  f->base_version_ = base_version;
  f->base_ = std::move(base);
  DCR_ASSIGN_OR_RETURN(auto map, LayoutMap::Discover(*f->exporter_, options.threads));
  TrainDeltaOptions o;
  o.chunk_elems = options.chunk_elems;
  o.zstd_level = options.zstd_level;
  o.threads = options.threads;
  DCR_ASSIGN_OR_RETURN(f->builder_,
                       TrainDeltaBuilder::Create(f->s_, std::move(map), f->exporter_, f->base_, o));
  return f;
}

Status ShardFeed::Step(uint64_t version, ShardSet next, const std::string& checkpoint_path,
                       const std::string& delta_path) {
  ShardSetReader reader(*s_, next);
  DCR_RETURN_IF_ERROR(exporter_->ExportFile(reader, checkpoint_path, options_.threads)
                          .WithContext("exporting version " + std::to_string(version)));
  builder_->SetNextVersions(base_version_, version);
  DeltaFileSink sink(delta_path);
  auto st = builder_->BuildStep(base_, next, &sink);
  if (!st.ok()) {
    builder_->SetNextVersions(base_version_, base_version_ + 1);
    return st.status().WithContext("the per-rank delta of version " + std::to_string(version));
  }
  base_ = std::move(next);
  base_version_ = version;
  return Status();
}

}  // namespace dcr::internal

namespace {

// Opens *out over the structure `make` gives, for the two ways a layout is described: the C API's
// allocation, its error text (an exception named after `fn`) and the per-rank buffer dtypes.
int OpenTrainLayout(
    const char* fn, dcr_train_layout** out,
    const std::function<dcr::StatusOr<std::shared_ptr<const dcr::TrainStructure>>()>& make) {
  if (out == nullptr) return static_cast<int>(dcr::StatusCode::kInvalidArgument);
  *out = new (std::nothrow) dcr_train_layout();
  if (*out == nullptr) return static_cast<int>(dcr::StatusCode::kResourceExhausted);
  dcr_train_layout* l = *out;
  auto fail = [l](const dcr::Status& s) {
    l->error = s.ToString();
    return static_cast<int>(s.code());
  };
  try {
    auto s = make();
    if (!s.ok()) return fail(s.status());
    l->s = std::move(*s);
    for (const dcr::RankSpec& rk : l->s->ranks()) {
      std::vector<std::string> names;
      for (const dcr::BufferSpec& b : rk.buffers) names.emplace_back(dcr::DTypeName(b.dtype));
      l->buffer_dtypes.push_back(std::move(names));
    }
    return 0;
  } catch (const std::exception& e) {
    return fail(dcr::InternalError(std::string(fn) + ": " + e.what()));
  }
}

}  // namespace

extern "C" {

const void* dcr_shard_read(const dcr_shard_reader* shards, int rank, int buffer, uint64_t begin,
                           uint64_t count) {
  if (shards == nullptr || rank < 0 || rank >= static_cast<int>(shards->s->ranks().size())) {
    return nullptr;
  }
  const dcr::RankSpec& rk = shards->s->ranks()[rank];
  if (buffer < 0 || buffer >= static_cast<int>(rk.buffers.size())) return nullptr;
  const uint64_t numel = rk.buffers[buffer].numel;
  if (begin > numel || count > numel - begin) return nullptr;
  return shards->reader->Read(rank, buffer, begin, count);
}

int dcr_train_layout_open(const char* model, const char* layout, dcr_train_layout** out) {
  return OpenTrainLayout("dcr_train_layout_open", out,
                         [&]() -> dcr::StatusOr<std::shared_ptr<const dcr::TrainStructure>> {
                           if (model == nullptr || layout == nullptr) {
                             return dcr::InvalidArgumentError("model and layout are required");
                           }
                           DCR_ASSIGN_OR_RETURN(auto cfg, dcr::GetPreset(model));
                           auto lay = dcr::TrainLayout::Parse(layout);
                           if (!lay.ok()) return lay.status().WithContext("layout");
                           auto s = dcr::TrainStructure::Create(cfg, *lay);
                           if (!s.ok()) return s.status().WithContext("layout");
                           return s;
                         });
}

int dcr_train_layout_open_spec(const char* spec_path, const char* checkpoint_path,
                               dcr_train_layout** out) {
  return OpenTrainLayout(
      "dcr_train_layout_open_spec", out,
      [&]() -> dcr::StatusOr<std::shared_ptr<const dcr::TrainStructure>> {
        if (spec_path == nullptr || checkpoint_path == nullptr) {
          return dcr::InvalidArgumentError("spec_path and checkpoint_path are required");
        }
        DCR_ASSIGN_OR_RETURN(auto text, dcr::ReadFile(spec_path));
        DCR_ASSIGN_OR_RETURN(auto ck, dcr::Checkpoint::Open(checkpoint_path));
        std::vector<dcr::TensorSpec> tensors;
        for (const dcr::TensorInfo& t : ck->tensors()) {
          tensors.push_back(dcr::TensorSpec{t.name, t.dtype_name, t.shape});
        }
        auto s =
            dcr::TrainStructure::FromLayoutSpec(std::string(text.begin(), text.end()), tensors);
        if (!s.ok()) return s.status().WithContext(spec_path);
        return s;
      });
}

const char* dcr_train_layout_error(const dcr_train_layout* l) {
  return l == nullptr ? "" : l->error.c_str();
}

void dcr_train_layout_close(dcr_train_layout* l) { delete l; }

int dcr_train_layout_ranks(const dcr_train_layout* l) {
  return l == nullptr || l->s == nullptr ? 0 : static_cast<int>(l->s->ranks().size());
}

static const dcr::RankSpec* RankOf(const dcr_train_layout* l, int rank) {
  if (l == nullptr || l->s == nullptr || rank < 0 ||
      rank >= static_cast<int>(l->s->ranks().size())) {
    return nullptr;
  }
  return &l->s->ranks()[rank];
}

size_t dcr_train_layout_buffers(const dcr_train_layout* l, int rank) {
  const dcr::RankSpec* rk = RankOf(l, rank);
  return rk == nullptr ? 0 : rk->buffers.size();
}

size_t dcr_train_layout_params(const dcr_train_layout* l, int rank) {
  const dcr::RankSpec* rk = RankOf(l, rank);
  return rk == nullptr ? 0 : rk->params.size();
}

int dcr_train_layout_buffer(const dcr_train_layout* l, int rank, size_t i, dcr_train_buffer* out) {
  const dcr::RankSpec* rk = RankOf(l, rank);
  if (rk == nullptr || out == nullptr || i >= rk->buffers.size()) {
    return static_cast<int>(dcr::StatusCode::kInvalidArgument);
  }
  out->name = rk->buffers[i].name.c_str();
  out->dtype = l->buffer_dtypes[rank][i].c_str();
  out->numel = rk->buffers[i].numel;
  return 0;
}

int dcr_train_layout_param(const dcr_train_layout* l, int rank, size_t i, dcr_train_param* out) {
  const dcr::RankSpec* rk = RankOf(l, rank);
  if (rk == nullptr || out == nullptr || i >= rk->params.size()) {
    return static_cast<int>(dcr::StatusCode::kInvalidArgument);
  }
  const dcr::LocalParam& p = rk->params[i];
  out->name = p.name.c_str();
  out->buffer = p.buffer;
  out->offset = p.offset;
  out->numel = p.numel;
  out->shape = p.shape.data();
  out->ndim = p.shape.size();
  out->replica = p.replica ? 1 : 0;
  return 0;
}

long dcr_train_layout_find_param(const dcr_train_layout* l, int rank, const char* name) {
  const dcr::RankSpec* rk = RankOf(l, rank);
  if (rk == nullptr || name == nullptr) return -1;
  return rk->FindParam(name);
}

size_t dcr_train_layout_tensors(const dcr_train_layout* l) {
  return l == nullptr || l->s == nullptr ? 0 : l->s->canonical().size();
}

int dcr_train_layout_tensor(const dcr_train_layout* l, size_t t, dcr_tensor* out) {
  if (l == nullptr || l->s == nullptr || out == nullptr || t >= l->s->canonical().size()) {
    return static_cast<int>(dcr::StatusCode::kInvalidArgument);
  }
  const dcr::TensorSpec& spec = l->s->canonical()[t];
  out->name = spec.name.c_str();
  out->dtype = spec.dtype.c_str();
  out->shape = spec.shape.data();
  out->ndim = spec.shape.size();
  out->data = nullptr;
  out->nbytes = spec.nbytes();
  return 0;
}

int dcr_train_layout_export(const dcr_train_layout* l, dcr_export_fn fn, void* user,
                            const dcr_shard* shards, size_t n, const char* path) {
  if (l == nullptr || l->s == nullptr || fn == nullptr || path == nullptr) {
    return static_cast<int>(dcr::StatusCode::kInvalidArgument);
  }
  auto* m = const_cast<dcr_train_layout*>(l);
  try {
    auto set = dcr::internal::CopyShards(*l->s, shards, n);
    dcr::Status s = set.status();
    if (s.ok()) {
      auto exporter = dcr::internal::MakeCExporter(l->s, fn, user);
      s = exporter->ExportFile(dcr::ShardSetReader(*l->s, *set), path);
    }
    m->error = s.ok() ? "" : s.ToString();
    return static_cast<int>(s.code());
  } catch (const std::exception& e) {
    m->error = std::string("dcr_train_layout_export: ") + e.what();
    return static_cast<int>(dcr::StatusCode::kInternal);
  }
}

}  // extern "C"
