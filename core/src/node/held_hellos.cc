#include "node/held_hellos.h"

#include <unistd.h>

#include <algorithm>

namespace dcr::internal {

HeldHellos& HeldHellos::Process() {
  static HeldHellos* held = new HeldHellos();  // never destroyed: threads may outlive main
  return *held;
}

bool HeldHellos::IsLater(const FrameHeader& h, const TlsIdentity* peer, uint64_t run,
                         uint64_t version, int parent, int streams) {
  return h.magic == kFrameMagic && h.type == static_cast<uint8_t>(FrameType::kHello) &&
         h.protocol == kWireProtocol && h.run == run && h.version > version &&
         static_cast<int>(h.from_rank) == parent && streams > 0 &&
         h.blob == static_cast<uint64_t>(streams) && h.stream < static_cast<uint32_t>(streams) &&
         (peer == nullptr || peer->rank == parent);
}

void HeldHellos::Keep(int rank, Hello* h) {
  Held evicted{0, Hello{}};
  std::lock_guard<std::mutex> lock(mu_);
  if (held_.size() >= kMaxHeld) {
    evicted = std::move(held_.front());
    held_.erase(held_.begin());
  }
  held_.push_back(Held{rank, Hello{std::move(h->conn), h->header}});
}

std::vector<Hello> HeldHellos::Take(int rank, uint64_t run, uint64_t version) {
  std::vector<Hello> out;
  std::vector<Held> passed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Held> keep;
    for (Held& h : held_) {
      if (h.rank != rank || h.hello.header.run != run || h.hello.header.version > version) {
        keep.push_back(std::move(h));
      } else if (h.hello.header.version == version) {
        out.push_back(std::move(h.hello));
      } else {
        passed.push_back(std::move(h));
      }
    }
    held_ = std::move(keep);
  }
  return out;  // `passed` closes its connections here, outside the lock
}

bool HeldHellos::MovedOn(int rank, uint64_t run, uint64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  return std::any_of(held_.begin(), held_.end(), [&](const Held& h) {
    return h.rank == rank && h.hello.header.run == run && h.hello.header.version > version;
  });
}

size_t HeldHellos::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return held_.size();
}

void HeldHellos::KeepListener(int rank, const std::string& address, int fd) {
  int replaced = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Listener& l : listeners_) {
      if (l.rank == rank && l.address == address) {
        replaced = l.fd;
        l.fd = fd;
      }
    }
    if (replaced < 0) listeners_.push_back(Listener{rank, address, fd});
  }
  if (replaced >= 0 && replaced != fd) close(replaced);
}

int HeldHellos::TakeListener(int rank, const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < listeners_.size(); ++i) {
    if (listeners_[i].rank == rank && listeners_[i].address == address) {
      const int fd = listeners_[i].fd;
      listeners_.erase(listeners_.begin() + static_cast<std::ptrdiff_t>(i));
      return fd;
    }
  }
  return -1;
}

}  // namespace dcr::internal
