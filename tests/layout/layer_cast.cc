// The layer-cast check's counterexample: a receiver layer found again with dynamic_cast, so that
// layout.no_layer_casts_can_fail can show the check fails on such a file.
#include "dcr/receiver.h"

const dcr::BufferReceiver* HostOf(const dcr::Receiver* r) {
  return dynamic_cast<const dcr::BufferReceiver*>(r);
}
