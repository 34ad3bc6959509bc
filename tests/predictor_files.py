"""Helpers of the predictor-file tests: read a file's tensors and metadata, write them back."""

from __future__ import annotations

import json

from safetensors import safe_open
from safetensors.torch import load_file, save_file


def file_parts(path):
    """The tensors and the `dtg_predictor` metadata of a predictor file."""
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["dtg_predictor"])
    return load_file(str(path)), meta


def write_file(path, tensors, meta):
    """A predictor file of these tensors and metadata (e.g. tampered with)."""
    save_file(tensors, str(path), metadata={"dtg_predictor": json.dumps(meta)})
