// How a publisher handle of dcr/publisher_c.h opens from a node plan made elsewhere: the entry
// point of a library that builds the sender's plan its own way (dcr_publisher_open_scenario reads
// a YAML scenario in dcr::publisher_scenario, so that dcr::publisher links no YAML parser).
//
// Thread safety: as dcr_publisher_open.
#ifndef DCR_CORE_SRC_PUBLISHER_PUBLISHER_OPEN_H_
#define DCR_CORE_SRC_PUBLISHER_PUBLISHER_OPEN_H_

#include <functional>

#include "dcr/node.h"
#include "dcr/publisher_c.h"
#include "dcr/statusor.h"

namespace dcr::internal {

// Opens a publisher as dcr_publisher_open does, with the plan `make_plan` returns: a fresh handle
// in *out, the sender started on it with `work_dir`. A failed `make_plan` (or one that throws; the
// message is prefixed with `api`, the C entry point's name) leaves its error on the handle.
// Returns the handle's status code (0 = ok), as the C API does.
// REQUIRES: `work_dir` is non-null whenever `make_plan` succeeds.
int OpenPublisher(const std::function<StatusOr<NodePlan>()>& make_plan, const char* work_dir,
                  const char* api, dcr_publisher** out);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_PUBLISHER_PUBLISHER_OPEN_H_
