"""The surface of NeMo-RL's refit that dcr.adapters.nemo_rl is called through, written from its
documented non-colocated path: the trainer's broadcast and the generation's collective receive
started together, both waited on, every inference result required truthy."""


def refit_policy_generation(policy, policy_generation, colocated_inference, get=list):
    if colocated_inference:
        policy.offload_before_refit()
        futures_train = policy.stream_weights_via_ipc_zmq(buffer_size_bytes=1 << 30)
        futures_inference = policy_generation.update_weights_via_ipc_zmq()
    else:
        futures_train = policy.broadcast_weights_for_collective(kv_scales=None)
        futures_inference = policy_generation.update_weights_from_collective()
    get(futures_train)
    results = get(futures_inference)
    if not all(r for r in results if r is not None):
        raise RuntimeError("Error: Updating weights for the generation policy failed during "
                           "refit.")


class Policy:
    """The trainer's policy: its current weights and the calls refit makes besides the
    transfer."""

    def __init__(self, state):
        self.state = state
        self.offloaded = 0

    def offload_before_refit(self):
        self.offloaded += 1


class Generation:
    def __init__(self):
        self.prepared = 0

    def prepare_for_generation(self, tags=None):
        self.prepared += 1
