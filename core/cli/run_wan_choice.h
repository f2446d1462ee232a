// The long link's encoding of a `dcr run` relay-tree delta refit with edge relays
// (delta.wan_context, transport.relay_tree.edge_relays), chosen when the refit is planned by the
// policy the simulator plans with (ChooseWanEncoding, dcr/wan_choice.h), from the refit's own
// data: a sample of its delta's grid cells gives the context form's size (scaled to the whole
// checkpoint by dense bytes) and, transcoded on this process's thread (ContextChunkToPlain), the
// transcoding speed per thread; the edge relay's threads are its plan's
// relay.max_parallel_applies (its ingress transcodes that many chunks at once); the link's rate is
// network.long_link.bandwidth.
//
// Thread safety: not thread-safe (one planning thread).
#ifndef DCR_CORE_CLI_RUN_WAN_CHOICE_H_
#define DCR_CORE_CLI_RUN_WAN_CHOICE_H_

#include <string>
#include <vector>

#include "dcr/node.h"
#include "dcr/scenario.h"
#include "dcr/statusor.h"

namespace dcr::cli {

// Applies the choice to `plans` (MakePlans' of one relay-tree delta refit from `base` to
// `target`). Nothing to choose (returns ""): no plan context-codes or names an edge relay.
// The context form kept: plans unchanged. The plain form: no plan context-codes and none names an
// edge relay (the edge relays are ordinary relays, cut-through, and the sender watches no lag).
// A long link without a rate (bandwidth 0: unlimited) keeps the configured form. Returns the
// choice with its inputs, for the result's setup. Errors: those of opening the checkpoints and
// of SampleContextSize.
StatusOr<std::string> ApplyWanChoice(const Scenario& s, const std::string& base,
                                     const std::string& target, std::vector<NodePlan>* plans);

}  // namespace dcr::cli

#endif  // DCR_CORE_CLI_RUN_WAN_CHOICE_H_
