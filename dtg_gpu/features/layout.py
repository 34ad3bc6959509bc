r"""The columns of the per-timestep statistics, by name: one place that says what each is.

Every timestep of a run is summarised by `F` numbers laid out as

=====================  ==========================================  ========================
columns                what                                        when
=====================  ==========================================  ========================
`0 … 4`              the five statistics of the whole centrality  always (the method)
`5 … 5 + 5·L − 1`    the five statistics of each layer's nodes    `per_layer=True`
`F − 1`              $\log\lambda_1$                        `eigenvalue=True`
=====================  ==========================================  ========================

and a run's feature vector repeats that block for `t = 1 … k` (temporal reinforcement
keeps the layout). [`StatisticsLayout`][dtg_gpu.features.layout.StatisticsLayout] builds, splits and names these columns, so that
adding a statistic is one edit here.

Examples
--------
>>> lay = StatisticsLayout(layers=("conv1", "fc"), eigenvalue=True)
>>> lay.width, lay.names[:2], lay.names[5], lay.names[-1]
(16, ['mean', 'std'], 'conv1:mean', 'log_eigenvalue')
>>> lay.columns(2)[16]
'mean_t2'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dtg_gpu.features.statistics import STATISTICS, layer_node_groups

__all__ = ["StatisticsLayout"]


@dataclass(frozen=True)
class StatisticsLayout:
    """Which statistics a timestep carries, in column order.

    Parameters
    ----------
    layers : tuple of str
        The layers whose nodes get their own five statistics (empty: the method's five only).
    eigenvalue : bool
        A last column $\\log\\lambda_1$.
    """

    layers: tuple[str, ...] = ()
    eigenvalue: bool = False

    @classmethod
    def of(cls, topology, per_layer: bool = False, eigenvalue: bool = False) -> "StatisticsLayout":
        """The layout of `topology`'s graphs with the given options (per-layer groups as
        `layer_node_groups` finds them)."""
        layers = tuple(name for name, _ in layer_node_groups(topology)) if per_layer else ()
        return cls(layers=layers, eigenvalue=eigenvalue)

    @property
    def per_layer(self) -> bool:
        return bool(self.layers)

    @property
    def width(self) -> int:
        """`F`: columns per timestep."""
        return len(STATISTICS) * (1 + len(self.layers)) + int(self.eigenvalue)

    @property
    def names(self) -> list[str]:
        """Column names of one timestep: `mean … kurtosis`, `layer:mean …`, `log_eigenvalue`."""
        return (
            list(STATISTICS)
            + [f"{layer}:{s}" for layer in self.layers for s in STATISTICS]
            + (["log_eigenvalue"] if self.eigenvalue else [])
        )

    def columns(self, k: int) -> list[str]:
        """Names of a run's `k·F` features: `<name>_t<t>`, timestep by timestep."""
        return [f"{name}_t{t + 1}" for t in range(k) for name in self.names]

    def timesteps(self, n_features: int) -> int:
        """`k` of a feature vector of `n_features` columns in this layout."""
        if n_features % self.width:
            raise ValueError(f"{n_features} features are not a whole number of timesteps of {self.width}")
        return n_features // self.width

    def join(
        self, spec: torch.Tensor, layers: torch.Tensor | None = None, log_eigenvalue: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`[..., F]` from the parts: `[..., 5]`, `[..., 5·L]` and `[...]`."""
        parts = [spec]
        if self.per_layer:
            if layers is None:
                raise ValueError("this layout has per-layer statistics; pass them")
            parts.append(layers.to(spec.dtype))
        if self.eigenvalue:
            if log_eigenvalue is None:
                raise ValueError("this layout has log(lambda_1); pass it")
            parts.append(log_eigenvalue.to(spec.dtype)[..., None])
        return torch.cat(parts, -1)

    def split(self, stats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """`(spec [..., 5], per-layer [..., 5·L] or None, log λ₁ [...] or None)` of `[..., F]`."""
        if stats.shape[-1] != self.width:
            raise ValueError(f"statistics have {stats.shape[-1]} columns, this layout {self.width}")
        n = len(STATISTICS)
        layers = stats[..., n : n * (1 + len(self.layers))].contiguous() if self.per_layer else None
        lam = stats[..., -1].contiguous() if self.eigenvalue else None
        return stats[..., :n].contiguous(), layers, lam

    def select(self, names: Sequence[str]) -> list[int]:
        """Column indices (within a timestep) of the given names."""
        index = {n: i for i, n in enumerate(self.names)}
        missing = [n for n in names if n not in index]
        if missing:
            raise KeyError(f"no column {missing[0]!r} in this layout ({', '.join(self.names[:6])}, ...)")
        return [index[n] for n in names]
