// The C API (dcr_c.h): recording and receiving for runtimes that are not C++ dcr users.
#include <cstring>
#include <memory>
#include <string>

#include "dcr/dcr_c.h"
#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/receiver.h"
#include "dcr/runtime.h"
#include "dcr/status_macros.h"
#include "receivers/c_error.h"
#include "receivers/recorder.h"

namespace {

thread_local std::string t_last_error;

int Fail(const dcr::Status& s) { return dcr::internal::CFail(s); }

}  // namespace

int dcr::internal::CFail(const dcr::Status& s) {
  t_last_error = s.ToString();
  return static_cast<int>(s.code());
}

struct dcr_recorder {
  std::unique_ptr<dcr::Checkpoint> ckpt;
  std::unique_ptr<dcr::internal::CopyRecorder> rec;
  std::vector<std::pair<uint8_t*, uint64_t>> buffers;
};

// One rank's receiver over the runtime's own host buffers: a ServingReplica attached to them.
struct dcr_receiver {
  dcr::PlacementMap map;  // what dcr_receiver_stats reports
  std::unique_ptr<dcr::ServingReplica> replica;
};

extern "C" {

const char* dcr_last_error(void) { return t_last_error.c_str(); }

int dcr_recorder_begin(const char* path, dcr_recorder** out) {
  if (path == nullptr || out == nullptr) return Fail(dcr::InvalidArgumentError("null argument"));
  auto r = std::make_unique<dcr_recorder>();
  auto ck = dcr::Checkpoint::Open(path);
  if (!ck.ok()) return Fail(ck.status());
  if ((*ck)->sharded()) {
    return Fail(dcr::InvalidArgumentError(
        std::string("dcr_recorder_begin: ") + path + " is a sharded checkpoint (" +
        std::to_string((*ck)->files().size()) +
        " shards); the recorder records copies from one safetensors file: give it a single-file "
        "checkpoint"));
  }
  r->ckpt = std::move(ck).value();
  r->rec = std::make_unique<dcr::internal::CopyRecorder>(*r->ckpt);
  dcr::Status s = r->rec->Start();
  if (!s.ok()) return Fail(s);
  *out = r.release();
  return DCR_OK;
}

const void* dcr_recorder_tensor_data(dcr_recorder* r, const char* name, uint64_t* nbytes) {
  const dcr::TensorInfo* t = r ? r->ckpt->Find(name ? name : "") : nullptr;
  if (t == nullptr) return nullptr;
  if (nbytes) *nbytes = t->nbytes;
  return r->ckpt->data(*t);
}

int dcr_recorder_add_source(dcr_recorder* r, const void* file_base, uint64_t file_size) {
  if (r == nullptr || file_base == nullptr) return Fail(dcr::InvalidArgumentError("null argument"));
  if (file_size != r->ckpt->file_size()) {
    return Fail(
        dcr::InvalidArgumentError("dcr_recorder_add_source: size differs from the checkpoint"));
  }
  r->rec->AddSource(static_cast<const uint8_t*>(file_base), file_size);
  return DCR_OK;
}

int dcr_recorder_add_buffer(dcr_recorder* r, const char* name, void* data, uint64_t nbytes) {
  if (r == nullptr || name == nullptr || data == nullptr) {
    return Fail(dcr::InvalidArgumentError("null argument"));
  }
  r->rec->AddBuffer(name, static_cast<uint8_t*>(data), nbytes);
  r->buffers.emplace_back(static_cast<uint8_t*>(data), nbytes);
  r->rec->ReplayPending();
  return DCR_OK;
}

int dcr_recorder_set_tensor(dcr_recorder* r, const char* name) {
  if (r == nullptr) return Fail(dcr::InvalidArgumentError("null recorder"));
  if (name == nullptr) {
    r->rec->SetTensor(-1);
    return DCR_OK;
  }
  const int64_t t = r->rec->TensorIndex(name);
  if (t < 0)
    return Fail(dcr::NotFoundError(std::string("no tensor ") + name + " in the checkpoint"));
  r->rec->SetTensor(t);
  return DCR_OK;
}

int dcr_recorder_end(dcr_recorder* r, dcr_reload_fn reload, void* reload_ctx, dcr_receiver** out) {
  if (r == nullptr || out == nullptr) return Fail(dcr::InvalidArgumentError("null argument"));
  std::unique_ptr<dcr_recorder> owned(r);
  auto rx = std::make_unique<dcr_receiver>();
  dcr::ServingReplica::AttachedRank rank;
  rank.map = r->rec->Finish();
  for (const auto& [data, nbytes] : r->buffers) rank.buffers.push_back(data);
  rx->map = rank.map;
  dcr::ServingReplica::ReloadFn fn;
  if (reload != nullptr) {
    fn = [reload, reload_ctx](int, const dcr::WeightRef& w) {
      const int rc = reload(reload_ctx, w.name.c_str(), w.data, w.nbytes);
      if (rc == 0) return dcr::Status::OK();
      return dcr::Status(static_cast<dcr::StatusCode>(rc), "reload callback failed for " + w.name);
    };
  }
  std::vector<dcr::ServingReplica::AttachedRank> ranks;
  ranks.push_back(std::move(rank));
  auto replica = dcr::ServingReplica::Attach(std::move(ranks), *r->ckpt, 0, std::move(fn));
  if (!replica.ok()) return Fail(replica.status());
  rx->replica = std::move(replica).value();
  *out = rx.release();
  return DCR_OK;
}

int dcr_receiver_begin(dcr_receiver* rx, const void* header, size_t size) {
  if (rx == nullptr || header == nullptr) return Fail(dcr::InvalidArgumentError("null argument"));
  dcr::Status s = rx->replica->Begin(static_cast<const uint8_t*>(header), size);
  return s.ok() ? DCR_OK : Fail(s);
}

int dcr_receiver_apply_chunk(dcr_receiver* rx, const void* record, size_t size) {
  if (rx == nullptr || record == nullptr) return Fail(dcr::InvalidArgumentError("null argument"));
  dcr::Status s = rx->replica->ApplyRecord(static_cast<const uint8_t*>(record), size);
  return s.ok() ? DCR_OK : Fail(s);
}

int dcr_receiver_finish(dcr_receiver* rx, const void* trailer, size_t size) {
  if (rx == nullptr || trailer == nullptr) return Fail(dcr::InvalidArgumentError("null argument"));
  dcr::Status s = rx->replica->Commit(static_cast<const uint8_t*>(trailer), size);
  return s.ok() ? DCR_OK : Fail(s);
}

int dcr_receiver_verify(const dcr_receiver* rx, const char* target_path) {
  if (rx == nullptr || target_path == nullptr) {
    return Fail(dcr::InvalidArgumentError("null argument"));
  }
  dcr::Status s = dcr::VerifyFile(*rx->replica, target_path);
  return s.ok() ? DCR_OK : Fail(s);
}

int dcr_receiver_version(const dcr_receiver* rx, uint64_t* number, uint64_t hash[2],
                         int* in_delta) {
  if (rx == nullptr) return Fail(dcr::InvalidArgumentError("null receiver"));
  const dcr::VersionId v = rx->replica->held();
  if (number) *number = v.number;
  if (hash) {
    hash[0] = v.hash.lo;
    hash[1] = v.hash.hi;
  }
  if (in_delta) *in_delta = rx->replica->in_delta() ? 1 : 0;
  return DCR_OK;
}

void dcr_receiver_stats(const dcr_receiver* rx, uint64_t* bit_preserving, uint64_t* converted,
                        uint64_t* constant) {
  if (rx == nullptr) return;
  if (bit_preserving) *bit_preserving = rx->map.bit_preserving_bytes();
  if (converted) *converted = rx->map.converted_bytes();
  if (constant) *constant = rx->map.constant_bytes();
}

void dcr_receiver_free(dcr_receiver* rx) { delete rx; }

}  // extern "C"
