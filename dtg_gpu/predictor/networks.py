"""The predictor's torch networks: a small MLP, or one linear head per feature block (one model per feature set; the estimator weights their probabilities); run on one CPU thread for reproducibility."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import torch

#: the models a block of columns can have (`PerformancePredictor(block_models=...)`)
BLOCK_MODELS = ("linear", "mlp")


@contextmanager
def _one_thread(device: torch.device):
    """Train the MLP on one CPU thread, then restore the caller's count. Its tensors are tiny
    (a batch of 32 runs × ~100 features), so intra-op threads cost more than they share:
    measured on 2 cores, 0.34–0.48 s per default fit on one thread against 0.97–1.8 s on two."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class _BlockHeads(torch.nn.Module):
    """One linear head per block of columns (a logistic regression each), as one
    `Linear(d, H)` whose weight is masked to the blocks; `forward` gives the `H` logits.
    `heads`: the indices of the blocks that get a linear head (default: every block; the
    others are read by a model of their own, e.g. the seed's MLP)."""

    def __init__(self, blocks: Sequence[int], heads: Sequence[int] | None = None):
        super().__init__()
        d = int(sum(blocks))
        heads = list(range(len(blocks))) if heads is None else [int(h) for h in heads]
        self.linear = torch.nn.Linear(d, len(heads))
        mask = torch.zeros(len(heads), d)
        starts = [0]
        for w in blocks:
            starts.append(starts[-1] + int(w))
        for row, i in enumerate(heads):
            mask[row, starts[i] : starts[i + 1]] = 1.0
        self.mask: torch.Tensor
        self.register_buffer("mask", mask, persistent=False)
        with torch.no_grad():
            self.linear.weight.mul_(mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.linear.weight * self.mask, self.linear.bias)


def _mlp(n_in: int, hidden: Sequence[int], n_out: int) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    width = n_in
    for h in hidden:
        layers += [torch.nn.Linear(width, int(h)), torch.nn.ReLU()]
        width = int(h)
    layers.append(torch.nn.Linear(width, n_out))
    return torch.nn.Sequential(*layers)
