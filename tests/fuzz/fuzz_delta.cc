// libFuzzer target: a whole delta stream -> DeltaReader (header, chunk table, trailer), decode and
// apply every chunk into storage sized by the delta's own inventory (bounded), journaled.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "dcr/apply.h"
#include "dcr/delta.h"
#include "dcr/journal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dcr;
  size_t consumed = 0;
  (void)ParseFileHeader(data, size, &consumed);
  (void)ParseTrailer(data, size);
  StatusOr<std::unique_ptr<DeltaReader>> r =
      DeltaReader::FromBytes(std::vector<uint8_t>(data, data + size));
  if (!r.ok()) return 0;
  const DeltaReader& d = **r;
  const Inventory& inv = d.inventory();
  if (inv.data_size > (uint64_t{8} << 20)) return 0;  // keep memory bounded
  std::vector<std::vector<uint8_t>> store;
  std::vector<TensorBuffer> bufs;
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    const TensorInfo& t = inv.tensors[i];
    store.emplace_back(t.nbytes, static_cast<uint8_t>(i));
  }
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    const TensorInfo& t = inv.tensors[i];
    bufs.push_back({store[i].data(), t.num_elements(), t.width(), inv.salts[i]});
  }
  BufferApplier inner(bufs);
  // tmpfs when available: the journal's fsyncs are not what is being fuzzed.
  static std::string jpath = std::string(::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") +
                             "/dcr_fuzz_journal." + std::to_string(::getpid());
  ::unlink(jpath.c_str());
  StatusOr<std::unique_ptr<ReceiverJournal>> j = ReceiverJournal::Open(jpath);
  if (!j.ok()) __builtin_trap();
  if (!(d.header().flags & kFlagNoBase)) {
    (void)(*j)->RecordCommitted({d.header().base_version, d.header().base_hash});
  }
  JournaledApplier ja(&inner, j->get());
  if (!ja.BeginDelta(d.header()).ok()) return 0;
  for (size_t i = 0; i < d.num_chunks(); ++i) {
    StatusOr<DecodedChunk> dc = d.Decode(i);
    if (!dc.ok()) continue;
    (void)ja.ApplyChunk(*dc);
  }
  (void)ja.Commit(d.trailer());
  (void)ja.Ledger();
  return 0;
}
