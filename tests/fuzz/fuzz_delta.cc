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
  if (inv.data_size() > (uint64_t{8} << 20)) return 0;  // keep memory bounded
  std::vector<std::vector<uint8_t>> store;
  std::vector<ReceiverTensor> tensors;
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    const TensorInfo& t = inv.tensors[i];
    store.emplace_back(t.nbytes, static_cast<uint8_t>(i));
  }
  for (size_t i = 0; i < inv.tensors.size(); ++i)
    tensors.push_back({inv.tensors[i], store[i].data()});
  // tmpfs when available: the journal's fsyncs are not what is being fuzzed.
  static std::string jpath = std::string(::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") +
                             "/dcr_fuzz_journal." + std::to_string(::getpid());
  ::unlink(jpath.c_str());
  StatusOr<std::unique_ptr<ReceiverJournal>> j = ReceiverJournal::Open(jpath);
  if (!j.ok()) __builtin_trap();
  if (!(d.header().flags & kFlagNoBase)) {
    (void)(*j)->RecordCommitted({d.header().base_version, d.header().base_hash});
  }
  BufferReceiver inner(std::move(tensors), {d.header().base_version, d.header().base_hash});
  JournaledReceiver ja(&inner, j->get());
  if (!BeginDelta(d, &ja).ok()) return 0;
  for (size_t i = 0; i < d.num_chunks(); ++i)
    (void)ja.ApplyRecord(d.chunk_data(i), d.chunk_size(i));
  (void)CommitDelta(d, &ja);
  (void)ja.Ledger();
  return 0;
}
