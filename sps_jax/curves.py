"""Training and validation curves of run folders (``workdir/metrics.jsonl``), side by side in one PNG."""

from __future__ import annotations

from sps_jax import metrics, plotting


def read_metrics(workdir: str) -> dict[str, list[dict]]:
    """{"train": records with "loss", "val": records with "val_loss"} of ``metrics.read``, each sorted by step."""
    records = sorted(metrics.read(workdir, required=True), key=lambda r: r["step"])
    return {"train": [r for r in records if "loss" in r], "val": [r for r in records if "val_loss" in r]}


def plot_curves(runs: dict[str, str], out_png: str | None = None, x: str = "tokens_seen"):
    """Training loss and validation NLL against ``x`` for several runs ({label: workdir}); returns the figure."""
    plt = plotting.pyplot(headless=bool(out_png))
    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(11, 4))
    for label, workdir in runs.items():
        m = read_metrics(workdir)
        if m["train"]:
            ax_train.plot([r[x] for r in m["train"]], [r["loss"] for r in m["train"]], label=label, lw=1)
        if m["val"]:
            ax_val.plot([r[x] for r in m["val"]], [r["val_loss"] for r in m["val"]], marker="o", label=label)
    for ax, title in ((ax_train, "training loss"), (ax_val, "validation NLL (nats/token)")):
        ax.set_xlabel(x.replace("_", " "))
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.lines:  # a run without validation yet leaves that panel empty
            ax.legend()
    fig.tight_layout()
    if out_png:
        plotting.save_figure(fig, out_png, dpi=120)
    return fig
