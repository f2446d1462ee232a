// The sender's encoding for the long link to an edge relay (NodePlan::edge_relays), chosen when
// a run is planned: one policy, used by the simulator (sim/, from its calibration and payload
// model) and by `dcr run` (from a sample of the refit's own delta, transcoded on its own cores).
//
// The context form is chosen when the edge relay keeps up with what the long link delivers: its
// cores x the per-core transcoding speed (context decode + apply + plain re-encode, in dense
// bytes per second) at least the dense bytes per second the link delivers in the context form
// (the link's rate x dense / context payload). Otherwise the plain form: the edge relay would
// lag, and its subtree would wait for its transcoding instead of the link.
//
// Pure function of its arguments. Thread safety: thread-safe.
#ifndef DCR_CORE_INCLUDE_DCR_WAN_CHOICE_H_
#define DCR_CORE_INCLUDE_DCR_WAN_CHOICE_H_

namespace dcr {

struct WanChoice {
  bool context = false;       // the long link carries the context form
  double edge_dense_Bps = 0;  // the edge relay's transcoding throughput (dense bytes per second)
  double link_dense_Bps = 0;  // dense bytes per second the link delivers in the context form
};

// `link_Bps`: the long link's rate (bytes per second, > 0); `dense`: the checkpoint's bytes;
// `context_payload`: the context-coded stream's bytes (<= 0: none, the plain form);
// `edge_cores`: the edge relay's transcoding threads (< 0 counts as 0); `transcode_Bps`: its
// transcoding speed per thread, in dense bytes per second.
WanChoice ChooseWanEncoding(double link_Bps, double dense, double context_payload, int edge_cores,
                            double transcode_Bps);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_WAN_CHOICE_H_
