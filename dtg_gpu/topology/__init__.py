"""Step 1: a model's channel graph (which layers join which channels), traced from its code."""

from dtg_gpu.topology.trace import channel_topology
from dtg_gpu.topology.types import ChannelTopology, WeightLayer

__all__ = ["WeightLayer", "ChannelTopology", "channel_topology"]
