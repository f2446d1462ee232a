// libFuzzer target: journal bytes -> ReceiverJournal::Replay. Replay must never crash; a valid
// prefix is kept and the rest reported as the torn tail.
#include "dcr/journal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dcr::StatusOr<dcr::JournalState> st = dcr::ReceiverJournal::Replay(data, size);
  if (st.ok() && st->torn_bytes > size) __builtin_trap();
  return 0;
}
