"""Reading what training wrote: checkpoints (safely), run folders, run.json and sweep.json."""

from dtg_gpu.io.checkpoints import CHECKPOINT_SUFFIXES, checkpoint_shapes, load_state_dict, load_weights
from dtg_gpu.io.manifest import read_manifest
from dtg_gpu.io.run import Run, unwrap_model

__all__ = [
    "Run",
    "unwrap_model",
    "load_state_dict",
    "load_weights",
    "checkpoint_shapes",
    "read_manifest",
    "CHECKPOINT_SUFFIXES",
]
