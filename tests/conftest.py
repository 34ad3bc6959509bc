"""Shared fixtures: devices (CPU, and CUDA when present), small models and runs."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
import torch
from torch import nn

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Ray starts its workers at niceness 15: beside another pytest worker (or a training job) on
# the same cores they would wait for it, and a 40 s Tune example takes minutes
os.environ.setdefault("RAY_worker_niceness", "0")
if "DTG_GPU_NATIVE_CACHE" not in os.environ:  # the compiled norm kernel, built once per test session
    os.environ["DTG_GPU_NATIVE_CACHE"] = tempfile.mkdtemp(prefix="dtg_gpu_native_tests_")
    atexit.register(shutil.rmtree, os.environ["DTG_GPU_NATIVE_CACHE"], True)
# Two threads at most; under pytest-xdist (`make test` runs `-n auto`) the cores are split
# between the workers, so that two workers on 2 cores do not fight over them.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
torch.set_num_threads(max(1, min(2, torch.get_num_threads() // max(1, _workers))))

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def local_ray(request):
    """A local 2-CPU Ray instance for one test module, never a cluster: `address="local"`
    ignores `RAY_ADDRESS` and a running cluster. Workers import the tests' helpers and the
    test module itself (its trainables travel by reference)."""
    ray = pytest.importorskip("ray")
    here = os.path.dirname(os.path.abspath(__file__))
    module_dir = os.path.dirname(os.path.abspath(request.module.__file__))
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={
            "env_vars": {"PYTHONPATH": f"{module_dir}:{here}:{os.path.dirname(here)}", "OMP_NUM_THREADS": "1"}
        },
    )
    yield
    ray.shutdown()


#: The small sweep several suites share (24 LeNet-5 runs on digits, ~9 checkpoints each):
#: a `SweepConfig`'s keywords, so that this file does not import dtg_gpu at collection.
SMALL_SWEEP = dict(
    model="lenet5",
    dataset="digits",
    lrs=(0.002, 0.02, 0.1),
    dropouts=(0.0, 0.5),
    seeds=2,
    epochs=2,
    checkpoint_every=10,
    checkpoint_unit="step",
)


@pytest.fixture(scope="session")
def trained_sweep(tmp_path_factory):
    """`trained_sweep(cfg) -> folder`: the sweep of `cfg` (a `SweepConfig`), trained once per
    test session and copied into a fresh folder for each caller, so that a module may change
    its copy (tamper with a file, write a cache) without touching another's. The one way the
    tests make a sweep on disk."""
    import shutil

    from dtg_gpu.sweeps import SweepConfig, run_sweep

    trained: dict[str, str] = {}

    def make(cfg: SweepConfig, name: str = "sweep"):
        key = repr(cfg)
        if key not in trained:
            trained[key] = str(
                run_sweep(cfg, tmp_path_factory.mktemp("trained") / "sweep", progress=False, device="cpu")
            )
        dst = tmp_path_factory.mktemp("sweep") / name
        shutil.copytree(trained[key], dst, ignore=shutil.ignore_patterns(".dtg-cache"))
        return dst

    return make


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """Runs the test on the CPU, and again on CUDA when present (PyG's withCUDA)."""
    return request.param


class GroupedNet(nn.Module):
    """Grouped and depthwise convs, a concatenation and a self-loop residual (x + conv(x))."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.grouped = nn.Conv2d(8, 16, 3, padding=1, groups=4)
        self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.branch = nn.Conv2d(8, 4, 1)
        self.mix = nn.Conv2d(20, 20, 1)  # input and output are the same space
        self.fc = nn.Linear(20 * 4 * 4, 5)

    def forward(self, x):
        s = torch.relu(self.stem(x))
        a = self.depthwise(torch.relu(self.grouped(s)))
        y = torch.cat([a, self.branch(s)], dim=1)
        y = y + self.mix(y)
        y = nn.functional.adaptive_avg_pool2d(y, 4)
        return self.fc(torch.flatten(y, 1))


def make_checkpoints(
    model: nn.Module, t: int = 3, seed: int = 0, scale: float = 1.0, drift: float = 0.05
) -> list[dict[str, torch.Tensor]]:
    """``t`` state dicts: the model's weights times ``scale`` plus a random walk."""
    g = torch.Generator().manual_seed(seed)
    state = {k: v.detach().clone() * (scale if v.is_floating_point() else 1) for k, v in model.state_dict().items()}
    out = []
    for _ in range(t):
        for _k, v in state.items():
            if v.is_floating_point():
                v.add_(drift * torch.randn(v.shape, generator=g))
        out.append({k: v.clone() for k, v in state.items()})
    return out
