r"""`report/index.html` and its PNG plots: what a user looks at after `dtg demo`."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dtg_gpu.core.files import atomic_write
from dtg_gpu.early_stopping.rule import StoppingRule
from dtg_gpu.features.statistics import STATISTICS

__all__ = ["write_report", "results_table", "acting_costs", "STOP_BELOW"]

#: The verdict "stop" below this P(sufficient): the default `min_probability` of `dtg watch`,
#: `dtg predict` and [`StoppingRule`][dtg_gpu.early_stopping.rule.StoppingRule].
STOP_BELOW: float = StoppingRule.min_probability


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_statistics(sf, path: Path) -> None:
    """Each statistic of the centrality over the checkpoints, one line per run coloured by its
    final accuracy; diverged runs dashed red (their non-finite checkpoints are gaps)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 5, figsize=(20, 3.8), constrained_layout=True)
    acc = np.nan_to_num(sf.accuracies, nan=0.0)
    diverged = _diverged(sf)
    cmap = plt.get_cmap("viridis")
    t = np.arange(1, sf.timesteps + 1)
    units = {"skewness": " (unitless)", "kurtosis": " (excess, unitless)"}
    xlabel = f"checkpoint (one = one {_unit(sf)})"
    for i, (ax, name) in enumerate(zip(axes, STATISTICS)):
        for r in np.argsort(acc):
            if not sf.usable[r]:
                continue
            style = dict(color="#c00", lw=1.0, ls="--") if diverged[r] else dict(color=cmap(acc[r]), lw=0.8, alpha=0.8)
            ax.plot(t, sf.stats[r, :, i].numpy(), marker=".", ms=3, **style)
        ax.set_title(f"centrality {name}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{name} of the centrality{units.get(name, '')}")
        ax.set_xticks(t if len(t) <= 12 else t[:: max(1, len(t) // 10)])
    if any(diverged):
        axes[0].plot([], [], color="#c00", ls="--", label="diverged run")
        axes[0].legend(loc="best", fontsize=8)
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, 1))
    fig.colorbar(sm, ax=axes[-1], label="final test accuracy", fraction=0.08, pad=0.02)
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=90, format="png"))
    plt.close(fig)


def plot_vs_k(rows: Sequence[dict], path: Path) -> None:
    """Precision and ROC AUC of each feature set at each measured `k`: a point with its 95 %
    interval as an error bar, the sets side by side (no line between the measured k)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), constrained_layout=True)
    names = list(dict.fromkeys(r["features"] for r in rows))
    ks = sorted({r["k"] for r in rows})
    pos = {k: i for i, k in enumerate(ks)}
    width = 0.7 / max(1, len(names))
    for ax, metric in zip(axes, ("precision", "roc_auc")):
        label = metric.replace("roc_auc", "ROC AUC")
        for j, name in enumerate(names):
            sel = [r for r in rows if r["features"] == name]
            x = np.array([pos[r["k"]] for r in sel]) + (j - (len(names) - 1) / 2) * width
            m = np.array([r["scores"][metric]["mean"] for r in sel])
            lo = m - np.array([r["scores"][metric]["ci_low"] for r in sel])
            hi = np.array([r["scores"][metric]["ci_high"] for r in sel]) - m
            ax.errorbar(x, m, yerr=[lo, hi], fmt="o", capsize=3, label=ROW_LABELS.get(name, name))
        ax.set_xticks(range(len(ks)), [str(k) for k in ks])
        ax.set_xlabel("checkpoints used (k)")
        ax.set_ylabel(f"{label} of the sufficient class (0–1)" if metric == "precision" else f"{label} (0–1)")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{label} vs how early we predict (mean, 95 % CI)")
        ax.grid(alpha=0.3, axis="y")
    axes[1].legend(loc="lower right", fontsize=8)
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=90, format="png"))
    plt.close(fig)


def plot_roc_confusion(row: dict, path: Path) -> None:
    plt = _plt()
    s = row["scores"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.2), constrained_layout=True)
    a.plot(s["roc"]["fpr"], s["roc"]["tpr"], lw=2, label=f"AUC {s['roc_auc']['mean']:.3f}")
    a.plot([0, 1], [0, 1], "k--", lw=0.8)
    a.set_xlabel("false positive rate")
    a.set_ylabel("true positive rate")
    a.set_title(f"ROC, {row['features']} k={row['k']} (test splits pooled)")
    a.legend(loc="lower right")
    cm = np.array(s["confusion_matrix"])
    b.imshow(cm, cmap="Blues")
    for (i, j), v in np.ndenumerate(cm):
        b.text(j, i, str(v), ha="center", va="center", fontsize=14)
    b.set_xticks([0, 1], ["insufficient", "sufficient"])
    b.set_yticks([0, 1], ["insufficient", "sufficient"])
    b.set_xlabel("predicted")
    b.set_ylabel("true")
    b.set_title(f"confusion matrix, summed over {s['repeats']} splits")
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=90, format="png"))
    plt.close(fig)


def plot_layer_centrality(result, path: Path) -> None:
    plt = _plt()
    owners = np.array(result.topology.node_owner)
    layers = list(dict.fromkeys(owners))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), constrained_layout=True, sharey=True)
    for ax, t, title in ((axes[0], 0, "first"), (axes[1], len(result) - 1, "last")):
        x = result.centrality[t].numpy()
        ax.boxplot([x[owners == l] for l in layers], showfliers=False)
        ax.set_xticks(range(1, len(layers) + 1), layers, rotation=45, ha="right")
        ax.set_yscale("log")
        ax.set_title(f"centrality per layer, {title} checkpoint ({result.run.name})")
    axes[0].set_ylabel("eigenvector centrality")
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=90, format="png"))
    plt.close(fig)


#: How the rows of [`compare`][dtg_gpu.workflow.verdicts.compare] are named for a reader.
ROW_LABELS = {
    "default": "default (dtg_gpu)",
    "dtg": "dtg (seed's method)",
    "learning_curve": "learning_curve (uses data)",
}


def results_table(rows: Sequence[dict], markdown: bool = False) -> str:
    """One line per (feature set, k): precision / recall / F1 / AUC / average precision,
    mean [95 % CI]."""
    head = ["features", "k", "precision", "recall", "f1", "roc_auc", "average_precision"]
    lines = []
    for r in rows:
        cells = [ROW_LABELS.get(r["features"], r["features"]), str(r["k"])]
        for m in head[2:]:
            s = r["scores"][m]
            cells.append(f"{s['mean']:.3f} [{s['ci_low']:.2f}, {s['ci_high']:.2f}]")
        lines.append(cells)
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(c) + " |" for c in lines]
        return "\n".join(out)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*c) for c in lines])


def _diverged(sf) -> list[bool]:
    return [
        bool(ok) and (r.meta.get("status") == "diverged" or not np.isfinite(sf.stats[i].numpy()).all())
        for i, (r, ok) in enumerate(zip(sf.runs, sf.usable))
    ]


def _problem_runs(sf) -> str:
    """HTML list of the runs that could not be read (left out) and of those that diverged
    (non-finite weights: insufficient by rule)."""
    parts = []
    if sf.failed:
        items = "".join(
            f"<li><b>{html.escape(str(n))}</b>: {html.escape(str(why))}</li>" for n, why in sf.failed.items()
        )
        parts.append(
            f"<h2>Runs left out ({len(sf.failed)})</h2><p>These runs could not be read "
            f"or solved; they are in no score above.</p><ul>{items}</ul>"
        )
    diverged = [r.name for r, d in zip(sf.runs, _diverged(sf)) if d]
    if diverged:
        parts.append(
            f"<h2>Diverged runs ({len(diverged)})</h2><p>Non-finite weights or loss during "
            "training: their features are NaN from that checkpoint on, and the predictor "
            "calls them insufficient by rule.</p><p>" + ", ".join(html.escape(str(n)) for n in diverged) + "</p>"
        )
    return "\n".join(parts)


_SORT_JS = """<script>
document.querySelectorAll("table.sortable th").forEach(function (th, col) {
  th.addEventListener("click", function () {
    var body = th.closest("table").tBodies[0], rows = Array.from(body.rows);
    var up = th.dataset.dir !== "asc"; th.dataset.dir = up ? "asc" : "desc";
    rows.sort(function (a, b) {
      var x = a.cells[col].dataset.v, y = b.cells[col].dataset.v, nx = parseFloat(x), ny = parseFloat(y);
      var c = (isNaN(nx) || isNaN(ny)) ? String(x).localeCompare(String(y)) : nx - ny;
      return up ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
</script>"""


def acting_costs(sf, verdicts: dict, stop_below: float = STOP_BELOW) -> list[dict]:
    """What acting on the verdicts at each early `k` (`k < T`) costs and saves: the runs
    stopped (`P(sufficient) < stop_below`), the share of the remaining epochs they would
    not run, the sufficient runs among them, and whether the best run is kept.

    Examples
    --------
    >>> import numpy as np, types
    >>> sf = types.SimpleNamespace(timesteps=4, usable=np.ones(3, bool), accuracies=np.array([.9, .2, .5]))
    >>> v = {"ks": [2, 4], "proba": np.array([[.8, .9], [.1, .1], [.2, .6]]), "label": np.array([1, 0, 1])}
    >>> [(c["k"], c["stopped"], round(c["saved"], 2), c["sufficient_lost"], c["best_kept"]) for c in acting_costs(sf, v)]
    [(2, 2, 0.67, 1, True)]
    """
    out = []
    T = int(sf.timesteps)
    usable = np.asarray(sf.usable, bool)
    acc = np.where(usable, np.nan_to_num(np.asarray(sf.accuracies, float), nan=-np.inf), -np.inf)
    best = int(np.argmax(acc)) if usable.any() else -1
    label = np.asarray(verdicts["label"])
    for j, k in enumerate(verdicts["ks"]):
        if k >= T:
            continue  # not early: nothing left to save
        p = np.asarray(verdicts["proba"])[:, j]
        judged = usable & np.isfinite(p)
        stop = judged & (p < stop_below)
        out.append(
            {
                "k": int(k),
                "judged": int(judged.sum()),
                "stopped": int(stop.sum()),
                "saved": float(stop.sum() / judged.sum()) if judged.any() else 0.0,  # each run has T - k left
                "sufficient": int((judged & (label == 1)).sum()),
                "sufficient_lost": int((stop & (label == 1)).sum()),
                "best_kept": bool(best >= 0 and not stop[best]),
                "remaining": T - int(k),
            }
        )
    return out


def _costs_html(sf, verdicts: dict, unit: str) -> str:
    costs = acting_costs(sf, verdicts)
    if not costs:
        return ""
    items = "".join(
        f"<li><b>At k = {c['k']}</b> ({c['remaining']} {unit}s left per run): stop {c['stopped']} of "
        f"{c['judged']} runs &rarr; <b>{c['saved']:.0%} of the remaining {unit}s saved</b>; "
        f"{c['sufficient_lost']} of the {c['sufficient']} sufficient runs lost; "
        f"the best run {'<b>kept</b>' if c['best_kept'] else '<b style=color:#b00>lost</b>'}.</li>"
        for c in costs
    )
    return (
        '<div class="box"><h2>What acting on the verdicts costs</h2><p>Verdict <i>stop</i> at '
        f"P(sufficient) &lt; {STOP_BELOW} (the default of <code>dtg watch</code> and <code>dtg predict</code>); "
        f"one checkpoint is one {unit}. The probabilities come from models that did not see the run "
        f"(cross-validation).</p><ul>{items}</ul></div>"
    )


def _scores_html(rows: Sequence[dict]) -> str:
    """The scores as an HTML table, the best row (highest mean AUC, then precision) marked."""
    head = ["features", "k", "precision", "recall", "f1", "roc_auc", "average_precision"]
    if not rows:
        return ""
    last = max(r["k"] for r in rows)
    early = [i for i, r in enumerate(rows) if r["k"] < last] or list(range(len(rows)))
    best = max(early, key=lambda i: (rows[i]["scores"]["roc_auc"]["mean"], rows[i]["scores"]["precision"]["mean"]))
    body = []
    for i, r in enumerate(rows):
        cells = [ROW_LABELS.get(r["features"], r["features"]), str(r["k"])]
        for m in head[2:]:
            sc = r["scores"][m]
            cells.append(f"{sc['mean']:.3f} [{sc['ci_low']:.2f}, {sc['ci_high']:.2f}]")
        cls = ' class="best"' if i == best else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return (
        '<table class="scores"><thead><tr>'
        + "".join(f"<th>{html.escape(h.replace('roc_auc', 'ROC AUC').replace('_', ' '))}</th>" for h in head)
        + f"</tr></thead><tbody>{''.join(body)}</tbody></table><p>Marked: the best early row (k below the last checkpoint; highest ROC AUC, then precision).</p>"
    )


def _unit(sf) -> str:
    """What one checkpoint is: `dtg sweep` records it (`checkpoint_unit`, `checkpoint_every`
    in run.json); other runs say "checkpoint"."""
    meta = getattr(sf.runs[0], "meta", {}) if getattr(sf, "runs", None) else {}
    unit = meta.get("checkpoint_unit") if isinstance(meta, dict) else None
    if unit not in ("epoch", "step"):
        return "checkpoint"
    every = meta.get("checkpoint_every", 1)
    return unit if every in (1, None) else f"{every}-{unit} interval"


def runs_table_html(sf, verdicts: dict) -> str:
    """A sortable HTML table, one row per run: hyper-parameters, final accuracy, label, and
    out-of-fold P(sufficient) with the verdict at each `k`; diverged and left-out runs are
    marked (see [`dtg_gpu.workflow.verdicts.run_verdicts`][dtg_gpu.workflow.verdicts.run_verdicts])."""
    ks, proba, label = verdicts["ks"], verdicts["proba"], verdicts["label"]
    diverged = _diverged(sf)
    head = ["run", "lr", "dropout", "seed", "final accuracy", "label", "status"]
    early = [k < sf.timesteps for k in ks]  # no verdict at k = T: the run has ended
    head += [
        h
        for k, e in zip(ks, early)
        for h in ((f"P(sufficient) k={k}", f"verdict k={k}") if e else (f"P(sufficient) k={k}",))
    ]

    def cell(text, value=None, cls=""):
        v = text if value is None else value
        return f'<td data-v="{html.escape(str(v))}"{f" class={cls}" if cls else ""}>{html.escape(str(text))}</td>'

    rows = []
    for i, run in enumerate(sf.runs):
        acc = sf.accuracies[i]
        status = "left out" if not sf.usable[i] else ("diverged" if diverged[i] else "ok")
        cls = {"left out": "out", "diverged": "div"}.get(status, "")
        tds = [
            cell(run.name),
            cell(run.meta.get("lr", "")),
            cell(run.meta.get("dropout", "")),
            cell(run.meta.get("seed", "")),
            cell(f"{acc:.3f}" if np.isfinite(acc) else "–", acc),
            cell({1: "sufficient", 0: "insufficient"}.get(int(label[i]), "–")),
            cell(status, cls=cls),
        ]
        for j in range(len(ks)):
            p = proba[i, j]
            go = p >= STOP_BELOW
            if np.isfinite(p):
                tds += [cell(f"{p:.2f}", p)] + (
                    [cell("continue" if go else "stop", cls="go" if go else "stop")] if early[j] else []
                )
            else:
                tds += [cell("–", -1)] + ([cell("–")] if early[j] else [])
        rows.append(f'<tr class="{cls}">' + "".join(tds) + "</tr>")
    return (
        f'<table class="sortable"><thead><tr>{"".join(f"<th>{html.escape(h)}</th>" for h in head)}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def write_report(
    out: Path, sf, rows: Sequence[dict], example, headline: dict, title: str, verdicts: dict | None = None
) -> Path:
    """Write `out/index.html` with the plots beside it; returns its path. With
    `verdicts` ([`dtg_gpu.workflow.verdicts.run_verdicts`][dtg_gpu.workflow.verdicts.run_verdicts]) the page opens with the table of
    runs, P(sufficient) and the verdict at each `k`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plot_statistics(sf, out / "statistics_over_training.png")
    plot_vs_k(rows, out / "precision_auc_vs_k.png")
    plot_roc_confusion(headline, out / "roc_confusion.png")
    if example is not None:
        plot_layer_centrality(example, out / "centrality_per_layer.png")
    table = _scores_html(rows)
    problems = _problem_runs(sf)
    unit = _unit(sf)
    runs_section = costs = ""
    if verdicts is not None:
        costs = _costs_html(sf, verdicts, unit)
        runs_section = (
            "<h2>Every run: stop or continue?</h2><p>P(sufficient) of each run from the features of its "
            "first k checkpoints, predicted by a model that did not see the run "
            f"(5-fold cross-validation); verdict: stop below P = {STOP_BELOW}, no verdict at k = {sf.timesteps} "
            "(the run has ended). Click a column to sort. "
            "Diverged runs are shaded yellow, runs left out grey.</p>" + runs_table_html(sf, verdicts) + _SORT_JS
        )
    doc = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto}}img{{max-width:100%}}
pre{{background:#f4f4f4;padding:1em}}table.sortable{{border-collapse:collapse;font-size:13px}}
table.sortable th{{cursor:pointer;background:#eee;position:sticky;top:0}}
table.sortable td,table.sortable th{{border:1px solid #ddd;padding:2px 6px}}
td.stop{{color:#b00}}td.go{{color:#070}}tr.div{{background:#fff3d6}}tr.out{{background:#eee;color:#888}}
table.scores{{border-collapse:collapse}}table.scores td,table.scores th{{border:1px solid #ddd;padding:3px 8px}}
tr.best{{background:#e6f4e6;font-weight:bold}}div.box{{border:2px solid #2a6;padding:0 1em;margin:1em 0}}
</style></head><body>
<h1>{html.escape(title)}</h1>
{costs}
<p>{len(sf.runs)} runs, {sf.timesteps} checkpoints each (one checkpoint = one {unit}), alpha={sf.alpha}.
Labels: final test accuracy at or above the sweep median is <b>sufficient</b>. Scores: mean and
95 % interval over repeated stratified 90/10 splits.</p>
{table}
{runs_section}
<h2>Centrality statistics over training</h2><img src="statistics_over_training.png">
<h2>How early can we tell?</h2><img src="precision_auc_vs_k.png">
<h2>ROC and confusion matrix</h2><img src="roc_confusion.png">
{'<h2>Centrality per layer</h2><img src="centrality_per_layer.png">' if example is not None else ""}
{problems}
</body></html>"""
    atomic_write(out / "index.html", doc)
    return out / "index.html"
