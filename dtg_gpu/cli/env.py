"""`dtg env`: versions, device and CUDA, for bug reports."""

from __future__ import annotations

import argparse

import numpy as np

from dtg_gpu.cli.common import Command


# -------------------------------------------------------------------------------- env
def _env_args(p: argparse.ArgumentParser) -> None:
    pass


def _env_run(a: argparse.Namespace) -> int:
    import platform

    import networkx
    import scipy
    import sklearn
    import torch
    import torch_geometric

    from dtg_gpu.core.version import __version__

    print(f"dtg_gpu         {__version__}")
    print(f"python          {platform.python_version()} ({platform.platform()})")
    for mod in (torch, torch_geometric, networkx, scipy, sklearn, np):
        print(f"{mod.__name__:<15} {mod.__version__}")
    print(f"cuda available  {torch.cuda.is_available()}")
    if torch.cuda.is_available():
        print(f"cuda device     {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})")
    print(f"cpu threads     {torch.get_num_threads()}")
    try:
        import torch_scatter  # noqa: F401

        print("torch-scatter   installed (optional)")
    except ImportError:
        print("torch-scatter   not installed (optional)")
    return 0


env = Command("env", "versions, device and CUDA, for bug reports", _env_args, _env_run)
