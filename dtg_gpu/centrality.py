r"""Eigenvector centrality of many graphs at once (method step 3).

The centrality of a graph is the Perron vector of its symmetric non-negative adjacency
`A`, scaled to unit Euclidean norm and non-negative:

.. math::
    A x = \lambda_1 x, \qquad \lVert x \rVert_2 = 1, \qquad x \ge 0 .

Two solvers share one contract, and every graph of a batch is normalised and tested for
convergence on its own:

`method="lanczos"` (the default, `"auto"`)
    Explicitly restarted Lanczos with full re-orthogonalisation, batched over graphs.
    Channel graphs are (nearly) bipartite, so `-λ₁` is (nearly) an eigenvalue too and a
    fixed shift converges slowly; Lanczos separates both ends of the spectrum in tens of
    products. It stops on the true relative residual `‖Ax − λx‖₂ / λ ≤ tol` of each graph,
    computed with a fresh product (the first product of each restart).
    Plain chains (LeNet-5, VGG) give bipartite graphs; for them Lanczos runs on `C Cᵀ`
    over one side and lifts the result (`BipartiteSquare`), which
    halves the products (`bipartite=False` turns this off).
`method="networkx"`
    NetworkX's iteration step for step: `x₀ = 1/N`, `x ← (A + I) x / ‖(A + I) x‖₂`,
    stop when `Σ|x − x_prev| < N·tol`. Useful to compare the same algorithm.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from dtg_gpu.core.validation import is_int, is_number

__all__ = ["EigenResult", "MatVec", "solve_perron", "eigenvector_centrality", "attainable_tol"]

Method = Literal["auto", "lanczos", "networkx"]


@dataclass
class EigenResult:
    """Per-graph result of a batched Perron solve.

    Attributes
    ----------
    vector : Tensor `[G, N]`
        Unit-norm Perron vectors, sign chosen so the entries sum to ≥ 0 (padding is 0).
    eigenvalue : Tensor `[G]`
        Rayleigh quotient `xᵀAx`.
    residual : Tensor `[G]`
        `‖Ax − λx‖₂ / λ` (0 for an all-zero graph).
    iterations : LongTensor `[G]`
        Matrix–vector products (`lanczos`) or power steps (`networkx`) used. In the
        bipartite form: products with `C Cᵀ` (each reads every block twice, as a product
        with `A` does) plus one for the lift.
    converged : BoolTensor `[G]`
    """

    vector: torch.Tensor
    eigenvalue: torch.Tensor
    residual: torch.Tensor
    iterations: torch.Tensor
    converged: torch.Tensor


METHODS = ("auto", "lanczos", "networkx")


def check_solver_args(tol: Any, max_iter: Any, method: Any) -> None:
    """The solver's arguments, checked once for every entry point ([`solve_perron`][dtg_gpu.solve_perron],
    [`analyze`][dtg_gpu.analyze], [`featurize`][dtg_gpu.featurize]).

    Raises
    ------
    ValueError
        `tol` not a positive number, `max_iter` not a positive integer, or an unknown
        `method`; the message names the argument and the value.
    """
    if not is_number(tol) or not tol > 0:
        raise ValueError(f"tol must be a positive number, got {tol!r}")
    if not is_int(max_iter) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
    if method not in METHODS:
        raise ValueError(f"method must be 'auto', 'lanczos' or 'networkx', got {method!r}")


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(-1)


def _rel_residual(x: torch.Tensor, ax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lam = _dot(x, ax)
    res = torch.linalg.vector_norm(ax - lam[:, None] * x, dim=-1)
    tiny = torch.finfo(x.dtype).tiny
    rel = torch.where(res == 0, torch.zeros_like(res), res / lam.abs().clamp_min(tiny))
    return lam, rel


def _sign_fix(x: torch.Tensor) -> torch.Tensor:
    s = torch.sign(x.sum(-1, keepdim=True))
    return x * torch.where(s == 0, torch.ones_like(s), s)


STALL_RESTARTS = 5


def _lanczos(matvec: MatVec, mask, tol, max_iter, ncv, check_every=2) -> EigenResult:
    """Explicitly restarted Lanczos, batched over graphs, each stopped on its own residual.

    Every restart begins with a product that gives the restart vector's true relative
    residual; a graph is done when it is `<= tol`. A graph whose Ritz step fails on its
    numbers (see `_ritz`), or whose residual has not reached a new low for
    `STALL_RESTARTS` restarts (the dtype's rounding floor on a large graph), stops
    iterating with its last restart vector and its true residual, never `converged`
    unless that residual is `<= tol`.
    """
    g_count, n = mask.shape
    dtype, device = matvec.dtype, mask.device
    eps = torch.finfo(dtype).eps
    sizes = mask.sum(1).to(dtype)
    v = mask.to(dtype) / sizes.clamp_min(1).sqrt()[:, None]
    x_out = v.clone()
    lam_out = torch.zeros(g_count, dtype=dtype, device=device)
    res_out = torch.full((g_count,), float("inf"), dtype=dtype, device=device)
    it_out = torch.zeros(g_count, dtype=torch.long, device=device)
    done = torch.zeros(g_count, dtype=torch.bool, device=device)
    failed = torch.zeros(g_count, dtype=torch.bool, device=device)
    best = torch.full((g_count,), float("inf"), dtype=dtype, device=device)
    stalled = torch.zeros(g_count, dtype=torch.long, device=device)
    used = 0
    while used < max_iter:
        m = max(1, min(ncv, n, max_iter - used))
        basis = torch.zeros(g_count, m, n, dtype=dtype, device=device)
        alpha = torch.zeros(g_count, m, dtype=dtype, device=device)
        beta = torch.zeros(g_count, m, dtype=dtype, device=device)
        scale = torch.zeros(g_count, dtype=dtype, device=device)
        basis[:, 0] = v
        k = m
        for j in range(m):
            w = matvec(basis[:, j])
            used += 1
            a = _dot(basis[:, j], w)
            if j == 0:  # true residual of the restart vector, with this product for free
                lam, rel = _rel_residual(v, w)
                newly = ~done & ~failed & (rel <= tol)
                x_out[newly], lam_out[newly], it_out[newly] = v[newly], lam[newly], used
                res_out = torch.where(done, res_out, rel)
                done |= newly
                # rounding floor: no new best residual for STALL_RESTARTS restarts in a row means
                # the dtype cannot certify tol on this graph; stop it (not converged) instead of
                # spending max_iter on noise
                stalled = torch.where(rel < 0.9 * best, torch.zeros_like(stalled), stalled + 1)
                best = torch.minimum(best, torch.nan_to_num(rel, nan=float("inf")))
                failed |= ~done & (stalled >= STALL_RESTARTS)
                if bool((done | failed).all()):
                    break
            w = w - a[:, None] * basis[:, j]
            if j:
                w = w - beta[:, j - 1, None] * basis[:, j - 1]
            for _ in range(2):  # full re-orthogonalisation, twice is enough
                h = torch.einsum("gkn,gn->gk", basis[:, : j + 1], w)
                w = w - torch.einsum("gkn,gk->gn", basis[:, : j + 1], h)
                a = a + h[:, j]
            alpha[:, j] = a
            b = torch.linalg.vector_norm(w, dim=-1)
            beta[:, j] = b
            scale = torch.maximum(scale, torch.maximum(a.abs(), b))
            broke = ~(b > 64 * eps * scale)  # NaN counts as a breakdown
            if j + 1 < m:
                basis[:, j + 1] = torch.where(
                    broke[:, None], torch.zeros_like(w), w / torch.where(broke, torch.ones_like(b), b)[:, None]
                )
            if j + 1 < m and (j + 1) % check_every == 0:
                theta, s, ok = _ritz(alpha[:, : j + 1], beta[:, : j + 1])
                est = (b * s[:, -1]).abs() / theta.abs().clamp_min(torch.finfo(dtype).tiny)
                if bool((done | failed | ~ok | broke | (est <= 0.25 * tol)).all()):
                    k = j + 1
                    break
        else:
            j = -1
        if j == 0 and bool((done | failed).all()):
            break
        theta, s, ok = _ritz(alpha[:, :k], beta[:, :k])
        failed |= ~ok & ~done
        y = torch.einsum("gk,gkn->gn", s, basis[:, :k])
        ny = torch.linalg.vector_norm(y, dim=-1, keepdim=True)
        keep_start = ~ok | (theta.abs() <= torch.finfo(dtype).tiny) | (ny.squeeze(-1) == 0)
        v = torch.where(keep_start[:, None], basis[:, 0], y / ny.clamp_min(torch.finfo(dtype).tiny))
        v = _sign_fix(v)
    # budget spent (or Ritz steps failed): report the last restart vectors of the graphs not
    # done, with a true residual
    rest = ~done
    if bool(rest.any()):
        lam, rel = _rel_residual(v, matvec(v))
        x_out[rest], lam_out[rest], res_out[rest], it_out[rest] = v[rest], lam[rest], rel[rest], used
        done = done | (rest & (rel <= tol))
    return EigenResult(x_out, lam_out, res_out, it_out, done)


def _lanczos_bipartite(square, tol, max_iter, ncv) -> EigenResult:
    """Lanczos on `M = C Cᵀ` (one colour), lifted to `A`; see `BipartiteSquare`.

    `M`'s relative residual is `√2` times `A`'s for the lifted vector, so it stops at
    `√2·tol`; `iterations` counts each product with `M` (two block products per
    layer, as one with `A`) plus one for the lift, and stays within `max_iter`.
    """
    g_count = square.num_graphs
    mask = torch.ones(g_count, square.num_nodes, dtype=torch.bool, device=square.device)
    res = _lanczos(square, mask, tol * 2**0.5, max_iter - 1, ncv)
    mu = res.eigenvalue.clamp_min(0)
    lam = mu.sqrt()
    x = square.lift(res.vector, lam)  # solve_perron fixes the sign of the lifted vector
    residual = res.residual / 2**0.5
    return EigenResult(x, lam, residual, res.iterations + 1, res.converged)


def _ritz(alpha: torch.Tensor, beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Largest eigenpair of each tridiagonal `T = tridiag(beta, alpha, beta)`, in float64.

    Eigenvalues by `eigvalsh`, the top eigenvector by three steps of inverse iteration
    (LU with pivoting is stable for it). `eigh` would do both, but LAPACK's
    divide-and-conquer takes over above 25 × 25 and was 4–15× slower on batches of
    thousands of small tridiagonals.

    Never raises on the numbers: a tridiagonal with a non-finite entry, one on which
    `eigvalsh` fails, or whose inverse iteration breaks down is reported in `ok`
    (`False`) with a NaN Ritz value, and the other graphs are unaffected.

    Returns
    -------
    theta : Tensor `[G]`, s : Tensor `[G, k]`, ok : BoolTensor `[G]`
    """
    a, b = alpha.double(), beta.double()
    g_count, k = a.shape
    ok = torch.isfinite(a).all(1) & torch.isfinite(b).all(1)
    a = torch.where(ok[:, None], a, torch.zeros_like(a))
    b = torch.where(ok[:, None], b, torch.zeros_like(b))
    t = torch.diag_embed(a)
    if k > 1:
        off = torch.diag_embed(b[:, :-1], offset=1)
        t = t + off + off.transpose(1, 2)
    try:
        theta = torch.linalg.eigvalsh(t)[:, -1]
    except RuntimeError:  # one bad batch element fails the whole call: redo them one by one
        theta = torch.full((g_count,), float("nan"), dtype=t.dtype, device=t.device)
        for g in range(g_count):
            try:
                theta[g] = torch.linalg.eigvalsh(t[g])[-1]
            except RuntimeError:
                ok[g] = False
    ok &= torch.isfinite(theta)
    theta = torch.where(ok, theta, torch.zeros_like(theta))
    scale = t.abs().amax((1, 2))
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    shifted = t - (theta + 1e-10 * scale)[:, None, None] * torch.eye(k, dtype=t.dtype, device=t.device)
    z = torch.ones(g_count, k, 1, dtype=t.dtype, device=t.device)
    for _ in range(3):
        z, info = torch.linalg.solve_ex(shifted, z)
        ok &= info == 0
        z = z / torch.linalg.vector_norm(z, dim=1, keepdim=True)
    z = z.squeeze(-1)
    ok &= torch.isfinite(z).all(1)
    nan = torch.full_like(theta, float("nan"))
    return (
        torch.where(ok, theta, nan).to(alpha.dtype),
        torch.where(ok[:, None], z, torch.zeros_like(z)).to(alpha.dtype),
        ok,
    )


def _networkx_power(matvec: MatVec, mask, tol, max_iter) -> EigenResult:
    g_count, n = mask.shape
    dtype, device = matvec.dtype, mask.device
    sizes = mask.sum(1).to(dtype)
    x = mask.to(dtype) / sizes.clamp_min(1)[:, None]
    x_out = x.clone()
    it_out = torch.full((g_count,), max_iter, dtype=torch.long, device=device)
    done = torch.zeros(g_count, dtype=torch.bool, device=device)
    # the operator may be A / s (see scaled_blocks): (A + I) x ∝ (A/s) x + x/s ∝ s (A/s) x + x,
    # the same step; whichever form keeps both coefficients <= 1 cannot overflow
    s = _operator_scale(matvec, g_count, device)
    c_ax = s.clamp_max(1.0).to(dtype)[:, None]
    c_x = s.reciprocal().clamp_max(1.0).to(dtype)[:, None]
    for it in range(1, max_iter + 1):
        y = c_ax * matvec(x) + c_x * x
        norm = torch.linalg.vector_norm(y, dim=-1, keepdim=True)
        y = y / torch.where(norm == 0, torch.ones_like(norm), norm)
        newly = ~done & ((y - x).abs().sum(-1) < sizes * tol)
        x_out[newly], it_out[newly] = y[newly], it
        done |= newly
        x = y
        if bool(done.all()):
            break
    x_out = torch.where(done[:, None], x_out, x)
    lam, rel = _rel_residual(x_out, matvec(x_out))
    return EigenResult(x_out, lam, rel, it_out, done)


def _operator_scale(matvec: MatVec, g_count: int, device) -> torch.Tensor:
    """`[G]` float64: the operator applies `A / scale` (`matvec.scale`), else ones."""
    scale = getattr(matvec, "scale", None)
    if scale is None:
        return torch.ones(g_count, dtype=torch.float64, device=device)
    return scale.to(device=device, dtype=torch.float64)


TOL_FLOOR_EPS = 32


def attainable_tol(tol: float, dtype: torch.dtype) -> float:
    """The residual tolerance actually used: `max(tol, 32·eps(dtype))`.

    A float32 product summed over thousands of terms carries a relative rounding error of
    about 1e-7…1e-6, so a float32 residual below ~4e-6 cannot be certified on graphs of
    10⁴ nodes (float64: 7e-15).
    """
    return max(float(tol), TOL_FLOOR_EPS * torch.finfo(dtype).eps)


class MatVec(Protocol):
    """What [`solve_perron`][dtg_gpu.solve_perron] applies: `y = A x` for `G` graphs at once
    (`x`, `y`: `[G, N]`), in `dtype`. Optional attributes it reads when present: `scale`
    (`[G]`: the operator applies `A / scale`) and `bipartite_square()` (the operator of
    `A²` on one side of a bipartite graph). [`BlockOperator`][dtg_gpu.BlockOperator] and
    the sparse operator of [`eigenvector_centrality`][dtg_gpu.eigenvector_centrality] are two."""

    dtype: torch.dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


def solve_perron(
    matvec: MatVec,
    mask: torch.Tensor,
    *,
    tol: float = 1e-6,
    max_iter: int = 1000,
    method: Method = "auto",
    ncv: int = 32,
    bipartite: bool | None = None,
) -> EigenResult:
    r"""Perron vectors of `G` symmetric non-negative operators applied together.

    Parameters
    ----------
    matvec : MatVec (`[G, N] → [G, N]`)
        Applies each graph's adjacency to its row; must expose `.dtype`. Padding columns
        (`mask` False) must map to zero. An optional `.scale` (`[G]`) says that the
        operator applies `A / scale`: eigenvalues are reported in the units of `A` and
        `method="networkx"` iterates with `A + I` exactly (as `A/s + I/s`).
    mask : BoolTensor `[G, N]`
        Which columns are nodes of each graph (graphs of different sizes are padded).
    tol : float, default 1e-6
        `lanczos`: relative residual `‖Ax − λx‖₂/λ`, floored at what the dtype can
        certify (`attainable_tol`: 3.8e-6 in float32, 7.1e-15 in float64).
        `networkx`: NetworkX's `Σ|x − x_prev| < N·tol`, as given.
    max_iter : int, default 1000
        Matrix–vector products (`lanczos`) or power steps (`networkx`).
    method : {"auto", "lanczos", "networkx"}
    ncv : int, default 32
        Lanczos vectors kept per restart.
    bipartite : bool, optional
        `lanczos` only. `None` (default): when `matvec` offers `bipartite_square()`
        (a `BlockOperator` of a bipartite topology, such as LeNet-5
        or VGG), run Lanczos on `C Cᵀ` over one colour and lift the result
        (`BipartiteSquare`): the same vector and the same certified
        residual `‖Ax − λx‖₂/λ` in about half the products. `False`: always on `A`.
        `True`: require the squared form.

    Returns
    -------
    EigenResult
    """
    check_solver_args(tol, max_iter, method)
    if method in ("auto", "lanczos"):
        square = getattr(matvec, "bipartite_square", None) if bipartite is not False else None
        square = square() if square is not None and int(max_iter) >= 2 and bool(mask.all()) else None
        if bipartite and square is None:
            raise ValueError(
                "bipartite=True needs an operator with a bipartite topology "
                "(BlockOperator.bipartite_square), all nodes unmasked and max_iter >= 2"
            )
        dtype = matvec.dtype
        if square is not None:
            res = _lanczos_bipartite(square, attainable_tol(tol, dtype), int(max_iter), int(ncv))
        else:
            res = _lanczos(matvec, mask, attainable_tol(tol, dtype), int(max_iter), int(ncv))
    else:  # "networkx"
        res = _networkx_power(matvec, mask, tol, int(max_iter))
    res.vector = _sign_fix(res.vector)
    scale = _operator_scale(matvec, mask.shape[0], mask.device)
    res.eigenvalue = (res.eigenvalue.double() * scale).to(res.eigenvalue.dtype)
    return res


class _SparseBatchOperator:
    """Adjacency of a batch of PyG graphs as one CSR matrix over padded node slots."""

    def __init__(self, rows, cols, weight, size, dtype, scale=None):
        self.scale = scale
        with warnings.catch_warnings():  # torch's "sparse CSR is beta" notices
            warnings.simplefilter("ignore", UserWarning)
            coo = torch.sparse_coo_tensor(torch.stack([rows, cols]), weight.to(dtype), (size, size))
            self.matrix = coo.coalesce().to_sparse_csr()
        self.dtype = dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (self.matrix @ x.reshape(-1, 1)).reshape(x.shape)


def eigenvector_centrality(
    edge_index: torch.Tensor,
    edge_weight: torch.Tensor | None = None,
    num_nodes: int | None = None,
    batch: torch.Tensor | None = None,
    *,
    num_graphs: int | None = None,
    tol: float = 1e-6,
    max_iter: int = 1000,
    method: Method = "auto",
    dtype: torch.dtype | None = None,
    validate_args: bool = True,
) -> tuple[torch.Tensor, EigenResult]:
    r"""Eigenvector centrality of one graph or a batch of PyG graphs (general sparse kernel).

    .. math::
        A x = \lambda_1 x,\quad A_{rc} = \sum_{e:\ (r, c) = \text{edge\_index}[:, e]} w_e

    `edge_index` lists every stored entry of `A`: an undirected graph lists both
    directions of each edge (PyG's convention, see `torch_geometric.utils.to_undirected`)
    and each self-loop once. Duplicate entries add.

    Parameters
    ----------
    edge_index : LongTensor `[2, E]`
    edge_weight : Tensor `[E]`, optional
        Non-negative weights; ones if omitted.
    num_nodes : int, optional
        Total number of nodes (`batch.numel()` or `edge_index.max() + 1` if omitted).
    batch : LongTensor `[N]`, optional
        Graph of each node, sorted (PyG's `Batch.batch`). `None`: one graph.
    num_graphs : int, optional
        Number of graphs; saves a device sync.
    tol, max_iter, method
        As in [`solve_perron`][dtg_gpu.solve_perron].
    dtype : torch.dtype, optional
        Compute dtype (default: `edge_weight`'s floating dtype, else float32).
    validate_args : bool, default True
        Check the values of the input (node ids in range, weights finite and non-negative,
        `A` symmetric, `batch` sorted, no empty graph, no edge between graphs). Each check
        reads the device (about ten host syncs a call); `False` skips them for inputs known
        to be valid (as `torch.distributions`' `validate_args`). Shapes are always checked.

    Returns
    -------
    centrality : Tensor `[N]`
        Each graph's Perron vector, unit norm per graph, in node order.
    result : EigenResult
        Per graph: `eigenvalue`, `residual`, `iterations`, `converged` (`[G]`).

    Raises
    ------
    ValueError
        Malformed `edge_index`/`edge_weight`/`batch`, negative weights, or a
        non-symmetric `A`.

    Examples
    --------
    >>> ei = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])  # the path 0 - 1 - 2
    >>> x, res = eigenvector_centrality(ei, dtype=torch.float64, tol=1e-12)
    >>> x
    tensor([0.5000, 0.7071, 0.5000], dtype=torch.float64)
    >>> res.converged
    tensor([True])
    """
    ei, ew, num_nodes = _coalesced_edges(edge_index, edge_weight, num_nodes, batch, dtype, validate_args)
    dtype = dtype or (
        edge_weight.dtype if edge_weight is not None and edge_weight.is_floating_point() else torch.float32
    )
    device, e = edge_index.device, edge_index.shape[1]
    batch, num_graphs, counts = _graph_of_each_node(batch, ei, num_nodes, num_graphs, validate_args)
    ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    width = int(counts.max())
    slot = batch * width + (torch.arange(num_nodes, device=device) - ptr[batch])
    # each graph divided by the power of two above its largest weight: exact, and no
    # product can overflow or underflow whatever the weights' scale (centrality is scale-free)
    peak = torch.zeros(num_graphs, dtype=torch.float64, device=device)
    if e:
        peak = peak.scatter_reduce(0, batch[ei[0]], ew.double(), reduce="amax")
    exponent = torch.frexp(peak).exponent
    scale = torch.ldexp(torch.ones_like(peak), exponent)
    inv = torch.ldexp(torch.ones_like(peak), -exponent)
    if ew.dtype != torch.float64 and bool((exponent.abs() > 100).any()):
        ew = ew.double()
    ew = (ew * inv.to(ew.dtype)[batch[ei[0]]]).to(dtype)
    op = _SparseBatchOperator(slot[ei[0]], slot[ei[1]], ew, num_graphs * width, dtype, scale)
    mask = torch.arange(width, device=device)[None, :] < counts[:, None]
    res = solve_perron(op, mask, tol=tol, max_iter=max_iter, method=method)
    return res.vector.reshape(-1)[slot], res


def _coalesced_edges(
    edge_index: torch.Tensor,
    edge_weight: torch.Tensor | None,
    num_nodes: int | None,
    batch: torch.Tensor | None,
    dtype: torch.dtype | None,
    validate_args: bool,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """[`eigenvector_centrality`][dtg_gpu.eigenvector_centrality]'s edges checked and coalesced
    (duplicates summed): `(edge_index, edge_weight, num_nodes)`."""
    from torch_geometric.utils import coalesce

    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {list(edge_index.shape)}")
    if edge_index.dtype not in (torch.long, torch.int):
        raise ValueError(f"edge_index must be an integer tensor, got {edge_index.dtype}")
    device = edge_index.device
    e = edge_index.shape[1]
    if edge_weight is None:
        edge_weight = torch.ones(e, device=device)
    if edge_weight.shape != (e,):
        raise ValueError(f"edge_weight must have shape [{e}], got {list(edge_weight.shape)}")
    dtype = dtype or (edge_weight.dtype if edge_weight.is_floating_point() else torch.float32)
    if num_nodes is None:
        num_nodes = batch.numel() if batch is not None else (int(edge_index.max()) + 1 if e else 0)
    if num_nodes <= 0:
        raise ValueError("the graph has no nodes: centrality is undefined")
    if validate_args and e and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise ValueError(f"edge_index holds node ids outside [0, {num_nodes})")
    if not edge_weight.is_floating_point():
        edge_weight = edge_weight.to(dtype)
    if validate_args and (bool((edge_weight < 0).any()) or not bool(torch.isfinite(edge_weight).all())):
        raise ValueError("edge_weight must be finite and non-negative")
    wide = torch.promote_types(edge_weight.dtype, dtype)
    ei, ew = coalesce(edge_index.long(), edge_weight.to(wide), num_nodes=num_nodes, reduce="sum")
    if not bool(torch.isfinite(ew).all()):  # parallel entries summed past float32's range
        ei, ew = coalesce(edge_index.long(), edge_weight.double(), num_nodes=num_nodes, reduce="sum")
    et, wt = coalesce(ei.flip(0), ew, num_nodes=num_nodes, reduce="sum") if validate_args else (ei, ew)
    if validate_args and not (torch.equal(ei, et) and torch.allclose(ew, wt, rtol=1e-5, atol=0.0)):
        raise ValueError(
            "the adjacency is not symmetric: list both directions of every "
            "undirected edge (torch_geometric.utils.to_undirected)"
        )
    return ei, ew, num_nodes


def _graph_of_each_node(
    batch: torch.Tensor | None, ei: torch.Tensor, num_nodes: int, num_graphs: int | None, validate_args: bool
) -> tuple[torch.Tensor, int, torch.Tensor]:
    """`batch` checked (or one graph): `(batch, num_graphs, nodes per graph)`."""
    device = ei.device
    e = ei.shape[1]
    if batch is None:
        batch = torch.zeros(num_nodes, dtype=torch.long, device=device)
        num_graphs = 1
    if batch.shape != (num_nodes,):
        raise ValueError(f"batch must have shape [{num_nodes}], got {list(batch.shape)}")
    if validate_args and num_nodes > 1 and bool((batch.diff() < 0).any()):
        raise ValueError("batch must be sorted (nodes of each graph contiguous), as in PyG")
    num_graphs = int(batch.max()) + 1 if num_graphs is None else num_graphs
    counts = torch.bincount(batch, minlength=num_graphs)
    if validate_args and bool((counts == 0).any()):
        raise ValueError("some graph of the batch has no nodes")
    if validate_args and e and bool((batch[ei[0]] != batch[ei[1]]).any()):
        raise ValueError("an edge joins nodes of two different graphs of the batch")
    return batch, num_graphs, counts
