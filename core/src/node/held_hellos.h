// The per-version start barrier of a long-lived node's parent link: connections whose hello is
// for a later version than the one the node is in, kept until the node gets there.
//
// A parent moves on to version k+1 as soon as it has committed k, and connects to its children
// for k+1 while a child may still be in k (waiting for a parent that restarted and serves k from
// the store only, or fetching k from the store itself). Such a hello is not refused: the child
// keeps the connection here, stops waiting for k on the tree (its parent has moved on; k is
// fetched from the in-region store) and takes the connection when its own k+1 starts. What the
// parent sends meanwhile waits in the connection's socket buffers; a parent that hears nothing
// from the child (its heartbeats start with the version) or whose writes make no progress for
// its read deadline counts the child as lost, and the child then finds the connection closed
// and falls back to the store for that version, as for any lost parent.
//
// Thread safety: thread-safe (one per process; each version's node keeps and takes).
#ifndef DCR_CORE_SRC_NODE_HELD_HELLOS_H_
#define DCR_CORE_SRC_NODE_HELD_HELLOS_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "transport/net.h"

namespace dcr::internal {

class HeldHellos {
 public:
  // At most this many connections are kept; keeping one more closes the oldest.
  static constexpr size_t kMaxHeld = 64;

  // The process's one instance.
  static HeldHellos& Process();

  // Whether `h` is a hello that a node of run `run` in version `version`, waiting for parent
  // `parent` on `streams` streams, keeps for later: a kHello of this wire protocol and run, of a
  // later version, from `parent` (its TLS certificate's rank too, when `peer` is set) with a
  // stream index below `streams`.
  static bool IsLater(const FrameHeader& h, const TlsIdentity* peer, uint64_t run, uint64_t version,
                      int parent, int streams);

  // Keeps the connection of `h` (moved out of it) for node `rank` (the one that accepted it: a
  // process may run several nodes of a run).
  void Keep(int rank, Hello* h);
  // The connections kept for node `rank` of run `run` and version `version`, in the order kept;
  // every connection kept for that node and run with a lower version is closed (its version has
  // passed).
  std::vector<Hello> Take(int rank, uint64_t run, uint64_t version);
  // Whether a connection of run `run` with a version above `version` is kept for node `rank`:
  // its parent has moved on past `version`.
  bool MovedOn(int rank, uint64_t run, uint64_t version);
  // Number of kept connections.
  size_t size();

  // A restarted node's listener, kept listening from one version to the next instead of being
  // closed: a parent's connection for the next version that arrives after the listener's last
  // accept then waits in its backlog for the next version's wait instead of being reset. Keeping
  // a listener for `rank` and `address` closes one already kept for them.
  void KeepListener(int rank, const std::string& address, int fd);
  // The listener kept for `rank` on `address`, which the caller now owns; -1 if there is none.
  int TakeListener(int rank, const std::string& address);

 private:
  struct Held {
    int rank;
    Hello hello;
  };
  struct Listener {
    int rank;
    std::string address;
    int fd;
  };
  std::mutex mu_;
  std::vector<Held> held_;
  std::vector<Listener> listeners_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_HELD_HELLOS_H_
