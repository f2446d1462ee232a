// A Receiver layer that hands every call to the receiver below it: the base of a layer that
// hooks some calls (durability bookkeeping, header capture, fault points) and passes the rest.
//
// Thread safety: as the inner receiver's; the layer adds no state.
#ifndef DCR_CORE_SRC_RECEIVERS_FORWARDING_RECEIVER_H_
#define DCR_CORE_SRC_RECEIVERS_FORWARDING_RECEIVER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dcr/receiver.h"

namespace dcr::internal {

class ForwardingReceiver : public Receiver {
 public:
  // `inner` is not owned and must outlive this object.
  explicit ForwardingReceiver(Receiver* inner) : inner_(inner) {}
  Status Begin(const uint8_t* h, size_t n) override { return inner_->Begin(h, n); }
  Status ApplyRecord(const uint8_t* r, size_t n) override { return inner_->ApplyRecord(r, n); }
  Status Commit(const uint8_t* t, size_t n) override { return inner_->Commit(t, n); }
  void Abort() override { inner_->Abort(); }
  Status MarkApplied(uint64_t id, const Hash128& d) override { return inner_->MarkApplied(id, d); }
  Status Verify(const Checkpoint& target) const override { return inner_->Verify(target); }
  const Receiver* storage() const override { return inner_->storage(); }
  VersionId held() const override { return inner_->held(); }
  bool in_delta() const override { return inner_->in_delta(); }
  std::vector<uint64_t> MissingChunks(const Trailer& t) const override {
    return inner_->MissingChunks(t);
  }

 protected:
  Receiver* inner() const { return inner_; }

 private:
  Receiver* inner_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_RECEIVERS_FORWARDING_RECEIVER_H_
