"""Figure commands over fixture run folders and evaluation JSONs (Figures 2, 3, 4 of the paper)."""

import dataclasses
import json
import os
import re
import sys

import numpy as np
import pytest

from sps_jax import flops, masks
from sps_jax import model as sps_model
from sps_jax.analysis import figures, seeds
from tests.helpers import decoded_png, run_module, small_config


def write_run(folder, name, variant, window, val_losses, tokens_per_eval=1000, train=None, **model):
    """A run folder with one validation record per ``tokens_per_eval`` tokens; ``train`` its config's train
    section (none by default), ``model`` overrides of the small model."""
    os.makedirs(folder, exist_ok=True)
    cfg = dataclasses.asdict(small_config(variant, window, **model))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"name": name, "model": cfg, **({"train": train} if train else {})}, f)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        for n, val in enumerate(val_losses, start=1):
            f.write(json.dumps({"step": 10 * n, "tokens_seen": n * tokens_per_eval, "loss": val + 0.1,
                                "lr": 1e-3}) + "\n")
            f.write(json.dumps({"step": 10 * n, "tokens_seen": n * tokens_per_eval, "val_loss": val}) + "\n")
    return str(folder)


def write_eval(folder, name, scale, variant, window, acc, tokens=20_000, val_nll=3.0):
    path = os.path.join(folder, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"run": name, "variant": variant, "window": window, "scale": scale, "step": 1,
                   "tokens_seen": tokens, "val_nll": val_nll, "corpus_nll": {}, "corpus_nll_avg": None,
                   "tasks": {}, "task_accuracy_avg": acc}, f)
    return path


@pytest.mark.parametrize("variant, window", [("standard", None), ("sps", 2)])
def test_compute_axis_is_the_design_documents_training_flops(tmp_path, variant, window):
    cfg = small_config(variant, window)
    run = write_run(tmp_path / "run", "tiny", variant, window, [4.0, 3.5, 3.2])
    data = figures.curves([run], str(tmp_path / "c.png"))
    # docs/design.md section 7, counted independently: 3 x (2 x block matmul weights x S
    # + 4 d x visible keys per position (from the dense mask) per layer + 2 d V for the head).
    norms = (2 * cfg.num_layers + 1) * cfg.d_model
    block_matmul = sps_model.count_params(sps_model.Transformer(cfg)) - norms - cfg.vocab_size * cfg.d_model
    S = masks.Visibility(variant).num_streams
    T = cfg.seq_len
    keys = masks.dense_mask(masks.Visibility(variant, window), np.zeros((1, T), np.int32)).sum() / T
    forward = 2 * block_matmul * S + 4 * cfg.d_model * cfg.num_layers * keys + 2 * cfg.d_model * cfg.vocab_size
    run_data = data["runs"][0]
    np.testing.assert_allclose(np.array(run_data["train_flops"]) / np.array(run_data["tokens_seen"]), 3 * forward)
    assert "sps_jax.flops" in data["flops_convention"]


def test_curves_command_plots_validation_against_tokens_and_compute(tmp_path):
    std = write_run(tmp_path / "std", "tiny-standard", "standard", None, [4.0, 3.5, 3.2, 3.1])
    sps = write_run(tmp_path / "sps", "tiny-sps-w2", "sps", 2, [3.9, 3.4, 3.1, 3.0])
    out = str(tmp_path / "curves.png")
    assert figures.main(["curves", std, sps, "--out", out]) == 0
    data = json.load(open(out[:-4] + ".json"))
    assert [r["label"] for r in data["runs"]] == ["tiny-standard", "tiny-sps-w2"]
    assert data["runs"][1]["val_loss"] == [3.9, 3.4, 3.1, 3.0]
    ratio = np.array(data["runs"][1]["train_flops"]) / np.array(data["runs"][1]["tokens_seen"])
    np.testing.assert_allclose(ratio, flops.train_flops_per_token(small_config("sps", 2)))
    height, width, _ = decoded_png(out).shape
    assert width > height


def test_curves_of_a_run_whose_config_json_names_another_model_than_its_checkpoints_is_one_sentence(tmp_path):
    # Another run's config.json in the folder: the SPS run's curve was drawn, labelled and costed as Standard.
    from sps_jax import checkpoint
    run = write_run(tmp_path / "run", "tiny-standard", "standard", None, [4.0, 3.5])
    checkpoint.save_params(run, 20, {"w": np.zeros(2, np.float32)}, small_config("sps", 2).function_fields)
    with pytest.raises(checkpoint.OtherModel, match="checkpoint step 20 of .* was trained as variant='sps'"):
        figures.curves([run], str(tmp_path / "c.png"))
    assert not os.path.exists(tmp_path / "c.png")


def test_curves_of_runs_that_share_a_name_are_labelled_by_their_folders(tmp_path):
    # Seeds of one config share its name: the legend and the numbers file showed "tiny-standard" twice.
    runs_ = [write_run(tmp_path / "runs" / folder, name, variant, window, [4.0, 3.5])
             for folder, name, variant, window in (("std", "tiny-standard", "standard", None),
                                                   ("std-seed1", "tiny-standard", "standard", None),
                                                   ("sps", "tiny-sps-w2", "sps", 2))]
    data = figures.curves(runs_, str(tmp_path / "curves.png"))
    assert [r["label"] for r in data["runs"]] == ["std", "std-seed1", "tiny-sps-w2"]
    assert [r["workdir"] for r in data["runs"]] == runs_


def run_evaluated_at(tmp_path, evaluations, tokens) -> str:
    """A run whose evaluations are at the given multiples of ``tokens`` tokens seen."""
    run = tmp_path / "run"
    write_run(run, "tiny", "sps", 2, [4.0 - n / 10 for n in range(len(evaluations))], tokens_per_eval=1000)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        record["tokens_seen"] = evaluations[record["step"] // 10 - 1] * tokens
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(run)


@pytest.mark.parametrize("evaluations", [(1, 2, 3), (1, 2, 3, 4), (2, 3, 5, 9)])
def test_curves_labels_at_least_two_ticks_on_an_axis_shorter_than_two_decades(tmp_path, monkeypatch, evaluations):
    """The README's tiny run evaluates at 1e5, 2e5 and 3e5 tokens: decade ticks alone gave its tokens axis one
    label (1e5) and its compute axis none."""
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, out: (fig.canvas.draw(), drawn.append(fig)))
    figures.curves([run_evaluated_at(tmp_path, evaluations, 1000)], str(tmp_path / "c.png"))
    for ax in drawn[0].axes:
        lo, hi = sorted(ax.get_xlim())
        labels = [t.get_text() for t in ax.xaxis.get_majorticklabels()
                  if t.get_text() and lo <= t.get_position()[0] <= hi]
        assert len(labels) >= 2, (ax.get_xlabel(), labels)


@pytest.mark.parametrize("variants, label", [(["sps"], "<predict> window w"), (["delayed_state"], "x window w"),
                                             (["sps", "reverse_sps"], "<predict> or x window w")])
def test_window_ablations_axis_names_the_stream_the_window_limits(tmp_path, monkeypatch, variants, label):
    # Delayed State's window limits its input entries: the axis said "<predict> window w" for every variant.
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, out: drawn.append(fig))
    sources = [write_run(tmp_path / f"{v}{w}", f"s-{v}-w{w}", v, w, [3.5, 3.0 + w / 1000])
               for v in variants for w in (4, 16)]
    figures.window_ablation(sources, str(tmp_path / "window.png"))
    assert drawn[0].axes[0].get_xlabel() == label


def test_window_ablation_command_reads_runs_and_evaluations(tmp_path):
    sources = [write_run(tmp_path / f"sps{w}", f"s-sps-w{w}", "sps", w, [3.5, 3.0 + w / 1000]) for w in (0, 16, 64)]
    sources.append(write_run(tmp_path / "std", "s-standard", "standard", None, [3.6, 3.2]))
    sources += [write_eval(str(tmp_path), f"rev{w}", "s", "reverse_sps", w, None, val_nll=3.3 - w / 1000,
                           tokens=2000) for w in (0, 16, 64)]  # the runs' two validations of 1000 tokens each
    out = str(tmp_path / "window.png")
    assert figures.main(["window-ablation", *sources, "--out", out]) == 0
    points = json.load(open(out[:-4] + ".json"))["points"]
    sps = sorted((p["window"], p["val_nll"]) for p in points if p["variant"] == "sps")
    assert sps == [(0, 3.0), (16, 3.016), (64, 3.064)]
    assert {p["variant"] for p in points} == {"sps", "standard", "reverse_sps"}
    height, width, _ = decoded_png(out).shape
    assert width > height


def test_a_run_of_weights_alone_is_told_to_pass_its_evaluation(tmp_path, capsys):
    # An imported run (config.json and checkpoints, no metrics) was "not a training run folder", with nothing to do.
    run = write_run(tmp_path / "imported", "s-sps-w16", "sps", 16, [3.0])
    os.remove(os.path.join(run, "metrics.jsonl"))
    os.makedirs(os.path.join(run, "checkpoints", "16"))
    assert figures.main(["window-ablation", run, "--out", str(tmp_path / "w.png")]) == 2
    assert capsys.readouterr().err == (
        f"error: {run!r} has weights but no metrics.jsonl (an imported run?), so no validation loss: evaluate it "
        f"(python -m sps_jax.evaluation.evaluate --workdir {run} --val-data DATA) and pass its eval/step_N.json.\n")


def test_window_ablation_draws_one_line_per_scale_and_refuses_a_window_twice(tmp_path, capsys):
    """Figure 4 is one scale (S): before, S and M runs of one variant were joined into a single line,
    zigzagging between the scales at every window, and two runs at one window into a vertical stroke."""
    d = str(tmp_path)
    sources = [write_eval(d, f"{scale}-sps-{w}", scale, "sps", w, None, val_nll=nll)
               for scale, w, nll in (("s", 0, 3.0), ("s", 64, 2.95), ("m", 0, 2.8), ("m", 64, 2.7))]
    sources.append(write_eval(d, "s-std", "s", "standard", None, None, val_nll=3.1))
    out = str(tmp_path / "w.png")
    assert figures.main(["window-ablation", *sources, "--out", out]) == 0
    lines = json.load(open(out[:-4] + ".json"))["lines"]
    assert lines == [{"label": "SPS (M)", "window": [0, 64], "val_nll": [2.8, 2.7]},
                     {"label": "SPS (S)", "window": [0, 64], "val_nll": [3.0, 2.95]}]
    twice = write_eval(d, "s-sps-64-again", "s", "sps", 64, None, val_nll=2.9)
    assert figures.main(["window-ablation", *sources, twice, "--out", str(tmp_path / "w2.png"), "--force"]) == 2
    assert f"{sources[1]} and {twice} both hold SPS (w=64) at scale S: pass one of them." in capsys.readouterr().err
    assert not (tmp_path / "w2.png").exists()
    # Reference lines alone: the figure had no window axis, only the dashed lines, and was written.
    assert figures.main(["window-ablation", sources[-1], "--out", str(tmp_path / "w4.png")]) == 2
    assert ("window-ablation draws NLL against the window, and none of its 1 source(s) has one (standard and "
            "two_x_memory are reference lines): add runs of a windowed variant.") in capsys.readouterr().err
    assert not (tmp_path / "w4.png").exists()
    # The paper's points are all after 20B tokens: a run stopped at half of that is not one of them.
    half = write_eval(d, "s-sps-16-half", "s", "sps", 16, None, tokens=10_000, val_nll=3.2)
    assert figures.main(["window-ablation", *sources, half, "--out", str(tmp_path / "w3.png")]) == 2
    assert f"{half} ends after 10,000 training tokens and {sources[0]} after 20,000: pass runs trained for one " \
        "number of tokens." in capsys.readouterr().err


def test_accuracy_gain_keeps_each_window_of_a_variant(tmp_path, capsys):
    """Evaluations of SPS at two windows (the window ablation's runs) are two methods: before, the second
    replaced the first without a word, so the figure showed one of them under the name sps."""
    d = str(tmp_path)
    paths = [write_eval(d, "s-std", "s", "standard", None, 0.45),
             write_eval(d, "s-sps16", "s", "sps", 16, 0.47),
             write_eval(d, "s-sps64", "s", "sps", 64, 0.48)]
    out = str(tmp_path / "gain.png")
    assert figures.main(["accuracy-gain", *paths, "--out", out]) == 0
    rows = json.load(open(out[:-4] + ".json"))["gains"]
    assert {(g["variant"], g["window"]): g["gain_pp"] for g in rows} == pytest.approx({("sps", 16): 2.0,
                                                                                       ("sps", 64): 3.0})
    assert [g["method"] for g in rows] == ["SPS (w=16)", "SPS (w=64)"]  # the bars' legend
    twice = write_eval(d, "s-sps64-again", "s", "sps", 64, 0.49)
    assert figures.main(["accuracy-gain", *paths, twice, "--out", str(tmp_path / "g2.png")]) == 2
    assert f"{paths[2]} and {twice} both hold SPS (w=64) at scale S after 20000 tokens: pass one of them." \
        in capsys.readouterr().err
    # A smoke evaluation (evaluate --limit 10) against whole tasks: a gain of 20 pp was drawn without a word.
    smoke = write_eval(d, "s-sps64-smoke", "s", "sps", 64, 0.65)
    json.dump(dict(json.load(open(smoke)), limit=10), open(smoke, "w"))
    assert figures.main(["accuracy-gain", *paths[:2], smoke, "--out", str(tmp_path / "g3.png")]) == 2
    assert capsys.readouterr().err == (f"error: {paths[0]} was evaluated without --limit and {smoke} with --limit 10, "
                                       "so their accuracies are over other documents: evaluate them alike.\n")


def test_accuracy_gain_command_compares_with_standard_at_the_same_scale_and_tokens(tmp_path):
    d = str(tmp_path)
    paths = [write_eval(d, "xs-std", "xs", "standard", None, 0.40),
             write_eval(d, "xs-sps", "xs", "sps", 64, 0.42),
             write_eval(d, "s-std", "s", "standard", None, 0.45),
             write_eval(d, "s-std-40b", "s", "standard", None, 0.50, tokens=40_000),
             write_eval(d, "s-sps", "s", "sps", 64, 0.48),
             write_eval(d, "s-delayed", "s", "delayed_state", 64, 0.46)]
    out = str(tmp_path / "gain.png")
    assert figures.main(["accuracy-gain", *paths, "--out", out]) == 0
    gains = {(g["scale"], g["variant"]): g["gain_pp"] for g in json.load(open(out[:-4] + ".json"))["gains"]}
    assert gains == pytest.approx({("xs", "sps"): 2.0, ("s", "sps"): 3.0, ("s", "delayed_state"): 1.0})
    height, width, _ = decoded_png(out).shape
    assert width > height


# Ten evaluations, one per 1,000 tokens, and a decay over the final 20% of 10,000 tokens: pre-decay up to 8,000.
DECAY = {"total_tokens": 10_000, "decay_fraction": 0.2}


def test_pre_decay_command_measures_the_gap_and_the_tokens_standard_needs(tmp_path):
    """Figure 1, bottom: SPS ends its pre-decay part (8,000 tokens of 10,000) at 2.55; Standard, trained twice as
    long (pre-decay up to 16,000), has 2.7 there (delta -0.15) and comes down to 2.55 halfway between its
    evaluations at 9,000 (2.6) and 10,000 (2.5): 9,500 tokens, 1.1875x SPS's 8,000. SPS's records inside its
    decay (2.3 and 2.2) would otherwise set the NLL to match."""
    std = write_run(tmp_path / "std", "std-long", "standard", None, [3.4, 3.3, 3.2, 3.1, 3.0, 2.9, 2.8, 2.7, 2.6, 2.5,
                                                                     2.4], train={"total_tokens": 20_000,
                                                                                  "decay_fraction": 0.2})
    sps = write_run(tmp_path / "sps", "sps", "sps", 2, [3.2, 3.1, 3.0, 2.9, 2.8, 2.7, 2.6, 2.55, 2.3, 2.2],
                    train=DECAY)
    out = str(tmp_path / "pre.png")
    assert figures.main(["pre-decay", std, sps, "--out", out]) == 0
    data = json.load(open(out[:-4] + ".json"))
    assert (data["budget_tokens"], data["method_nll"]) == (8000, 2.55)
    assert data["baseline_nll_at_budget"] == pytest.approx(2.7) and data["delta_nll"] == pytest.approx(-0.15)
    assert data["baseline_tokens_to_match"] == pytest.approx(9500)
    assert data["token_ratio"] == pytest.approx(9500 / 8000)
    assert (data["method"]["decay_start_tokens"], data["method"]["dropped_in_decay"]) == (8000, 2)
    assert data["method"]["tokens_seen"][-1] == 8000 and data["baseline"]["dropped_in_decay"] == 0
    height, width, _ = decoded_png(out).shape
    assert width > height
    assert figures.main(["pre-decay", std, sps, "--out", out]) == 2  # written once, replaced with --force only
    assert figures.main(["pre-decay", std, sps, "--out", out, "--force"]) == 0


def test_pre_decay_says_so_when_standard_never_reaches_the_nll(tmp_path):
    # Standard of the same 10,000 tokens stops its pre-decay part at 2.6 (8,000 tokens), above SPS's 2.55.
    std = write_run(tmp_path / "std", "std", "standard", None, [3.4, 3.3, 3.2, 3.1, 3.0, 2.9, 2.7, 2.6, 2.4, 2.3],
                    train=DECAY)
    sps = write_run(tmp_path / "sps", "sps", "sps", 2, [3.2, 3.1, 3.0, 2.9, 2.8, 2.7, 2.6, 2.55], train=DECAY)
    out = str(tmp_path / "pre.png")
    assert figures.main(["pre-decay", std, sps, "--out", out]) == 0
    data = json.load(open(out[:-4] + ".json"))
    assert data["baseline_tokens_to_match"] is None and data["token_ratio"] is None
    assert data["delta_nll"] == pytest.approx(-0.05)


def test_pre_decay_refuses_bad_runs_with_one_sentence(tmp_path, capsys):
    losses = [3.2, 3.1, 3.0]
    sps = write_run(tmp_path / "sps", "sps", "sps", 2, losses, train=DECAY)
    std = write_run(tmp_path / "std", "std", "standard", None, losses, train=DECAY)
    missing = str(tmp_path / "missing")
    short = write_run(tmp_path / "short", "short", "standard", None, losses[:2], train=DECAY)
    wide = write_run(tmp_path / "wide", "wide", "standard", None, losses, train=DECAY, d_model=64, d_ff=192)
    cases = {
        "missing": (missing, f"{missing!r} does not exist: pass a run folder"),
        "no train": (write_run(tmp_path / "no-train", "nt", "standard", None, losses),
                     "its config.json has no train.total_tokens and train.decay_fraction"),
        "wider": (wide, f"{wide} is 2 layers, d 64, 2 heads, d_ff 192 and {sps} is 2 layers, d 32, 2 heads, d_ff 96: "
                        "pass two runs of one model size."),
        "same variant": (write_run(tmp_path / "sps16", "sps16", "sps", 16, losses, train=DECAY),
                         "are both sps: pass the baseline"),
        "all in decay": (write_run(tmp_path / "late", "late", "standard", None, losses, tokens_per_eval=9000,
                                   train=DECAY), "has no validation record at or before its decay start (8,000 tokens: "
                         "the final 20% of train.total_tokens 10,000): pass a run that evaluated before its"),
        # SPS's budget is its evaluation at 3,000 tokens; this Standard stops at 2,000.
        "short": (short, f"{short} against {sps}: the baseline's pre-decay evaluations span 1,000 to 2,000 tokens and "
                         "miss the method's budget of 3,000: pass a baseline run"),
    }
    for name, (baseline, sentence) in cases.items():
        assert figures.main(["pre-decay", baseline, sps, "--out", str(tmp_path / "p.png")]) == 2, name
        err = capsys.readouterr().err
        assert sentence in err and err.count("\n") == 1, (name, err)
    no_val = write_run(tmp_path / "no-val", "no-val", "standard", None, [], train=DECAY)
    with open(os.path.join(no_val, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 10, "tokens_seen": 1000, "loss": 3.0, "lr": 1e-3}) + "\n")
    assert figures.main(["pre-decay", no_val, sps, "--out", str(tmp_path / "p.png")]) == 2
    assert "has no validation record (val_loss)" in capsys.readouterr().err
    assert figures.main(["pre-decay", std, std + "/", "--out", str(tmp_path / "p.png")]) == 2
    assert "name the same file or folder" in capsys.readouterr().err
    # no figure and no .json written: only the run folders
    assert sorted(os.listdir(tmp_path)) == ["late", "no-train", "no-val", "short", "sps", "sps16", "std", "wide"]


@pytest.mark.parametrize("field, value, shown", [
    ("decay_fraction", -1, "-1"), ("decay_fraction", 5, "5"), ("decay_fraction", float("nan"), "nan"),
    ("total_tokens", True, "True"), ("total_tokens", 0, "0"), ("total_tokens", 2.5e4, "25000.0")])
def test_cli_pre_decay_of_a_run_whose_schedule_no_training_reads_is_one_sentence_naming_the_field(tmp_path, capsys,
                                                                                               field, value, shown):
    # A config.json edited by hand: a decay_fraction of -1 put the decay start past the run's end and the figure was
    # drawn; 5 and NaN were said as "-40,000 tokens: the final 500%" and "nan tokens", True read as 1 token.
    losses = [3.2, 3.1, 3.0]
    sps = write_run(tmp_path / "sps", "sps", "sps", 2, losses, train=DECAY)
    std = write_run(tmp_path / "std", "std", "standard", None, losses, train={**DECAY, field: value})
    assert figures.main(["pre-decay", std, sps, "--out", str(tmp_path / "p.png")]) == 2
    kind, bound = ("a finite number", "between 0 and 1") if field == "decay_fraction" else \
        ("an integer", "of at least 1 and below 2**62")
    assert capsys.readouterr().err == (f"error: {std!r}: its config.json's train.{field}={shown} must be {kind} "
                                       f"{bound}: pass a run folder written by sps_jax.train.\n")
    assert sorted(os.listdir(tmp_path)) == ["sps", "std"]


def t_cdf_4(t):
    """The Student-t distribution function with 4 degrees of freedom, in closed form."""
    u = t / np.sqrt(1 + t * t / 4)
    return 0.5 + 3 / 8 * u * (1 - t * t / (12 * (1 + t * t / 4)))


def test_seeds_measured_over_other_tokens_are_not_pooled_and_an_ablation_says_so(tmp_path, capsys):
    # A run folder's NLL (training's validation windows) and an evaluation JSON's (evaluate --val-tokens) were
    # pooled into one seed sample, and the Welch test tested the measurements too.
    d = str(tmp_path)
    runs = [write_run(tmp_path / f"std{n}", f"s-standard-{n}", "standard", None, [3.6, 3.2 + n / 100])
            for n in range(2)]
    evals = []
    for n, val_tokens in enumerate((2048, 4096)):
        path = write_eval(d, f"std-e{n}", "s", "standard", None, None, val_nll=3.21, tokens=2000)
        record = json.load(open(path))
        json.dump(dict(record, val_tokens=val_tokens), open(path, "w"))
        evals.append(path)
    for sources, says in (([runs[0], evals[0]], r"std0's NLL comes from training's validation and .*std-e0.json's "
                                                r"from evaluate over 2048 tokens, which score other tokens"),
                          (evals, r"from evaluate over 2048 tokens and .* from evaluate over 4096 tokens, which "
                                  r"score other tokens")):
        with pytest.raises(ValueError, match=says + r": pass sources of one kind \(run folders, or evaluation "
                                                    r"JSONs of one --val-tokens\)\.$"):
            figures.seed_variance(sources, str(tmp_path / "seeds.png"))
    windowed = write_eval(d, "sps-e0", "s", "sps", 64, None, val_nll=3.1, tokens=2000)
    json.dump(dict(json.load(open(windowed)), val_tokens=2048), open(windowed, "w"))
    figures.window_ablation([runs[0], evals[0], windowed], str(tmp_path / "window.png"))
    assert "which score other tokens: the figure draws them as they are." in capsys.readouterr().err


def test_cli_a_refused_window_ablation_says_its_one_sentence_without_the_warning_about_the_figure(tmp_path, capsys):
    """A run folder and its own evaluation JSON: the warning that their NLLs score other tokens came first, then the
    refusal of one method given twice, two messages of which the first was about a figure never drawn."""
    run = write_run(tmp_path / "run", "s-sps", "sps", 64, [3.6, 3.2])
    evaluation = write_eval(str(tmp_path), "s-sps-eval", None, "sps", 64, None, val_nll=3.21, tokens=2000)
    json.dump(dict(json.load(open(evaluation)), val_tokens=2048), open(evaluation, "w"))
    assert figures.main(["window-ablation", run, evaluation, "--out", str(tmp_path / "w.png")]) == 2
    assert capsys.readouterr().err == (f"error: {run} and {evaluation} both hold SPS (w=64) at scale -: pass one of "
                                       "them.\n")


def test_two_runs_of_one_seed_are_refused_and_an_infinite_margin_too(tmp_path):
    # A copied run (or one job trained twice) counted as two seeds: std 0 and a "significant" Welch test; an infinite
    # margin called a 0.59-nat gap equivalent.
    sps = [write_run(tmp_path / f"sps{n}", "s-sps", "sps", 64, [3.6, 3.1], train={"seed": 0}) for n in range(2)]
    std = [write_run(tmp_path / f"std{n}", "s-standard", "standard", None, [3.6, 3.2 + n / 100], train={"seed": n})
           for n in range(2)]
    with pytest.raises(ValueError) as refusal:
        figures.seed_variance(sps + std, str(tmp_path / "seeds.png"))
    assert str(refusal.value) == (f"{sps[0]} and {sps[1]} are SPS (w=64) runs of one train.seed (0), the same run "
                                  "twice: pass runs of different seeds.")
    for margin in (float("inf"), float("nan"), 0.0):
        with pytest.raises(ValueError, match=r"is not a positive finite NLL difference: pass one such as 0\.01\.$"):
            figures.seed_variance(sps + std, str(tmp_path / "seeds.png"), margin=margin)
    assert sorted(os.listdir(tmp_path)) == ["sps0", "sps1", "std0", "std1"]


@pytest.mark.parametrize("margin", ["nan", "inf", "1e400", "0", "-0.01"])
def test_cli_a_margin_that_is_no_positive_finite_number_is_an_argument_error(tmp_path, capsys, margin):
    # It was refused only once the sources had been read, after jax had loaded (about a second and the CUDA
    # plugin's warnings on a machine without a GPU), with status 2 but not as the argument it is.
    argv = ["seeds", str(tmp_path / "a"), str(tmp_path / "b"), "--margin", margin, "--out", str(tmp_path / "s.png")]
    assert figures.main(argv) == 2
    assert capsys.readouterr().err == (f"error: python -m sps_jax.analysis.figures seeds: argument --margin: {margin} "
                                       "is not a finite number above 0 (see --help).\n")
    assert os.listdir(tmp_path) == []


def test_cli_a_figure_out_that_is_a_folder_is_offered_a_png_in_it(tmp_path, capsys):
    # The example was results.json, which the command refuses as no .png.
    run = write_run(tmp_path / "run", "tiny", "sps", 2, [4.0, 3.5])
    (tmp_path / "figs.png").mkdir()
    assert figures.main(["curves", run, "--out", str(tmp_path / "figs.png")]) == 2
    assert capsys.readouterr().err == (f"error: --out {tmp_path / 'figs.png'} is a folder: pass a file name, for "
                                       f"example {tmp_path / 'figs.png' / 'curves.png'}.\n")


def test_figure_functions_called_from_a_notebook_never_write_over_a_run_or_into_a_token_folder(tmp_path):
    # Only the command checked its --out: curves(runs, "RUN/config.json") replaced the run's config with the figure's
    # JSON, and window_ablation(..., "RUN/metrics.jsonl") its metrics with a PNG.
    from tests.helpers import write_token_folder
    run = write_run(tmp_path / "run", "s-sps", "sps", 64, [3.6, 3.1])
    write_token_folder(tmp_path / "tokens")
    before = {name: (tmp_path / "run" / name).read_bytes() for name in ("config.json", "metrics.jsonl")}
    for call, out, says in (
            (figures.curves, f"{run}/config.json", "out must name a .png file"),
            (figures.window_ablation, f"{run}/loss.png", "would write into the run"),
            (figures.curves, str(tmp_path / "tokens" / "x.png"), "lies inside the token folder"),
            (figures.curves, str(tmp_path / "x.json"), "out must name a .png file")):
        with pytest.raises(ValueError, match=says):
            call([run], out)
    with pytest.raises(ValueError, match="name the same file or folder"):
        figures.curves([run, run + "/"], str(tmp_path / "twice.png"))
    with pytest.raises(ValueError, match=r"^no run folder given: pass at least one\.$"):
        figures.curves([], str(tmp_path / "none.png"))
    assert {name: (tmp_path / "run" / name).read_bytes() for name in before} == before
    assert sorted(os.listdir(tmp_path)) == ["run", "tokens"] and "x.png" not in os.listdir(tmp_path / "tokens")
    figures.curves([run], str(tmp_path / "again.png"))
    figures.curves([run], str(tmp_path / "again.png"))  # a notebook redraws its own figure


@pytest.mark.parametrize("scale, title", [("s", "Seeds at scale S: mean and Student-t 95% interval"),
                                          (None, "Seeds: mean and Student-t 95% interval")])
def test_the_seeds_figure_names_a_scale_only_where_the_runs_have_one(tmp_path, monkeypatch, scale, title):
    # A model of no paper scale was titled "Seeds at scale -".
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, out: drawn.append(fig))
    sources = [write_eval(str(tmp_path), f"{v}-{n}", scale, v, w, None, val_nll=3.0 + n / 100 + (v == "sps") / 10)
               for v, w in (("standard", None), ("sps", 64)) for n in range(2)]
    figures.seed_variance(sources, str(tmp_path / "seeds.png"))
    assert drawn[0].axes[0].get_title() == title


def test_seed_statistics_follow_appendix_c_by_hand(tmp_path, capsys):
    """Appendix C: mean and 95% interval over 3 seeds with t_{0.025,2} ~ 4.30, one-sided Welch t-tests of SPS
    against each baseline, and TOST within +-0.01 NLL between two baselines. Three seeds of equal spread give
    Welch 4 degrees of freedom, whose t distribution has a closed form."""
    d = str(tmp_path)
    nll = {("sps", 64): [2.80, 2.82, 2.84], ("standard", None): [2.86, 2.88, 2.90],
           ("delayed_state", 64): [2.875, 2.895, 2.915]}
    sources = [write_eval(d, f"{v}-{n}", "s", v, w, None, val_nll=x) for (v, w), xs in nll.items()
               for n, x in enumerate(xs)]
    out = str(tmp_path / "seeds.png")
    assert figures.main(["seeds", *sources, "--out", out]) == 0
    data = json.load(open(out[:-4] + ".json"))
    methods = {m["method"]: m for m in data["methods"]}
    assert list(methods) == ["Standard", "Delayed State (w=64)", "SPS (w=64)"]
    se_mean = 0.02 / np.sqrt(3)  # each method's sample standard deviation is 0.02
    assert methods["SPS (w=64)"]["mean"] == pytest.approx(2.82)
    assert methods["SPS (w=64)"]["ci95_half_width"] / se_mean == pytest.approx(4.30, abs=0.005)
    se_gap = np.sqrt(2) * se_mean
    welch = {w["other"]: w for w in data["welch_one_sided"]}
    for other, gap in (("Standard", -0.06), ("Delayed State (w=64)", -0.075)):
        assert welch[other]["gap"] == pytest.approx(gap) and welch[other]["df"] == pytest.approx(4)
        assert welch[other]["t"] == pytest.approx(gap / se_gap)
        assert welch[other]["p"] == pytest.approx(t_cdf_4(gap / se_gap))
    (tost,) = data["tost"]
    assert (tost["a"], tost["b"], tost["margin"]) == ("Standard", "Delayed State (w=64)", 0.01)
    gap = -0.015
    assert tost["p"] == pytest.approx(max(1 - t_cdf_4((gap + 0.01) / se_gap), t_cdf_4((gap - 0.01) / se_gap)))
    assert decoded_png(out).shape[1] > 0
    # One seed of a method has no interval, and seeds of two scales are not one comparison.
    assert figures.main(["seeds", *sources[:4], "--out", str(tmp_path / "one.png")]) == 2
    assert "Standard has one run (" in capsys.readouterr().err
    other_scale = write_eval(d, "m-sps", "m", "sps", 64, None, val_nll=2.7)
    assert figures.main(["seeds", *sources, other_scale, "--out", str(tmp_path / "two.png")]) == 2
    assert "the sources hold scales M, S: pass the seeds of one scale." in capsys.readouterr().err
    longer = write_eval(d, "sps-40b", "s", "sps", 64, None, tokens=40_000, val_nll=2.7)
    assert figures.main(["seeds", *sources, longer, "--out", str(tmp_path / "longer.png")]) == 2
    assert "training tokens and" in capsys.readouterr().err
    # No seed of the reference: the intervals and TOST stand, and the missing Welch tests are said (it was silent).
    assert figures.main(["seeds", *sources[3:], "--out", str(tmp_path / "noref.png")]) == 0
    assert capsys.readouterr().err == (
        "warning: no source is a sps run, so no Welch test compares it with the others: pass its seeds, or "
        f"--reference with a variant among the sources.\nwrote {tmp_path / 'noref.png'} and {tmp_path / 'noref.json'}\n")
    assert json.load(open(tmp_path / "noref.json"))["welch_one_sided"] == []


def test_welch_weighs_each_variance_by_its_own_count():
    # Equal counts and spreads (above) hide which count divides which variance. a: mean 2, variance 1 over 3 seeds;
    # b: mean 6, variance 10 over 5. Welch: se^2 = 1/3 + 10/5 = 7/3, df = (7/3)^2 / ((1/3)^2/2 + 2^2/4) = 98/19.
    w = seeds.welch_lower([1, 2, 3], [2, 4, 6, 8, 10])
    assert w["gap"] == pytest.approx(-4)
    assert w["t"] == pytest.approx(-4 / np.sqrt(7 / 3), rel=1e-12)
    assert w["df"] == pytest.approx(98 / 19, rel=1e-12)


def test_figure_commands_reject_bad_input_with_one_sentence(tmp_path, capsys):
    # The whole of stderr: what is wrong and what to pass instead, on one line.
    assert figures.main(["curves", str(tmp_path / "missing"), "--out", str(tmp_path / "c.png")]) == 2
    assert capsys.readouterr().err == (f"error: '{tmp_path / 'missing'}' does not exist: pass a run folder (the one "
                                       "holding config.json) or one of its checkpoints/<step> folders.\n")
    assert figures.main(["accuracy-gain", str(tmp_path / "x.json"), "--out", str(tmp_path / "a.png")]) == 2
    assert capsys.readouterr().err == (f"error: evaluation '{tmp_path / 'x.json'}' does not exist: pass evaluation "
                                       "JSONs written by sps_jax.evaluation.evaluate.\n")
    assert figures.main(["curves", str(tmp_path), "--out", str(tmp_path / "c.pdf")]) == 2
    assert capsys.readouterr().err == (f"error: --out must name a .png file, got '{tmp_path / 'c.pdf'}': end it in "
                                       ".png (the numbers go beside it, in the same name's .json).\n")
    assert figures.main(["accuracy-gain", str(tmp_path), "--out", str(tmp_path / "a.png")]) == 2
    assert capsys.readouterr().err == (
        f"error: python -m sps_jax.analysis.figures accuracy-gain: argument evaluations: evaluation '{tmp_path}' is a "
        "folder, not a file: pass evaluation JSONs written by sps_jax.evaluation.evaluate (see --help).\n")
    # Before: a figure named only by its suffix was written, as the hidden files .png and .png.json.
    run = write_run(tmp_path / "sps", "sps", "sps", 4, [3.0])
    assert figures.main(["curves", run, "--out", str(tmp_path / ".png")]) == 2
    assert f"--out {tmp_path / '.png'} has no file name before .png: add one, for example " \
        f"{tmp_path / 'curves.png'}." in capsys.readouterr().err and not (tmp_path / ".png").exists()
    # A run that never evaluated has no curve to draw: said before plotting, not by matplotlib.
    run = write_run(tmp_path / "no-val", "no-val", "sps", 4, [])
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 10, "tokens_seen": 1000, "loss": 3.0, "lr": 1e-3}) + "\n")
    assert figures.main(["curves", run, "--out", str(tmp_path / "c.png")]) == 2
    assert "no validation record" in capsys.readouterr().err and not (tmp_path / "c.png").exists()
    assert figures.main(["window-ablation", run, "--out", str(tmp_path / "w.png")]) == 2
    assert f"{run!r} has no validation record (val_loss) in metrics.jsonl: pass runs that evaluated on " \
        "validation data (train.eval_every), or their evaluation JSONs." in capsys.readouterr().err
    # Evaluations without the five tasks' mean (task_accuracy_avg) give no bar: said with what to pass.
    evals = [write_eval(str(tmp_path), "s-std", "s", "standard", None, None),
             write_eval(str(tmp_path), "s-sps", "s", "sps", 64, None)]
    assert figures.main(["accuracy-gain", *evals, "--out", str(tmp_path / "a.png")]) == 2
    assert "task_accuracy_avg at the same tokens_seen: pass evaluations of paper-scale runs with all five " \
        "zero-shot tasks (evaluate --tasks zero_shot)." in capsys.readouterr().err


def test_cli_curves_of_a_run_validated_only_at_tokens_seen_0_is_one_sentence_naming_its_file(tmp_path, capsys):
    # A log axis has no place for 0: matplotlib warned and drew an empty axis (or, beside another run, no curve).
    other = write_run(tmp_path / "std", "std", "standard", None, [3.2, 3.1])
    run = write_run(tmp_path / "sps", "sps", "sps", 4, [3.0])
    records = [dict(json.loads(line), tokens_seen=0) for line in (tmp_path / "sps" / "metrics.jsonl").open()]
    (tmp_path / "sps" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    sentence = (f"{os.path.join(run, 'metrics.jsonl')}: no validation record is past tokens_seen 0, and the curves' "
                "axes of tokens and compute are logarithmic, with no place for 0: pass runs that evaluated after "
                "training began, or leave this run out.")
    for runs in ([run], [other, run]):
        assert figures.main(["curves", *runs, "--out", str(tmp_path / "c.png")]) == 2
        assert capsys.readouterr().err == f"error: {sentence}\n"
        with pytest.raises(ValueError) as refused:
            figures.curves(runs, str(tmp_path / "c.png"))
        assert str(refused.value) == sentence
    assert sorted(os.listdir(tmp_path)) == ["sps", "std"]


@pytest.mark.parametrize("command", ["curves", "window-ablation"])
@pytest.mark.parametrize("key, value", [("val_loss", float("nan")), ("val_loss", float("inf")),
                                        ("tokens_seen", float("nan")), ("tokens_seen", -1000)])
def test_a_validation_record_no_figure_can_place_is_one_sentence_naming_it(tmp_path, capsys, command, key, value):
    # A NaN loss (metrics.jsonl is written by json.dumps, which writes NaN) failed with matplotlib's 'Data cannot be
    # log-scaled because all values are <= 0', naming no file; window-ablation drew it and wrote null to its JSON.
    run = write_run(tmp_path / "sps", "sps", "sps", 4, [3.0, 2.5])
    lines = (tmp_path / "sps" / "metrics.jsonl").read_text().splitlines()
    record = json.loads(lines[-1])
    record[key] = value
    (tmp_path / "sps" / "metrics.jsonl").write_text("\n".join(lines[:-1] + [json.dumps(record)]) + "\n")
    assert figures.main([command, run, "--out", str(tmp_path / "f.png")]) == 2
    err = capsys.readouterr().err
    path = os.path.join(run, 'metrics.jsonl')
    if key == "tokens_seen":  # no count of tokens in any record: the one reader of metrics says so
        assert err == (f"error: {path} line {len(lines)} has tokens_seen={value!r}, not a count of tokens; fix or "
                       "delete that line (training writes one JSON record per line, each with \"step\").\n")
    else:
        assert err == (f"error: {path}: the validation record of step 20 has {key}={value!r}, which no figure can "
                       "place: fix or delete that line, or leave the run out.\n")
    assert sorted(os.listdir(tmp_path)) == ["sps"]


def test_a_missing_matplotlib_names_the_extra_to_install(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path / "run", "tiny", "sps", 2, [4.0, 3.5])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # before: ModuleNotFoundError with a traceback
    assert figures.main(["curves", run, "--out", str(tmp_path / "c.png")]) == 2
    assert "needs the matplotlib package: pip install -e '.[analysis]'" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_figures_module_runs_as_a_command(tmp_path):
    paths = [write_eval(str(tmp_path), "m-std", "m", "standard", None, 0.5),
             write_eval(str(tmp_path), "m-sps", "m", "sps", 64, 0.52)]
    out = str(tmp_path / "gain.png")
    proc = run_module("sps_jax.analysis.figures", "accuracy-gain", *paths, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert decoded_png(out).shape[1] > 0 and proc.stdout == "" and f"wrote {out}" in proc.stderr


def test_cli_figures_print_nothing_and_say_the_files_they_wrote_on_stderr(tmp_path, capsys):
    # stdout holds a command's results alone (what a pipe reads); the files a command wrote are said on stderr.
    run = write_run(tmp_path / "run", "tiny", "sps", 2, [4.0, 3.5])
    out = tmp_path / "c.png"
    assert figures.main(["curves", run, "--out", str(out)]) == 0
    said = capsys.readouterr()
    assert said.out == "" and f"wrote {out} and {tmp_path / 'c'}.json\n" in said.err, said


def test_figures_take_pathlib_paths(tmp_path):
    # Notebooks pass pathlib paths: the figure's JSON records them as text.
    sps = write_run(tmp_path / "sps", "tiny-sps-w2", "sps", 2, [3.9, 3.4])
    assert figures.curves([tmp_path / "sps"], tmp_path / "c.png")["figure"] == str(tmp_path / "c.png")
    data = figures.window_ablation([tmp_path / "sps"], tmp_path / "w.png")
    assert data["figure"] == str(tmp_path / "w.png") and data["points"][0]["val_nll"] == 3.4
    evals = [write_eval(str(tmp_path), "std", "s", "standard", None, 0.4),
             write_eval(str(tmp_path), "sps", "s", "sps", 64, 0.42)]
    gains = figures.accuracy_gain([tmp_path / os.path.basename(p) for p in evals], tmp_path / "g.png")
    assert gains["figure"] == str(tmp_path / "g.png") and json.load(open(tmp_path / "g.json"))["gains"]
    assert sps


ONE_PATH = r" must be one path \(a str or pathlib\.Path\), not a "


@pytest.mark.parametrize("call, sentence", [
    (lambda run, out: figures.final_point([run, run]), r"source" + ONE_PATH + r"list: give one source per call\.$"),
    (lambda run, out: figures.pre_decay_curve(3), r"run" + ONE_PATH + r"int: pass the path itself\.$"),
    (lambda run, out: figures.curves([run], [out, out]), r"out" + ONE_PATH + r"list: give one out per call\.$"),
    (lambda run, out: figures.curves([run, 3], out), r"run_folders\[1\]" + ONE_PATH + r"int: pass the path itself\.$"),
    (lambda run, out: figures.window_ablation([run, None], out), r"sources\[1\]" + ONE_PATH + r"NoneType: pass the path itself\.$"),
    (lambda run, out: figures.seed_variance([[run, run]], out), r"sources\[0\]" + ONE_PATH + "list: give one "),
    (lambda run, out: figures.accuracy_gain([run], 5), r"out" + ONE_PATH + r"int: pass the path itself\.$"),
    (lambda run, out: figures.pre_decay([run, run], run, out), r"baseline_run" + ONE_PATH + "list: give one "),
    (lambda run, out: figures.pre_decay(run, None, out), r"method_run" + ONE_PATH + r"NoneType: pass the path itself\.$"),
], ids=["final_point", "pre_decay_curve", "curves-out", "curves", "window_ablation", "seed_variance",
        "accuracy_gain", "pre_decay-baseline", "pre_decay-method"])
def test_a_path_argument_that_is_not_one_path_is_one_sentence(tmp_path, call, sentence):
    # Before: Python's "expected str, bytes or os.PathLike object, not list" from os.fspath, or from os.path deeper.
    run = write_run(tmp_path / "run", "run", "sps", 2, [3.9, 3.4], train=DECAY)
    with pytest.raises(TypeError, match="^" + sentence):
        call(run, str(tmp_path / "f.png"))
    assert os.listdir(tmp_path) == ["run"]  # no figure, no JSON


@pytest.mark.parametrize("function", [figures.curves, figures.window_ablation, figures.seed_variance,
                                      figures.accuracy_gain])
@pytest.mark.parametrize("as_path", [False, True], ids=["str", "pathlib"])
def test_one_path_given_where_a_list_of_paths_belongs_is_one_sentence(tmp_path, function, as_path):
    # A str is a sequence: its characters were read as the paths 'r', 'u', 'n' ("'r' does not exist"); a pathlib
    # path was Python's "'PosixPath' object is not iterable".
    run = write_run(tmp_path / "run", "run", "sps", 2, [3.9, 3.4])
    given = tmp_path / "run" if as_path else run
    name = "run_folders" if function is figures.curves else "paths" if function is figures.accuracy_gain else "sources"
    with pytest.raises(TypeError, match=rf"^{name} must be a list of paths, not the one path {re.escape(repr(given))}: "
                                        rf"pass \[{re.escape(repr(given))}\]\.$"):
        function(given, str(tmp_path / "f.png"))
    with pytest.raises(TypeError, match=rf"^{name} must be a list of paths \(str or pathlib\.Path\), not a int: pass "):
        function(5, str(tmp_path / "f.png"))
    assert os.listdir(tmp_path) == ["run"]


def test_seeds_and_pre_decay_take_pathlib_paths(tmp_path):
    d = str(tmp_path)
    sources = [write_eval(d, f"{v}-{n}", "s", v, w, None, val_nll=x) for v, w in (("sps", 64), ("standard", None))
               for n, x in enumerate((2.8, 2.82))]
    data = figures.seed_variance([tmp_path / os.path.basename(s) for s in sources], tmp_path / "seeds.png")
    assert data["figure"] == str(tmp_path / "seeds.png") and data["methods"][0]["sources"] == [sources[2], sources[3]]
    write_run(tmp_path / "std", "std", "standard", None, [3.4, 3.3, 3.2, 3.1, 3.0, 2.9, 2.7, 2.6], train=DECAY)
    write_run(tmp_path / "sps", "sps", "sps", 2, [3.2, 3.1, 3.0, 2.9, 2.8, 2.7, 2.6, 2.55], train=DECAY)
    data = figures.pre_decay(tmp_path / "std", tmp_path / "sps", tmp_path / "pre.png")
    assert data["figure"] == str(tmp_path / "pre.png") and data["delta_nll"] == pytest.approx(-0.05)


def test_the_seed_statistics_refuse_what_gives_no_test_in_one_sentence():
    # One seed or a NaN gave p = nan with only numpy's warnings; a negative margin and strings were taken.
    for call, error, says in ((lambda: seeds.welch_lower([6.1], [6.2, 6.3]), ValueError, "at least two seeds"),
                              (lambda: seeds.welch_lower([6.1, float("nan")], [6.2, 6.3]), ValueError,
                               r"NLLs must be finite, got \[6\.1, nan\]"),
                              (lambda: seeds.tost([6.1, 6.2], [6.2, 6.3], margin=-0.01), ValueError,
                               r"margin -0\.01 is not a positive finite NLL difference"),
                              (lambda: seeds.summary(["6.1", "6.2"]), TypeError, r"NLLs must be numbers")):
        with pytest.raises(error, match=says):
            call()
    assert seeds.tost([6.1, 6.2], [6.2, 6.3])["p"] > 0.05  # a 0.1-nat gap is no equivalence within 0.01


def test_accuracy_gain_is_taken_at_the_largest_token_count_both_evaluations_share():
    measured = (("standard", None, 10_000, 0.40), ("standard", None, 20_000, 0.45),
                ("sps", 64, 10_000, 0.41), ("sps", 64, 20_000, 0.48))
    evaluations = [dict(run=f"{variant}-{tokens}", scale="s", variant=variant, window=window, tokens_seen=tokens,
                        task_accuracy_avg=acc) for variant, window, tokens, acc in measured]
    (row,) = figures.gains_over_baseline(evaluations)
    assert row["tokens_seen"] == 20_000 and row["gain_pp"] == pytest.approx(3.0)


def test_window_ablation_draws_a_line_in_window_order_whatever_the_order_of_its_sources(tmp_path):
    d = str(tmp_path)
    sources = [write_eval(d, f"sps-{w}", "s", "sps", w, None, val_nll=nll) for w, nll in ((64, 2.95), (0, 3.0),
                                                                                            (16, 2.97))]
    out = str(tmp_path / "w.png")
    figures.window_ablation(sources, out)
    assert json.load(open(out[:-4] + ".json"))["lines"] == [
        {"label": "SPS", "window": [0, 16, 64], "val_nll": [3.0, 2.97, 2.95]}]


@pytest.mark.parametrize("test", [seeds.welch_lower, seeds.tost])
def test_a_t_test_of_methods_whose_seeds_all_agree_is_one_sentence_not_a_division_by_zero(test):
    # Guards against dropping the zero-variance check: both standard errors 0 raised ZeroDivisionError.
    with pytest.raises(ValueError, match=r"^two methods whose seeds all have one NLL leave a t-test nothing to "
                                         r"measure: pass runs that differ in their seed\.$"):
        test([2.0, 2.0], [3.0, 3.0])


def test_a_figure_whose_numbers_file_exists_names_that_file_as_what_it_is(tmp_path, capsys):
    # --out RUN/eval/step_16.png beside an evaluation's step_16.json said "--out RUN/eval/step_16.json already exists".
    run = write_run(tmp_path / "sps", "sps", "sps", 4, [3.0, 2.5])
    (tmp_path / "fig.json").write_text("{}")
    assert figures.main(["curves", run, "--out", str(tmp_path / "fig.png")]) == 2
    assert capsys.readouterr().err == (f"error: the figure's numbers file (beside --out) {tmp_path / 'fig.json'} already "
                                       "exists: pass --force to replace it, or choose another name.\n")


def test_curves_of_a_run_whose_config_json_is_of_another_model_size_than_its_checkpoint_is_one_sentence(tmp_path):
    # Another run's config.json (d_model 32) beside weights of d_model 48: the curve was costed (train_flops) and
    # labelled by it without a word, since only the trained-as fields were compared.
    from sps_jax import checkpoint
    from tests.helpers import small_model
    run = write_run(tmp_path / "run", "tiny-sps", "sps", 2, [4.0, 3.5])
    cfg, _, params = small_model("sps", 2, d_model=48)
    checkpoint.save_params(run, 20, params, cfg.function_fields)
    have, want = sps_model.count_params(sps_model.Transformer(cfg)), small_config("sps", 2).num_params
    with pytest.raises(ValueError) as refusal:
        figures.curves([run], str(tmp_path / "c.png"))
    assert str(refusal.value) == (f"checkpoint step 20 of {run} does not match its config.json: it holds {have:,} "
                                  f"parameters but the config implies {want:,}; put back the config.json the run was "
                                  "trained with (this one was edited, or belongs to another run).")
    assert not os.path.exists(tmp_path / "c.png")


def test_curves_of_a_run_whose_metrics_end_before_its_checkpoint_warn_that_the_curve_stops_short(tmp_path, capsys):
    # A metrics.jsonl cut short (its partial last line dropped as a killed writer's) or an older copy: the curve
    # stopped at its last record, short of the checkpoint the run trained to, without a word.
    from sps_jax import checkpoint
    from tests.helpers import small_model
    run = write_run(tmp_path / "run", "tiny-sps", "sps", 2, [4.0, 3.5])
    cfg, _, params = small_model("sps", 2)
    checkpoint.save_params(run, 20, params, cfg.function_fields)
    figures.curves([run], str(tmp_path / "whole.png"))
    assert capsys.readouterr().err == ""
    checkpoint.save_params(run, 30, params, cfg.function_fields)
    data = figures.curves([run], str(tmp_path / "short.png"))
    assert data["runs"][0]["val_loss"] == [4.0, 3.5]
    assert capsys.readouterr().err == (f"warning: {run}/metrics.jsonl ends at step 20, before the run's checkpoint of "
                                       "step 30 (the file was cut short or replaced by an older copy): its curve stops "
                                       "there; put the whole file back to draw all of it.\n")


def test_curves_draw_a_step_a_resumed_leg_evaluated_again_once_with_its_last_validation(tmp_path):
    # A leg resumed at step 20 re-evaluates there: the figure and its numbers held step 20's point twice.
    run = write_run(tmp_path / "run", "tiny", "standard", None, [4.0, 3.5, 3.2])
    with open(os.path.join(run, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"step": 30, "tokens_seen": 3000, "val_loss": 3.25}) + "\n")
        f.write(json.dumps({"step": 40, "tokens_seen": 4000, "val_loss": 3.0}) + "\n")
    data = figures.curves([run], str(tmp_path / "c.png"))
    assert data["runs"][0]["tokens_seen"] == [1000, 2000, 3000, 4000]
    assert data["runs"][0]["val_loss"] == [4.0, 3.5, 3.25, 3.0]


@pytest.mark.parametrize("evaluations", [(100, 150), (102, 153), (100, 130, 190)])
def test_curves_tick_labels_of_an_axis_shorter_than_a_factor_two_do_not_overlap(tmp_path, monkeypatch, evaluations):
    """A run evaluated at 102,400 and 153,600 tokens (100 and 150 tiny steps) had its tokens axis labelled at every
    1.1, 1.2, ... x 10^5, each label running into the next."""
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, out: (fig.canvas.draw(), drawn.append(fig)))
    figures.curves([run_evaluated_at(tmp_path, evaluations, 1024)], str(tmp_path / "c.png"))
    for ax in drawn[0].axes:
        lo, hi = sorted(ax.get_xlim())
        boxes = sorted((t.get_window_extent() for t in ax.xaxis.get_majorticklabels()
                        if t.get_text() and lo <= t.get_position()[0] <= hi), key=lambda b: b.x0)
        assert len(boxes) >= 2, ax.get_xlabel()
        assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:])), (ax.get_xlabel(), [
            t.get_text() for t in ax.xaxis.get_majorticklabels() if t.get_text()])


def test_an_evaluation_without_a_validation_nll_is_refused_with_how_to_measure_it(tmp_path):
    """An evaluation of tasks alone (no --val-data) has no NLL to place on the window-ablation or seeds figure."""
    source = write_eval(str(tmp_path), "tasks_only", "s", "sps", 64, 0.5, val_nll=None)
    with pytest.raises(ValueError) as refusal:
        figures.final_point(source)
    assert str(refusal.value) == (f"{source!r} has no val_nll (it was evaluated without --val-data): pass an "
                                  "evaluation made with --val-data DATA, or the run folder.")
