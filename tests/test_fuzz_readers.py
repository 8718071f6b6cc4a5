"""Seeded fuzzing of the readers (token folders, manifests, run folders, .pt files, prompt files): every damaged
input ends in success or one sentence, never a traceback or a hang."""

import dataclasses
import json
import os
import shutil
import time

import jax
import ml_collections
import pytest

from sps_jax import config as sps_config, import_torch, model as sps_model, runs
from sps_jax.analysis import figures
from sps_jax.data import __main__ as data_cli
from sps_jax.evaluation import evaluate
from sps_jax.inference import generate
from tests import fuzz
from tests.helpers import REPO, ensure_tokenizer, small_model, write_token_folder


@pytest.fixture(scope="module")
def fuzz_world(tmp_path_factory):
    """A token folder, a small run with metrics (its model reads that folder), a tiny GPT-2 run and a .pt file."""
    import torch

    from tests.test_import_torch import synthetic_state_dict

    root = tmp_path_factory.mktemp("fuzz")
    write_token_folder(str(root / "tokens"), num_docs=40)
    cfg, _, params = small_model("sps", 2)
    config = ml_collections.ConfigDict({"name": "fuzz", "model": dataclasses.asdict(cfg), "train": {"global_batch": 2}})
    runs.save_run(str(root / "run"), config, params, step=5)
    with open(root / "run" / "metrics.jsonl", "w") as f:
        for step in (1, 2, 3):
            f.write(json.dumps({"step": step, "tokens_seen": 64 * step, "loss": 4.0 - step / 10}) + "\n")
            f.write(json.dumps({"step": step, "tokens_seen": 64 * step, "val_loss": 4.1 - step / 10}) + "\n")
    ensure_tokenizer()
    tiny = sps_config.load_config(os.path.join(REPO, "configs", "tiny.py"), [
        "--config.model.seq_len=64", "--config.model.num_layers=1", "--config.model.d_model=32",
        "--config.model.d_ff=96"])
    runs.save_run(str(root / "tiny"), tiny,
                  sps_model.init_params(sps_model.Transformer(tiny.model), jax.random.PRNGKey(0)), step=1)
    return {"root": root, "torch": torch, "state_dict": synthetic_state_dict(compiled=False)}


IMPORT_OVERRIDES = ["--config.model.eos_id=60", "--config.model.predict_id=61", "--config.model.pad_id=63"]


def fuzz_case(world, kind: str, seed: int):
    """[(main, argv)] for one seeded case of ``kind`` (the damaged inputs are written under the world's root)."""
    root, rng = world["root"], fuzz.seeded(seed)
    case = root / f"{kind}{seed}"
    if kind == "tokens":  # token folders and their manifests
        fuzz.damaged_copy(str(root / "tokens"), str(case), rng)
        return [(data_cli.main, ["verify", str(case)]),
                (evaluate.main, ["--workdir", str(root / "run"), "--val-data", str(case), "--val-tokens", "40"])]
    if kind == "run":  # config.json, metrics.jsonl, every checkpoint file
        fuzz.damaged_copy(str(root / "run"), str(case), rng)
        return [(evaluate.main, ["--workdir", str(case), "--val-data", str(root / "tokens"), "--val-tokens", "40"]),
                (figures.main, ["curves", str(case), "--out", str(case) + ".png"])]
    if kind == "pt":
        path = str(case) + ".pt"
        if rng.random() < 0.5:
            world["torch"].save(fuzz.damaged_state_dict(world["state_dict"], rng), path)
        else:
            world["torch"].save({"model": world["state_dict"], "model_args": {"n_head": 2}}, path)
            with open(path, "rb") as f:
                data = f.read()
            with open(path, "wb") as f:
                f.write(fuzz.mutate_bytes(data, rng))
        return [(import_torch.main, [path, "--variant", "sps", "--window", "2", "--out", str(case), *IMPORT_OVERRIDES])]
    jsonl = bool(rng.random() < 0.5)  # prompt files
    path = str(case) + (".jsonl" if jsonl else ".txt")
    with open(path, "wb") as f:
        f.write(fuzz.damaged_prompts(rng, jsonl))
    return [(generate.main, ["--workdir", str(root / "tiny"), "--prompts-file", path, "--max-new-tokens", "2",
                             "--out", str(case) + ".out.jsonl"])]


KINDS = ("tokens", "run", "pt", "prompts")


@pytest.mark.parametrize("kind", KINDS)
def test_damaged_inputs_end_in_success_or_one_sentence(fuzz_world, kind):
    """A small deterministic sample of every kind (the long, wider run is the slow test below)."""
    for seed in range(4):
        for main, argv in fuzz_case(fuzz_world, kind, seed):
            outcome = fuzz.call(main, argv, timeout=120)
            assert outcome.problem() is None, f"{kind} seed {seed}: {argv}: {outcome.problem()}"


@pytest.mark.slow
def test_fuzzing_every_reader_for_200_cases_or_60_seconds(fuzz_world):
    start, count, outcomes = time.time(), 0, {"success": 0, "sentence": 0}
    while count < 200 and time.time() - start < 60:
        kind = KINDS[count % len(KINDS)]
        for main, argv in fuzz_case(fuzz_world, kind, 1000 + count):
            outcome = fuzz.call(main, argv, timeout=60)
            assert outcome.problem() is None, f"{kind} seed {1000 + count}: {argv}: {outcome.problem()}"
            outcomes["success" if outcome.status == 0 else "sentence"] += 1
        count += 1
        shutil.rmtree(fuzz_world["root"] / f"{kind}{1000 + count - 1}", ignore_errors=True)
    assert count >= 40 and outcomes["sentence"] > outcomes["success"] > 0, (count, outcomes)
