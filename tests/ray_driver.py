"""A featurisation driver that a test kills mid-way: ``python ray_driver.py SWEEP DELAY``."""

import sys

from ray_helpers import slow

from dtg_gpu import SolverOptions
from dtg_gpu.sweeps import load_sweep
from dtg_gpu.workflow import featurize_sweep

if __name__ == "__main__":
    runs = slow(load_sweep(sys.argv[1]), delay=float(sys.argv[2]))
    featurize_sweep(runs, executor="ray", solver=SolverOptions(chunk_size=len(runs[0])), device="cpu")
    print("finished")
