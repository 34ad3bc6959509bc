r"""``report/index.html`` and its PNG plots: what a user looks at after ``dtg demo``."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ._files import atomic_write
from .statistics import STATISTICS

__all__ = ["write_report", "results_table"]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_statistics(sf, path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 5, figsize=(20, 3.8), constrained_layout=True)
    acc = np.nan_to_num(sf.accuracies, nan=0.0)
    cmap = plt.get_cmap("viridis")
    t = np.arange(1, sf.timesteps + 1)
    for i, (ax, name) in enumerate(zip(axes, STATISTICS)):
        for r in np.argsort(acc):
            ax.plot(t, sf.stats[r, :, i].numpy(), color=cmap(acc[r]), lw=0.8, alpha=0.8)
        ax.set_title(f"centrality {name}")
        ax.set_xlabel("checkpoint")
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, 1))
    fig.colorbar(sm, ax=axes, label="final test accuracy")
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=90, format="png"))
    plt.close(fig)


def plot_vs_k(rows: Sequence[dict], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    names = list(dict.fromkeys(r["features"] for r in rows))
    for ax, metric in zip(axes, ("precision", "roc_auc")):
        for name in names:
            sel = sorted((r for r in rows if r["features"] == name), key=lambda r: r["k"])
            k = [r["k"] for r in sel]
            m = np.array([r["scores"][metric]["mean"] for r in sel])
            lo = np.array([r["scores"][metric]["ci_low"] for r in sel])
            hi = np.array([r["scores"][metric]["ci_high"] for r in sel])
            ax.plot(k, m, marker="o", label=name)
            ax.fill_between(k, lo, hi, alpha=0.15)
        ax.set_xlabel("checkpoints used (k)")
        ax.set_ylabel(metric.replace("roc_auc", "ROC AUC"))
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{metric.replace('roc_auc', 'ROC AUC')} vs how early we predict (95 % CI)")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
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


#: How the rows of :func:`~dtg_gpu.workflow.compare` are named for a reader.
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


def runs_table_html(sf, verdicts: dict) -> str:
    """A sortable HTML table, one row per run: hyper-parameters, final accuracy, label, and
    out-of-fold P(sufficient) with the verdict at each ``k``; diverged and left-out runs are
    marked (see :func:`dtg_gpu.workflow.run_verdicts`)."""
    ks, proba, label = verdicts["ks"], verdicts["proba"], verdicts["label"]
    diverged = _diverged(sf)
    head = ["run", "lr", "dropout", "seed", "final accuracy", "label", "status"]
    head += [h for k in ks for h in (f"P(sufficient) k={k}", f"verdict k={k}")]

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
            if np.isfinite(p):
                tds += [cell(f"{p:.2f}", p), cell("continue" if p >= 0.5 else "stop", cls="go" if p >= 0.5 else "stop")]
            else:
                tds += [cell("–", -1), cell("–")]
        rows.append(f'<tr class="{cls}">' + "".join(tds) + "</tr>")
    return (
        f'<table class="sortable"><thead><tr>{"".join(f"<th>{html.escape(h)}</th>" for h in head)}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def write_report(
    out: Path, sf, rows: Sequence[dict], example, headline: dict, title: str, verdicts: dict | None = None
) -> Path:
    """Write ``out/index.html`` with the plots beside it; returns its path. With
    ``verdicts`` (:func:`dtg_gpu.workflow.run_verdicts`) the page opens with the table of
    runs, P(sufficient) and the verdict at each ``k``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plot_statistics(sf, out / "statistics_over_training.png")
    plot_vs_k(rows, out / "precision_auc_vs_k.png")
    plot_roc_confusion(headline, out / "roc_confusion.png")
    if example is not None:
        plot_layer_centrality(example, out / "centrality_per_layer.png")
    table = results_table(rows)
    problems = _problem_runs(sf)
    runs_section = ""
    if verdicts is not None:
        runs_section = (
            "<h2>Every run: stop or continue?</h2><p>P(sufficient) of each run from the DTG "
            "features of its first k checkpoints, predicted by a model that did not see the run "
            "(5-fold cross-validation); verdict: continue at P &ge; 0.5. Click a column to sort. "
            "Diverged runs are shaded yellow, runs left out grey.</p>" + runs_table_html(sf, verdicts) + _SORT_JS
        )
    doc = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto}}img{{max-width:100%}}
pre{{background:#f4f4f4;padding:1em}}table.sortable{{border-collapse:collapse;font-size:13px}}
table.sortable th{{cursor:pointer;background:#eee;position:sticky;top:0}}
table.sortable td,table.sortable th{{border:1px solid #ddd;padding:2px 6px}}
td.stop{{color:#b00}}td.go{{color:#070}}tr.div{{background:#fff3d6}}tr.out{{background:#eee;color:#888}}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{len(sf.runs)} runs, {sf.timesteps} checkpoints each, alpha={sf.alpha}. Labels: final test
accuracy at or above the sweep median is <b>sufficient</b>. Scores: mean and 95 % interval over
repeated stratified 90/10 splits.</p>
<pre>{html.escape(table)}</pre>
{runs_section}
<h2>Centrality statistics over training</h2><img src="statistics_over_training.png">
<h2>How early can we tell?</h2><img src="precision_auc_vs_k.png">
<h2>ROC and confusion matrix</h2><img src="roc_confusion.png">
{'<h2>Centrality per layer</h2><img src="centrality_per_layer.png">' if example is not None else ""}
{problems}
</body></html>"""
    atomic_write(out / "index.html", doc)
    return out / "index.html"
