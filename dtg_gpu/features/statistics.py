r"""Per-timestep statistics of centrality vectors (method step 4.1), batched.

For a centrality vector $x \in \mathbb{R}^n$ with mean $\bar x$ and central
moments $m_k = \frac1n \sum_i (x_i - \bar x)^k$:

.. math::
    \text{mean} = \bar x,\quad \text{std} = \sqrt{m_2},\quad
    \text{median} = \tfrac12\bigl(x_{(\lfloor (n-1)/2 \rfloor)} + x_{(\lfloor n/2 \rfloor)}\bigr),\quad
    \text{skewness} = \frac{m_3}{m_2^{3/2}},\quad \text{kurtosis} = \frac{m_4}{m_2^{2}} - 3

exactly NumPy's `mean`, `std` (`ddof=0`), `median` and SciPy's biased `skew` and
Fisher `kurtosis`, including SciPy's rule that skewness and kurtosis are NaN when the
vector is constant to working precision (`m_2 \le (\varepsilon \bar x)^2`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["STATISTICS", "timestep_statistics", "layer_node_groups", "layer_statistics"]

STATISTICS = ("mean", "std", "median", "skewness", "kurtosis")


def _pad(values: torch.Tensor, ptr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    counts = ptr.diff()
    g, width = counts.numel(), int(counts.max()) if counts.numel() else 0
    batch = torch.repeat_interleave(torch.arange(g, device=values.device), counts)
    pos = torch.arange(values.numel(), device=values.device) - ptr[:-1][batch]
    dense = values.new_zeros(g, width)
    dense[batch, pos] = values
    mask = torch.zeros(g, width, dtype=torch.bool, device=values.device)
    mask[batch, pos] = True
    return dense, mask


def timestep_statistics(x: torch.Tensor, ptr: torch.Tensor | None = None) -> torch.Tensor:
    r"""Mean, std, median, skewness and kurtosis of many vectors in one pass.

    Parameters
    ----------
    x : Tensor `[G, N]`, or `[total]` with `ptr`
        One centrality vector per row; or the vectors of graphs of different sizes laid
        end to end.
    ptr : LongTensor `[G + 1]`, optional
        Offsets of each vector in a flat `x` (PyG's `Batch.ptr`).

    Returns
    -------
    Tensor `[G, 5]`
        Columns in the order of `STATISTICS`. A row with a NaN input is all NaN.

    Raises
    ------
    ValueError
        An empty vector, or `x`/`ptr` of the wrong shape.

    Examples
    --------
    >>> timestep_statistics(torch.tensor([[1., 2., 3., 10.]]))
    tensor([[ 4.0000,  3.5355,  2.5000,  1.0182, -0.7696]])
    """
    if ptr is not None:
        if x.dim() != 1 or ptr.dim() != 1 or int(ptr[-1]) != x.numel() or int(ptr[0]) != 0:
            raise ValueError("with ptr, x must be 1-D and ptr must run from 0 to x.numel()")
        if bool((ptr.diff() <= 0).any()):
            raise ValueError("every vector must have at least one entry")
        x, mask = _pad(x, ptr)
    else:
        if x.dim() != 2 or x.shape[1] == 0:
            raise ValueError(f"x must have shape [G, N] with N >= 1, got {list(x.shape)}")
        mask = None
    if not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    n = x.shape[1] if mask is None else mask.sum(1)
    n_f = torch.as_tensor(n, dtype=x.dtype, device=x.device)
    xz = x if mask is None else x.masked_fill(~mask, 0)
    mean = xz.sum(1) / n_f
    d = x - mean[:, None]
    if mask is not None:
        d = d.masked_fill(~mask, 0)
    # the moments of d / s, s = max |d|: skewness and kurtosis are scale-free, and a vector of
    # tiny values (a layer whose centrality is ~1e-20) would underflow m2² to 0 in float32
    s = d.abs().amax(1)
    u = d / torch.where(s > 0, s, torch.ones_like(s))[:, None]
    u2 = u * u
    m2 = u2.sum(1) / n_f
    m3 = (u2 * u).sum(1) / n_f
    m4 = (u2 * u2).sum(1) / n_f
    std = s * m2.sqrt()
    eps = torch.finfo(x.dtype).eps
    flat = std <= eps * mean.abs()  # constant to rounding (also s = 0)
    nan = torch.full_like(m2, float("nan"))
    skew = torch.where(flat, nan, m3 / m2**1.5)
    kurt = torch.where(flat, nan, m4 / (m2 * m2) - 3.0)
    srt = x if mask is None else x.masked_fill(~mask, float("inf"))
    srt = srt.sort(dim=1).values
    n_l = torch.as_tensor(n, device=x.device).expand(x.shape[0]).long()
    lo = srt.gather(1, ((n_l - 1) // 2)[:, None]).squeeze(1)
    hi = srt.gather(1, (n_l // 2)[:, None]).squeeze(1)
    median = (lo + hi) / 2
    has_nan = torch.isnan(xz).any(1)
    out = torch.stack([mean, std, median, skew, kurt], dim=1)
    return torch.where(has_nan[:, None], torch.full_like(out, float("nan")), out)


def layer_node_groups(topology, min_nodes: int = 3) -> list[tuple[str, torch.Tensor]]:
    """The nodes of each layer (by `ChannelTopology.node_owner`), in node order, for
    layers with at least `min_nodes` nodes (fewer give constant skewness/kurtosis)."""
    owners: dict[str, list[int]] = {}
    for i, owner in enumerate(topology.node_owner):
        owners.setdefault(owner, []).append(i)
    return [(name, torch.tensor(idx)) for name, idx in owners.items() if len(idx) >= min_nodes]


def layer_statistics(x: torch.Tensor, groups: Sequence[torch.Tensor]) -> torch.Tensor:
    r"""The five statistics of each node group of each vector: `[G, 5·L]` in one pass.

    `x` is `[G, N]`; group `l` is the index tensor `groups[l]`. Columns are
    `[group 0: mean … kurtosis, group 1: …]`. Used by the per-layer statistics of `featurize`.

    Examples
    --------
    >>> x = torch.tensor([[1., 2., 3., 10., 0., 4.]])
    >>> layer_statistics(x, [torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5])])[0, :5]
    tensor([ 4.0000,  3.5355,  2.5000,  1.0182, -0.7696])
    """
    if not groups:
        raise ValueError("no node groups")
    g = x.shape[0]
    perm = torch.cat(list(groups)).to(x.device)
    sizes = torch.tensor([len(idx) for idx in groups], device=x.device).repeat(g)
    ptr = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)])
    return timestep_statistics(x[:, perm].reshape(-1), ptr).reshape(g, len(groups) * 5)
