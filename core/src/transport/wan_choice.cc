// ChooseWanEncoding (dcr/wan_choice.h).
#include "dcr/wan_choice.h"

#include <algorithm>

namespace dcr {

WanChoice ChooseWanEncoding(double link_Bps, double dense, double context_payload, int edge_cores,
                            double transcode_Bps) {
  WanChoice c;
  c.edge_dense_Bps = std::max(0, edge_cores) * transcode_Bps;
  c.link_dense_Bps = context_payload > 0 ? link_Bps * dense / context_payload : 0;
  c.context = context_payload > 0 && c.edge_dense_Bps >= c.link_dense_Bps;
  return c;
}

}  // namespace dcr
