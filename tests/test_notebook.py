"""notebooks/evaluate.ipynb executes top to bottom on a tiny run made here (random weights, synthetic metrics)."""

import json
import os

import jax
import nbclient  # the test extra installs nbclient, nbformat and lm-eval: missing ones fail here
import nbformat
import numpy as np

from sps_jax import config as sps_config, model as sps_model, runs, vocab
from sps_jax.data import tokenizer
from tests.helpers import REPO, decoded_png, ensure_tokenizer


def make_run(path, variant, seed):
    config = sps_config.load_config(f"configs/tiny.py:{variant},4" if variant != "standard" else "configs/tiny.py:standard")
    config.model.num_layers, config.model.d_model, config.model.d_ff, config.model.seq_len = 1, 32, 96, 64
    net = sps_model.Transformer(config.model)
    runs.save_run(str(path), config, sps_model.init_params(net, jax.random.PRNGKey(seed)), step=40)
    rng = np.random.default_rng(seed)
    with open(path / "metrics.jsonl", "w") as f:
        for step in range(0, 41, 10):
            f.write(json.dumps({"step": step, "tokens_seen": step * 1024, "loss": 10 - step / 10 + rng.random(),
                                "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 1e4, "mfu": 0.1, "elapsed_s": step}) + "\n")
            if step % 20 == 0:
                f.write(json.dumps({"step": step, "tokens_seen": step * 1024, "val_loss": 10.5 - step / 10}) + "\n")


def test_evaluate_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    ensure_tokenizer()  # the notebook needs the provisioned GPT-2 tokenizer
    make_run(tmp_path / "sps", "sps", 0)
    make_run(tmp_path / "standard", "standard", 1)
    make_run(tmp_path / "sps-again", "sps", 2)  # the same run name as "sps": its curves must not replace those
    data = tmp_path / "data"
    data.mkdir()
    ids = []
    for doc in ["The state of a system is what persists.", "Predictions are made and then forgotten."] * 6:
        ids += tokenizer.encode(doc) + [vocab.EOS_ID]
    np.asarray(ids, "<u2").tofile(data / "val.bin")
    (data / "manifest.json").write_text(json.dumps({"tokenizer": "gpt2", "dtype": "uint16", "eos_id": 50256,
                                                   "splits": {"val": {"file": "val.bin", "tokens": len(ids)}}}))
    books = tmp_path / "books.jsonl"
    books.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["Once upon a time there was a model.",
                                                                       "It read every book it could find."]))
    out = tmp_path / "out"

    def rel(path) -> str:  # as a user passes them: relative to the checkout's root
        return os.path.relpath(path, REPO)

    compare = f"{rel(tmp_path / 'standard')},{rel(tmp_path / 'sps-again')}"
    for key, value in {"SPS_EVAL_RUN": rel(tmp_path / "sps"), "SPS_EVAL_COMPARE": compare,
                       "SPS_EVAL_TASKS": "pile_books3", "SPS_EVAL_TASK_DATA": f"pile_books3={rel(books)}",
                       "SPS_EVAL_VAL_DATA": rel(data), "SPS_EVAL_INCLUDE_DEFAULTS": "0", "SPS_EVAL_OUT": rel(out),
                       "SPS_EVAL_MAX_NEW_TOKENS": "4",
                       "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(os.path.join(REPO, "notebooks", "evaluate.ipynb"), as_version=4)
    # Jupyter and `jupyter execute` start the kernel in the notebook's folder.
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": os.path.join(REPO, "notebooks")}}).execute()
    result = json.loads((out / "step_40.json").read_text())
    assert result["variant"] == "sps" and result["val_nll"] > 0 and result["corpus_nll"]["pile_books3"] > 0
    height, width, _ = decoded_png(out / "curves.png").shape
    assert width > 2 * height  # training loss and validation NLL side by side
    # The curves cell's value shows as an image (a Figure pyplot does not hold showed as its text in a fresh kernel).
    curves_cell = next(c for c in nb.cells if c.cell_type == "code" and "training_curves(" in c.source)
    assert any("image/png" in o.get("data", {}) for o in curves_cell.outputs), curves_cell.outputs
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "The state of a system is|" in printed and "tiny-standard" in printed
    assert printed.count("training records") == 3 and f"{rel(tmp_path / 'sps-again')}: 5 training records" in printed
