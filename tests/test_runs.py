"""Run folders: weights round-trip, paths resolve, and bad or mismatched folders are clear errors."""

import dataclasses
import json
import shutil
import os

import jax
import ml_collections
import numpy as np
import pytest

from sps_jax import checkpoint, config as sps_config, model as sps_model, run_files, runs
from tests.helpers import small_model
from tests.helpers import not_one_path


def test_save_run_then_load_run_returns_the_same_weights_and_config(tmp_path):
    config = sps_config.load_config("configs/tiny.py:delayed_state,4")
    net = sps_model.Transformer(config.model)
    params = sps_model.init_params(net, jax.random.PRNGKey(0))
    runs.save_run(str(tmp_path / "run"), config, params, step=7)
    for path in (tmp_path / "run", tmp_path / "run" / "checkpoints" / "7"):
        loaded_config, loaded, step = runs.load_run(str(path))
        assert step == 7 and loaded_config.model.variant == "delayed_state" and loaded_config.model.window == 4
        jax.tree_util.tree_map(np.testing.assert_array_equal, params, loaded)
    run = str(tmp_path / "run")
    assert runs.find_run(run) == (run, None)
    assert runs.find_run(os.path.join(run, "checkpoints")) == (run, None)
    assert runs.find_run(os.path.join(run, "checkpoints", "7")) == (run, 7)
    os.symlink(os.path.join(run, "checkpoints", "7"), tmp_path / "latest")  # a link to a checkpoint names it
    assert runs.find_run(str(tmp_path / "latest")) == (run, 7)


def test_a_run_folder_whose_files_are_folders_is_one_sentence_naming_them(tmp_path):
    from sps_jax import metrics
    from sps_jax.cli import UserError
    (tmp_path / "config.json").mkdir()
    (tmp_path / "metrics.jsonl").mkdir()
    with pytest.raises(UserError, match=r"config\.json is a folder, not the run's config file: move it away\.$"):
        runs.read_config(str(tmp_path))
    with pytest.raises(UserError, match=r"metrics\.jsonl is a folder, not the run's metrics file: move it away\.$"):
        metrics.read(str(tmp_path))  # train read it first: before, it failed on it after compiling


def test_load_run_of_a_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        runs.load_run(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither a run folder"):
        runs.load_run(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="neither a run folder"):
        runs.find_run(str(tmp_path / "empty"))


def save_small_run(path, variant="sps", window=2, name="tiny-run", metrics_lines=()):
    cfg, model, params = small_model(variant, window)
    config = ml_collections.ConfigDict({"name": name, "model": dataclasses.asdict(cfg),
                                        "train": {"global_batch": 2}})
    runs.save_run(str(path), config, params, step=5)
    if metrics_lines:
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics_lines))
    return params


# A model of absurd size hung: the config's shapes were traced before any comparison.
@pytest.mark.parametrize("field, value", [("d_model", 64), ("d_ff", 10 ** 12)])
def test_checkpoint_that_does_not_match_its_config_is_a_clear_error(tmp_path, monkeypatch, field, value):
    save_small_run(tmp_path / "run")
    # Said from the checkpoint's metadata, before any array is read (an XL run's weights are gigabytes).
    monkeypatch.setattr(checkpoint, "restore_params", lambda *a, **k: pytest.fail("weights loaded before the check"))
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    config["model"][field] = value
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"does not match its config.json: .*; put back the config.json the run was "
                                         r"trained with \(this one was edited, or belongs to another run\)\.$"):
        runs.load_model(str(tmp_path / "run"))
    from sps_jax import export_torch  # export says it in the run's words too (not a caller's config and params)
    with pytest.raises(ValueError, match=r"does not match its config.json: .*; put back the config.json"):
        export_torch.export_run(str(tmp_path / "run"), str(tmp_path / "out.safetensors"))
    assert not (tmp_path / "out.safetensors").exists()


def run_of_another_variant(tmp_path, how):
    """An sps run folder (w=2) whose latest checkpoint is a standard run's ("copied"), or whose config.json was
    edited after training ("edited": window 2 -> 8); each variant has the same shapes, so the weights cannot show it."""
    import shutil
    save_small_run(tmp_path / "sps")
    if how == "copied":
        save_small_run(tmp_path / "standard", "standard")
        shutil.rmtree(tmp_path / "sps" / "checkpoints")
        shutil.copytree(tmp_path / "standard" / "checkpoints", tmp_path / "sps" / "checkpoints")
        return str(tmp_path / "sps"), "variant='standard', window=None", "variant='sps', window=2"
    config = json.loads((tmp_path / "sps" / "config.json").read_text())
    config["model"]["window"] = 8
    (tmp_path / "sps" / "config.json").write_text(json.dumps(config))
    return str(tmp_path / "sps"), "window=2", "window=8"


def no_weights(*args, **kwargs):
    raise AssertionError("the weights were loaded before the mismatch was found")


@pytest.mark.parametrize("how", ["copied", "edited"])
def test_a_checkpoint_of_another_model_than_its_config_json_is_refused_before_its_weights_load(tmp_path, monkeypatch,
                                                                                               how):
    from sps_jax import checkpoint
    run, trained, says = run_of_another_variant(tmp_path, how)
    monkeypatch.setattr(checkpoint, "restore_params", no_weights)
    sentence = (rf"checkpoint step 5 of {run} was trained as {trained}, but {run}/config\.json says {says}: put back "
                r"the config\.json it was trained with, or the run's own checkpoints \(this config\.json was edited, "
                r"or the checkpoints were copied from another run\)\.$")
    for load in (runs.load_model, runs.load_run):
        with pytest.raises(checkpoint.OtherModel, match=sentence):
            load(run)
    # A new run starting from those weights (train.init_from) is told the same before they load.
    config = ml_collections.ConfigDict(json.loads((tmp_path / "sps" / "config.json").read_text()))
    config.train.init_from = run
    with pytest.raises(ValueError, match=rf"^train\.init_from={run}: {sentence[:-1]}"):
        runs.check_init_from(config)


def test_every_command_that_loads_a_run_refuses_a_checkpoint_of_another_model_in_one_sentence(tmp_path, monkeypatch,
                                                                                             capsys):
    from sps_jax import checkpoint
    run, trained, says = run_of_another_variant(tmp_path, "copied")
    monkeypatch.setattr(checkpoint, "restore_params", no_weights)
    for name, err in refusals_of_every_loading_command(tmp_path, run, run, capsys):
        assert f"was trained as {trained}, but {run}/config.json says {says}: " in err, (name, err)
    assert sorted(os.listdir(tmp_path)) == ["data", "sps", "standard"]  # nothing written


def refusals_of_every_loading_command(tmp_path, run, generate_run, capsys):
    """(command, its stderr) of export-torch, generate (of ``generate_run``, whose tokenizer is GPT-2's), evaluate and
    probes on ``run``, each checked to end with status 2 and one line; a token folder is written to tmp_path/data."""
    from sps_jax import export_torch
    from sps_jax.analysis import probes
    from sps_jax.evaluation import evaluate
    from sps_jax.inference import generate
    from tests.helpers import write_token_folder
    write_token_folder(tmp_path / "data")
    commands = {"export-torch": (export_torch.main, [run, "--out", str(tmp_path / "out.pt")]),
                "generate": (generate.main, ["--workdir", generate_run, "--prompt", "a", "--max-new-tokens", "4"]),
                "evaluate": (evaluate.main, ["--workdir", run, "--val-data", str(tmp_path / "data")]),
                "probes": (probes.main, ["window-nll", "--workdir", run, "--val-data", str(tmp_path / "data"),
                                         "--out", str(tmp_path / "probes")])}
    for name, (main, argv) in commands.items():
        assert main(argv) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1, (name, err)
        yield name, err


def _run_holding_inf(path, config):
    """A run whose checkpoint (step 5) holds inf in block_1's MLP down projection."""
    params = jax.tree_util.tree_map(np.array, sps_model.init_params(sps_model.Transformer(config.model),
                                                                    jax.random.PRNGKey(0)))
    params["block_1"]["mlp"]["down"][3, 4] = np.inf
    # save_run refuses them: written as a damaged checkpoint (or an import before import_torch refused them) has them
    runs.write_config(str(path), config)
    checkpoint.save_params(str(path), 5, params, sps_model.ModelConfig.from_config(config.model).function_fields)
    return str(path)


def test_save_run_refuses_what_no_reader_could_load_before_writing(tmp_path):
    # Each was written, and refused only when read ("has no checkpoint yet", "holds NaN", "flax's variables dict").
    cfg, _, params = small_model("sps", 2)
    config = ml_collections.ConfigDict({"name": "r", "model": dataclasses.asdict(cfg), "train": {"global_batch": 2}})
    _, _, other = small_model("sps", 2, d_model=48)
    nan = jax.tree_util.tree_map(np.array, params)
    nan["embed"][0, 0] = np.nan
    save_small_run(tmp_path / "run")
    for kwargs, says in (({"step": -1}, r"^step=-1 must be 0 or more"),
                         ({"step": 1.5}, r"^step must be an integer"),
                         ({"params": other}, r"^params do not match config\.model"),
                         ({"params": {"params": params}}, r"^params is flax's variables dict"),
                         ({"params": nan}, r"^params: parameter \['embed'\] holds NaN or infinite values, which no run "
                                           r"can be read with: save finite weights\.$"),
                         ({"workdir": str(tmp_path / "run" / "checkpoints")}, r"would write into the run")):
        call = {"workdir": str(tmp_path / "new"), "config": config, "params": params, **kwargs}
        with pytest.raises((ValueError, TypeError), match=says):
            runs.save_run(**call)
    assert sorted(os.listdir(tmp_path)) == ["run"] and sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["5"]
    # Into an existing run: another config rewrote its config.json before Orbax refused the step, and the run no
    # longer loaded; a step it has was Orbax's traceback. Its own config adds a checkpoint.
    run = tmp_path / "run"
    own, before = runs.read_config(str(run)), (run / "config.json").read_text()
    standard = ml_collections.ConfigDict(json.loads(own.to_json()))
    standard.model.variant = "standard"
    for config_given, step, says in ((standard, 5, r"holds a run of another config: save into a new folder"),
                                     (standard, 9, r"holds a run of another config"),
                                     (own, 5, r"has a checkpoint at step 5 already: pass another step")):
        with pytest.raises(ValueError, match=says):
            runs.save_run(run, config_given, params, step=step)
    assert (run / "config.json").read_text() == before and sorted(os.listdir(run / "checkpoints")) == ["5"]
    runs.save_run(run, own, params, step=9)  # a pathlib.Path is a folder too
    assert sorted(os.listdir(run / "checkpoints")) == ["5", "9"] and runs.load_model(str(run))[2] == 9


def test_every_command_that_loads_a_checkpoint_of_weights_holding_nan_refuses_it_naming_the_parameter(tmp_path,
                                                                                                    capsys):
    # Evaluation wrote val_nll null and generation printed an argmax of NaN logits, each with status 0.
    from tests.helpers import REPO
    cfg, _, _ = small_model("sps", 2)
    run = _run_holding_inf(tmp_path / "run", ml_collections.ConfigDict(
        {"name": "tiny-run", "model": dataclasses.asdict(cfg), "train": {"global_batch": 2}}))
    gpt2_run = _run_holding_inf(tmp_path / "gpt2", sps_config.load_config(os.path.join(REPO, "configs", "tiny.py"), []))
    for name, err in refusals_of_every_loading_command(tmp_path, run, gpt2_run, capsys):
        assert f"checkpoint 5 of {gpt2_run if name == 'generate' else run}: parameter ['block_1']['mlp']['down'] " \
               "holds NaN or infinite values" in err, err
    assert sorted(os.listdir(tmp_path)) == ["data", "gpt2", "run"]  # nothing written
    with pytest.raises(ValueError, match=r"\['block_1'\]\['mlp'\]\['down'\] holds NaN or infinite values, which "
                                         r"training never saves"):
        runs.load_model(run)


def test_a_checkpoint_written_before_checkpoints_recorded_their_model_loads_as_before(tmp_path):
    # Nothing can be checked: it loads as its config.json says, without a word (docs/design.md section 9).
    from sps_jax import checkpoint
    run, _, _ = run_of_another_variant(tmp_path, "copied")
    meta_file = os.path.join(checkpoint.step_dir(run, 5), "meta", "metadata")
    meta = json.loads(open(meta_file).read())
    del meta[checkpoint.TRAINED_AS]
    with open(meta_file, "w") as f:
        json.dump(meta, f)
    net, _, step = runs.load_model(run)
    assert (net.cfg.variant, net.cfg.window, step) == ("sps", 2, 5)
    config = ml_collections.ConfigDict(json.loads(open(os.path.join(run, "config.json")).read()))
    config.train.init_from = run
    assert runs.check_init_from(config) == (run, 5, [])


def test_run_info_names_the_scale_from_the_dimensions_and_counts_tokens_seen(tmp_path):
    save_small_run(tmp_path / "run", "standard", 8, metrics_lines=[
        {"step": 2, "tokens_seen": 100, "loss": 3.0}, {"step": 4, "tokens_seen": 180, "loss": 2.5},
        {"step": 6, "tokens_seen": 260, "loss": 2.0}])
    info = runs.run_info(str(tmp_path / "run" / "checkpoints" / "5"), step=5)
    # Off the paper's scales; a window given to standard is normalised away; the last record at or
    # before step 5 says how many tokens were seen.
    assert info == {"run": "tiny-run", "workdir": str(tmp_path / "run"), "variant": "standard", "window": None,
                    "scale": None, "step": 5, "tokens_seen": 180}
    # Without metrics.jsonl: step x global batch x seq_len (5 x 2 x 32).
    save_small_run(tmp_path / "bare", "sps", 4)
    assert runs.run_info(str(tmp_path / "bare"), step=5)["tokens_seen"] == 320
    assert "step" not in runs.run_info(str(tmp_path / "bare"))
    with pytest.raises(TypeError, match=r"^step must be an integer, got '5'\.$"):  # failed comparing '5' with 4
        runs.run_info(str(tmp_path / "bare"), step="5")
    # A run at a paper scale says which.
    config = sps_config.load_config("configs/paper.py:xs,sps,16")
    runs.write_config(str(tmp_path / "xs"), config)
    assert runs.run_info(str(tmp_path / "xs"))["scale"] == "xs" and runs.run_info(str(tmp_path / "xs"))["window"] == 16


def test_a_workdir_of_another_model_names_the_fields_that_differ_in_a_sentence_that_agrees(tmp_path):
    config = sps_config.load_config("configs/tiny.py")
    for fields, says in (({"window": 4}, "(window differs)"), ({"window": 4, "d_model": 32}, "(d_model, window differ)")):
        saved = sps_config.load_config("configs/tiny.py")
        saved.model.update(fields)
        workdir = tmp_path / "-".join(fields)
        workdir.mkdir()
        (workdir / "config.json").write_text(saved.to_json())
        (workdir / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')  # it trained a step
        with pytest.raises(ValueError) as refusal:
            runs.check_workdir(str(workdir), config)
        assert f"holds a run of another model {says}: use a new --workdir" in str(refusal.value), refusal.value


@pytest.mark.parametrize("metrics_text", [None, ""])
def test_the_config_json_of_a_start_that_never_trained_a_step_is_replaced_with_a_note(tmp_path, capsys, metrics_text):
    # A start that failed before its first step (a compile the host ran out of memory for) left its config.json: the
    # corrected command, with a smaller model, was refused as "a run of another model" unless --force.
    saved = sps_config.load_config("configs/tiny.py")
    saved.model.d_model = 32
    (tmp_path / "config.json").write_text(saved.to_json())
    if metrics_text is not None:
        (tmp_path / "metrics.jsonl").write_text(metrics_text)
    runs.check_workdir(str(tmp_path), sps_config.load_config("configs/tiny.py"))
    assert capsys.readouterr().err == (
        f"note: --workdir {tmp_path} holds a run of another model (d_model differs) that never trained a step (no "
        "checkpoint, no metrics): this run replaces its config.json.\n")
    # A config.json that is no run's (another program's) stays refused.
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    with pytest.raises(ValueError, match="that is not this run's"):
        runs.check_workdir(str(tmp_path), sps_config.load_config("configs/tiny.py"))


def test_a_run_config_missing_a_model_field_names_it_instead_of_using_the_default(tmp_path):
    # window defaults to 64 (the paper's); a run trained at w=2 whose config.json lost the field
    # would otherwise load its weights into a w=64 model without a word.
    from sps_jax.cli import UserError
    save_small_run(tmp_path / "run", window=2)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    del config["model"]["window"], config["model"]["seq_len"]
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"config\.json: the model section has no seq_len, window: .*\.$"):
        runs.load_model(str(tmp_path / "run"))


@pytest.mark.parametrize("text, problem", [("", r"is not JSON at line 1, column 1 \(Expecting value\)"),
                                           ('{"model": {"variant"', r"is not JSON at line 1, column 21"),
                                           ("[]", r"is not a run config: it is list, not an object"),
                                           ('{"name": "a"}', r"is not a run config: it has no 'model' section"),
                                           ('{"model": NaN}', r"is not a run config: its 'model' is nan, not a section "
                                                              r"of fields"),
                                           # Read as the run's train section: tokens_seen's fallback raised AttributeError.
                                           ('{"model": {}, "train": 5}', r"is not a run config: its 'train' is 5, not a "
                                                                         r"section of fields")])
def test_a_run_config_that_is_no_run_config_says_to_put_back_the_one_it_was_trained_with(tmp_path, text, problem):
    # An emptied or cut-off config.json (a full disk, an editor) said only what was wrong, with no way out.
    from sps_jax.cli import UserError
    save_small_run(tmp_path / "run")
    (tmp_path / "run" / "config.json").write_text(text)
    with pytest.raises(UserError, match=rf"config\.json {problem}.*: put back the config\.json the run was trained "
                                        r"with\.$"):
        runs.load_model(str(tmp_path / "run"))


@pytest.mark.parametrize("name", [5, None, "", " "])
def test_a_run_name_that_is_no_text_is_refused_as_an_edited_config_not_taken_as_the_runs_label(tmp_path, name):
    # Figures' legends and evaluate's tables labelled the run "5" (and a null or empty one by its folder).
    from sps_jax.cli import UserError
    save_small_run(tmp_path / "run")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    (tmp_path / "run" / "config.json").write_text(json.dumps(dict(config, name=name)))
    with pytest.raises(UserError) as refused:
        runs.run_info(str(tmp_path / "run"))
    assert str(refused.value) == (f"{tmp_path / 'run' / 'config.json'} is not a run config: its 'name' is {name!r}, "
                                  "not the run's name (a non-empty string): put back the config.json the run was "
                                  "trained with.")


def test_a_run_config_without_a_field_of_how_the_model_runs_loads_with_its_default(tmp_path):
    # A run written before loss_chunk, prefill_chunk or residual_dtype existed: their defaults compute the same model.
    save_small_run(tmp_path / "run")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    del config["model"]["loss_chunk"], config["model"]["prefill_chunk"], config["model"]["residual_dtype"]
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    cfg = runs.load_model(str(tmp_path / "run"))[0].cfg
    assert (cfg.prefill_chunk, cfg.residual_dtype) == (0, None)


def test_resuming_a_workdir_whose_config_lost_a_model_field_names_it(tmp_path):
    # Training filled in the default (variant sps) and resumed a run whose variant was lost as that,
    # or called it "another model (variant differs)" when this config's variant was another.
    from sps_jax.cli import UserError
    save_small_run(tmp_path / "run")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    del config["model"]["variant"]
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"config\.json: the model section has no variant: put back the values "):
        runs.check_workdir(str(tmp_path / "run"), sps_config.load_config("configs/tiny.py"))


def _edited_run(tmp_path, **fields):
    """A run with a checkpoint (window 2), the config it was trained with, and its config.json edited to ``fields``."""
    save_small_run(tmp_path / "run")
    trained_with = runs.read_config(str(tmp_path / "run"))
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    config["model"].update(fields)
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    return str(tmp_path / "run"), trained_with


def test_resuming_a_run_whose_config_json_was_edited_to_another_window_says_the_file_not_the_command(tmp_path):
    # Told "a run of another model (window differs) ...: use ... the original model settings to resume it" to the
    # command that had them: the checkpoint records what it was trained as, so the edited file is the one to fix.
    from sps_jax.cli import UserError
    run, trained_with = _edited_run(tmp_path, window=4)
    with pytest.raises(UserError, match=r"^checkpoint step 5 of .*run was trained as window=2, but .*run/config\.json "
                                        r"says window=4: put back the config\.json it was trained with"):
        runs.check_workdir(run, trained_with)


def test_resuming_a_run_of_another_model_names_both_values_and_the_overrides_that_resume_it(tmp_path):
    from sps_jax.cli import UserError
    save_small_run(tmp_path / "run")
    config = runs.read_config(str(tmp_path / "run"))
    config.model.window, config.model.seq_len = 4, 64
    with pytest.raises(UserError) as refusal:
        runs.check_workdir(str(tmp_path / "run"), config)
    assert str(refusal.value) == (
        f"--workdir {tmp_path / 'run'} holds the checkpoints of a run of another model: its config.json says "
        "seq_len=32, window=2, this config seq_len=64, window=4: resume with the run's values (--config.model.seq_len=32 "
        "--config.model.window=2), or use a new --workdir.")


def test_resuming_a_run_whose_config_json_holds_a_value_of_the_wrong_kind_says_to_put_it_back(tmp_path):
    # Said as "a config.json that is not this run's (...) and its checkpoints: use a new --workdir, or the original
    # model settings to resume it", settings that cannot mend the file; generate and the other readers said what was
    # wrong and nothing to do.
    from sps_jax.cli import UserError
    run, trained_with = _edited_run(tmp_path, num_layers="2")
    says = (f"{run}/config.json: model.num_layers must be an integer of at least 1, got '2': put back the config.json "
            "the run was trained with.")
    with pytest.raises(UserError) as refusal:
        runs.check_workdir(run, trained_with)
    assert str(refusal.value) == says
    with pytest.raises(UserError) as refusal:
        runs.load_model(run)
    assert str(refusal.value) == says


def test_resuming_checkpoints_whose_config_json_was_lost_is_refused(tmp_path):
    # Before: training resumed them as this config's model; a standard run's weights (sps's shapes) went on as sps.
    from sps_jax.cli import UserError
    save_small_run(tmp_path / "run", variant="standard")
    os.remove(tmp_path / "run" / "config.json")
    with pytest.raises(UserError, match=r"holds checkpoints but no config\.json, so the model and data order they "
                                        r"were trained with are unknown: put back the run's config\.json"):
        runs.check_workdir(str(tmp_path / "run"), sps_config.load_config("configs/tiny.py"))


def test_a_workdir_inside_a_runs_checkpoints_is_refused_before_training_writes_there(tmp_path):
    # Training in RUN/checkpoints or RUN/checkpoints/<step> wrote its config.json, metrics.jsonl and
    # checkpoints/ into the other run's Orbax folders.
    from sps_jax.cli import UserError
    save_small_run(tmp_path / "run")
    config = sps_config.load_config("configs/tiny.py")
    for inside in ("checkpoints", os.path.join("checkpoints", "5"), os.path.join("checkpoints", "new")):
        workdir = str(tmp_path / "run" / inside)
        with pytest.raises(UserError, match=r"lies in the run .*/run's own files \(its checkpoints/\), .* pass "
                                            r"another --workdir\.$"):
            runs.check_workdir(workdir, config)
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["5"]
    # A run file that became a folder is named as what it is (it was called the run's checkpoints/).
    os.mkdir(tmp_path / "run" / "metrics.jsonl")
    with pytest.raises(UserError, match=r"own files \(its metrics\.jsonl\)"):
        runs.check_workdir(str(tmp_path / "run" / "metrics.jsonl"), config)


def test_a_run_or_token_folder_inside_another_run_is_refused_and_result_files_there_are_not(tmp_path):
    # A workdir in RUN/tensorboard/x or RUN/eval/x (an import or a token folder too) was accepted: its files
    # then lay among the other run's, where TensorBoard, which reads the run's folders, took it for part of it.
    from sps_jax.cli import UserError
    run = tmp_path / "run"
    (run / "tensorboard").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text("")
    config = sps_config.load_config("configs/tiny.py")
    for inside in ("eval/x", "x/y"):
        with pytest.raises(UserError, match=rf"^--workdir {run}/{inside} lies inside the run {run}, where its files "
                                            r"would mix with that run's: choose a folder outside it\.$"):
            runs.check_workdir(str(run / inside), config)
        with pytest.raises(UserError, match=rf"^--out {run}/{inside} lies inside the run {run}"):
            run_files.output_folder(str(run / inside))
    # tensorboard/ is training's alone: a new run of the folder removes it, with any result written there.
    with pytest.raises(UserError, match=rf"^--workdir {run}/tensorboard/x lies in the run {run}'s own files \(its "
                                        r"tensorboard/\)"):
        runs.check_workdir(str(run / "tensorboard" / "x"), config)
    with pytest.raises(UserError, match=rf"^--out {run}/tensorboard/gen\.jsonl would write into the run {run}'s own "
                                        r"files"):
        run_files.output_file(str(run / "tensorboard" / "gen.jsonl"))
    runs.check_workdir(str(tmp_path / "other"), config)  # beside it is fine
    run_files.output_file(str(run / "eval" / "step_5.json"), "the results file")  # evaluate's results belong there
    (tmp_path / "model").mkdir()  # a config.json alone (a Hugging Face model's) is no run
    (tmp_path / "model" / "config.json").write_text("{}")
    runs.check_workdir(str(tmp_path / "model" / "run"), config)


@pytest.mark.parametrize("command", ["generate", "evaluate"])
def test_no_result_replaces_the_tokenizers_ranks_file_the_command_reads_even_when_forced(tmp_path, monkeypatch,
                                                                                          command):
    # generate --out RANKS --force replaced $SPS_JAX_TOKENIZER's ranks with its JSONL (unseen at first: tiktoken had
    # cached them).
    from sps_jax.data import tokenizer
    from sps_jax.evaluation import evaluate
    from sps_jax.inference import generate
    from tests import fuzz

    ranks = tmp_path / "gpt2.tiktoken"
    ranks.write_text("ranks")
    monkeypatch.setenv(tokenizer.RANKS_VARIABLE, str(ranks))
    main, argv = {"generate": (generate.main, ["--prompt", "x"]),
                  "evaluate": (evaluate.main, ["--tasks", "arc_easy"])}[command]
    for out in (str(ranks), os.path.join(str(tmp_path), ".", "gpt2.tiktoken")):
        outcome = fuzz.call(main, ["--workdir", str(tmp_path / "run"), *argv, "--out", out, "--force"])
        assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
        assert outcome.stderr.strip() == (f"error: --out {out} is the tokenizer's ranks file {ranks}, which this "
                                          "command reads: choose another name (--force replaces earlier results, "
                                          "never an input).")
    assert ranks.read_text() == "ranks"


def test_a_run_or_token_folder_inside_any_token_folder_is_refused(tmp_path):
    from sps_jax import import_torch, token_folder, trainer
    from sps_jax.data import prepare
    # `data prepare --out TOK/sub` was accepted; `data prepare --out TOK --force` then deleted TOK/sub with TOK,
    # and a run made in TOK/run would go the same way.
    from sps_jax.cli import UserError
    tokens = tmp_path / "tok"
    (tokens / "deep").mkdir(parents=True)
    (tokens / "manifest.json").write_text("{}")
    config = sps_config.load_config("configs/tiny.py")
    for inside in ("sub", "deep/sub"):  # prepare's and the import's out argument (the commands' --out)
        with pytest.raises(UserError, match=rf"^out {tokens}/{inside} lies inside the token folder {tokens}, "
                                            r"which `data prepare --force` replaces whole, along with anything "
                                            r"inside it: choose a path outside it\.$"):
            prepare.prepare("builtin", str(tokens / inside))
        with pytest.raises(UserError, match=rf"^out {tokens}/{inside} lies inside the token folder {tokens}"):
            import_torch.check_out(str(tokens / inside), force=False)
        with pytest.raises(UserError, match=rf"^--workdir {tokens}/{inside} lies inside the token folder {tokens}"):
            trainer.train(config, str(tokens / inside))
    token_folder.refuse_inside_tokens(str(tmp_path / "beside"), "--out")  # beside it is fine


def test_a_folder_holding_runs_is_no_workdir_and_no_import_replaces_it(tmp_path):
    # train --workdir runs (the parent of runs/a) trained there, and runs/a then lay among the new run's files;
    # import_torch --out runs --force deleted runs/a with the folder.
    from sps_jax import import_torch
    from sps_jax.cli import UserError
    run = tmp_path / "runs" / "group" / "a"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    config = sps_config.load_config("configs/tiny.py")
    for holder in (tmp_path / "runs", tmp_path / "runs" / "group"):
        with pytest.raises(UserError, match=rf"^--workdir {holder} holds the run {run}, which a run made there "
                                            r"would hold among its own files: pass a new folder \(a sibling of "):
            runs.check_workdir(str(holder), config)
        with pytest.raises(UserError, match=rf"^out {holder} holds {run}, a run or token folder that replacing it "
                                            r"would delete: choose a new out\.$"):  # import_checkpoint's argument
            import_torch.check_out(str(holder), force=True)
    tokens = tmp_path / "data" / "a" / "b" / "c" / "tok"  # deeper than a workdir is searched, never too deep to delete
    tokens.mkdir(parents=True)
    (tokens / "manifest.json").write_text("{}")
    with pytest.raises(UserError, match=rf"^out {tmp_path / 'data'} holds {tokens}, a run or token folder"):
        import_torch.check_out(str(tmp_path / "data"), force=True)
    runs.check_workdir(str(tmp_path / "data"), config)
    import_torch.check_out(str(tmp_path / "new"), force=True)  # nothing below it: fine


def test_a_workdir_in_the_token_folder_it_trains_on_is_refused(tmp_path):
    # A run there is deleted with the folder when `data prepare --force` rebuilds it.
    from sps_jax.cli import UserError
    data = tmp_path / "data"
    data.mkdir()
    config = sps_config.load_config("configs/tiny.py", [f"--config.data.dir={data}"])
    for workdir in (data, data / "run", data / "a" / "b"):
        with pytest.raises(UserError, match=r"lies in the token folder data\.dir=.*: pass a --workdir outside it\.$"):
            runs.check_workdir(str(workdir), config)
    runs.check_workdir(str(tmp_path / "run"), config)  # beside it is fine


def test_a_workdir_that_is_another_token_folder_is_refused(tmp_path):
    # Only data.dir's own folder was refused: a run trained into another prepared folder, among its tokens.
    from sps_jax.cli import UserError
    from tests.helpers import write_token_folder
    other = write_token_folder(str(tmp_path / "other"))
    before = sorted(os.listdir(other))
    config = sps_config.load_config("configs/tiny.py", [f"--config.data.dir={tmp_path / 'data'}"])
    with pytest.raises(UserError, match=rf"^--workdir {other} is a token folder \(it holds manifest\.json\), which "
                                        r"`data prepare --force` replaces whole, run and all: pass a --workdir "
                                        r"outside it\.$"):
        runs.check_workdir(other, config)
    assert sorted(os.listdir(other)) == before


def test_a_step_of_the_wrong_type_is_one_sentence_and_numpy_integers_are_steps(tmp_path):
    cfg, net, params = small_model()
    config = ml_collections.ConfigDict({"model": dataclasses.asdict(cfg)})
    runs.save_run(str(tmp_path / "run"), config, params, step=3)
    for step in ("3", 3.0, 3.5, True):  # were "no checkpoint at step 3; it has [3]" and "step 3.0 is damaged"
        with pytest.raises(TypeError, match=rf"^step must be an integer \(a checkpoint's step\) or None \(the "
                                            rf"latest\), got {step!r}\.$"):
            runs.load_model(tmp_path / "run", step)
    assert runs.load_model(tmp_path / "run", np.int64(3))[2] == 3
    assert runs.load_run(str(tmp_path / "run"), np.int32(3))[2] == 3


@pytest.mark.parametrize("kind", ["loop", "missing target"])
def test_a_folder_to_write_that_is_a_link_leading_nowhere_is_called_one(tmp_path, kind):
    # Before: "--workdir LINK is a file, not a folder" (and the same of prepare's and the import's --out).
    from sps_jax import import_torch
    from sps_jax.data import prepare

    link = tmp_path / "out"
    os.symlink("out" if kind == "loop" else "nowhere", link)
    config = sps_config.load_config("configs/tiny.py")
    nowhere = "is a link that leads nowhere (its target is missing, or links point at each other in a loop): pass "
    for flag, call in (("--workdir", lambda: runs.check_workdir(str(link), config)),
                       ("out", lambda: import_torch.check_out(str(link), force=True)),  # Python's argument
                       ("out", lambda: prepare.prepare("builtin", str(link)))):
        with pytest.raises(ValueError) as refusal:
            call()
        assert str(refusal.value).startswith(f"{flag} {link} {nowhere}"), refusal.value
    assert os.path.islink(link) and not os.path.exists(link)


def test_a_run_trained_with_a_kernel_that_cannot_run_here_is_read_with_auto_and_a_note(tmp_path, monkeypatch,
                                                                                         capsys):
    """Every backend computes the same attention: a run trained with the jax-triton kernels on a GPU loads on a
    machine where they cannot run (here: off a GPU without Triton's interpreter), as 'auto', saying so once."""
    from sps_jax import triton_attention

    save_small_run(tmp_path / "run")
    config_path = tmp_path / "run" / "config.json"
    config = json.loads(config_path.read_text())
    config["model"]["attention"] = "triton"
    config_path.write_text(json.dumps(config))
    monkeypatch.setattr(triton_attention, "triton", object())  # installed, whatever this machine has
    monkeypatch.setattr(triton_attention, "interpreting", lambda: False)
    cfg = runs.read_run(str(tmp_path / "run"))[3]
    net, _, _ = runs.load_model(str(tmp_path / "run"))
    assert cfg.attention == net.cfg.attention == "auto" and cfg.variant == "sps"
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == [f"note: {tmp_path / 'run'} was trained with model.attention='triton', which cannot run here "
                     "(attention=\"triton\" runs its kernels on an NVIDIA GPU; on cpu set TRITON_INTERPRET=1 before "
                     "starting Python to run them in Triton's interpreter, or use attention=\"pallas\" or \"xla\"); "
                     "reading it with 'auto', which computes the same attention."]
    monkeypatch.setattr(triton_attention, "interpreting", lambda: True)  # where it can run, it is kept
    assert runs.read_run(str(tmp_path / "run"))[3].attention == "triton"


def test_an_attention_override_that_cannot_run_here_is_one_sentence_before_the_weights_load(tmp_path, monkeypatch,
                                                                                           capsys):
    """generate --attention triton and probes --attention triton, off a GPU without Triton's interpreter."""
    from sps_jax import checkpoint, triton_attention
    from sps_jax.analysis import probes
    from sps_jax.inference import generate
    from tests.helpers import write_token_folder
    save_small_run(tmp_path / "run")
    write_token_folder(tmp_path / "data")
    monkeypatch.setattr(checkpoint, "restore_params", no_weights)
    monkeypatch.setattr(triton_attention, "triton", object())  # installed, whatever this machine has
    monkeypatch.setattr(triton_attention, "interpreting", lambda: False)
    run = str(tmp_path / "run")
    commands = {"generate": (generate.main, ["--workdir", run, "--prompt", "a", "--max-new-tokens", "4",
                                             "--attention", "triton"]),
                "probes": (probes.main, ["window-nll", "--workdir", run, "--val-data", str(tmp_path / "data"),
                                         "--attention", "triton", "--out", str(tmp_path / "probes")])}
    for name, (main, argv) in commands.items():
        assert main(argv) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1, (name, err)
        assert 'error: attention="triton" runs its kernels on an NVIDIA GPU; on cpu set TRITON_INTERPRET=1' in err
    assert sorted(os.listdir(tmp_path)) == ["data", "run"]  # nothing written


@pytest.mark.parametrize("sub, what", [("checkpoints", "checkpoints"), ("tensorboard", "TensorBoard events")])
def test_a_run_subfolder_training_cannot_write_is_refused_before_any_work(tmp_path, monkeypatch, sub, what):
    # A read-only checkpoints/ was found at the first save, after compiling and a checkpoint interval of steps
    # (and followed by a dozen lines of Orbax's unawaited coroutines); a read-only tensorboard/ by a thread's
    # traceback with the path as a bytes literal.
    from sps_jax.cli import UserError
    run = tmp_path / "run"
    for name in ("checkpoints", "tensorboard"):
        (run / name).mkdir(parents=True)
    config = sps_config.load_config("configs/tiny.py")
    runs.check_workdir(str(run), config)
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if str(path).endswith(sub)
                        else access(path, mode, **kw))  # chmod a-w, for a user other than root
    with pytest.raises(UserError, match=rf"^{run}/{sub}, where training writes its {what}, is a folder which this "
                                        r"user cannot write in: make it writable, or pass another --workdir\.$"):
        runs.check_workdir(str(run), config)


def test_a_workdir_under_a_bracketed_folder_is_refused_before_any_work(tmp_path):
    # Orbax cannot read back checkpoints written there (tests/test_checkpoint.py): a run trained to its end,
    # said nothing, and could be neither resumed nor evaluated.
    from sps_jax import import_torch
    from sps_jax.cli import UserError
    config = sps_config.load_config("configs/tiny.py")
    with pytest.raises(UserError, match=r"^--workdir .*/exp\[1\]/run lies under a folder named 'exp\[1\]', where "
                                        r"Orbax cannot find the checkpoints it writes"):
        runs.check_workdir(str(tmp_path / "exp[1]" / "run"), config)
    with pytest.raises(UserError, match=r"^out .*/imp\[0\] lies under a folder named 'imp\[0\]'"):
        import_torch.check_out(str(tmp_path / "imp[0]"), force=False)
    runs.check_workdir(str(tmp_path / "exp[1" / "run"), config)  # no pattern: Orbax finds its files there


@pytest.mark.parametrize("workdir, kind", [(["run1", "run2"], "list"), (None, "NoneType")])
def test_a_workdir_that_is_not_one_path_is_one_sentence(workdir, kind):
    # Before: Python's "expected str, bytes or os.PathLike object, not list" from os.fspath.
    with pytest.raises(TypeError, match=not_one_path('workdir', kind)):
        runs.read_config(workdir)


@pytest.mark.parametrize("call", [runs.find_run, runs.run_info, runs.load_run, runs.checkpoint_step],
                         ids=["find_run", "run_info", "load_run", "checkpoint_step"])
@pytest.mark.parametrize("path, kind", [(["run1", "run2"], "list"), (None, "NoneType"), (3, "int")])
def test_a_run_path_that_is_not_one_path_is_one_sentence(call, path, kind):
    # Before: Python's "expected str, bytes or os.PathLike object, not NoneType" from os.path.realpath.
    with pytest.raises(TypeError, match=not_one_path('path', kind)):
        call(path)


def test_run_info_of_a_checkpoint_path_is_that_checkpoints_and_another_step_is_one_sentence(tmp_path):
    # The path's step was dropped: RUN/checkpoints/5 answered no step, and with step=8 the info of step 8, where
    # every reader of a run refuses the two naming different checkpoints.
    params = save_small_run(tmp_path / "run", metrics_lines=[{"step": 5, "tokens_seen": 100, "loss": 3.0},
                                                             {"step": 8, "tokens_seen": 160, "loss": 2.5}])
    run = str(tmp_path / "run")
    runs.save_run(run, runs.read_config(run), params, step=8)
    info = runs.run_info(os.path.join(run, "checkpoints", "5"))
    assert (info["step"], info["tokens_seen"]) == (5, 100)
    with pytest.raises(ValueError, match=r"checkpoints/5 is the checkpoint of step 5, but step 8 was asked for "
                                         r"\(step\): pass the run folder with step, or the checkpoint alone\.$"):
        runs.run_info(os.path.join(run, "checkpoints", "5"), step=8)
    assert runs.run_info(run, step=8)["tokens_seen"] == 160


def test_run_info_of_a_negative_step_is_one_sentence(tmp_path):
    # Its tokens_seen came out as -5 x the step's tokens.
    save_small_run(tmp_path / "run")
    with pytest.raises(ValueError, match=r"^step=-5 must be 0 or more\.$"):
        runs.run_info(str(tmp_path / "run"), -5)


def test_a_step_the_run_has_no_checkpoint_of_is_said_before_any_weights_load(tmp_path, monkeypatch):
    # run_info(RUN, 999) had answered the last step's tokens_seen labelled as step 999, and read_run let the
    # evaluation build its tokenizer and task index before the restore said the step did not exist.
    save_small_run(tmp_path / "run")
    run = str(tmp_path / "run")
    monkeypatch.setattr(runs, "load_model", lambda *a, **k: pytest.fail("weights loaded"))
    for call in (lambda: runs.run_info(run, 999), lambda: runs.read_run(run, 4)):
        with pytest.raises(FileNotFoundError, match=r"has no checkpoint at step (999|4); it has \[5\]: pass one"):
            call()
    assert runs.run_info(run, 5)["step"] == 5 and runs.read_run(run, 5)[1] == 5


def test_a_checkpoints_folder_without_a_step_holds_no_checkpoint(tmp_path):
    # Only numbered step folders are checkpoints: an empty checkpoints/ left by a failed start, or one holding the
    # user's notes, is no run whose config.json went missing.
    config = sps_config.load_config("configs/tiny.py")
    os.makedirs(tmp_path / "run" / "checkpoints" / "notes")
    runs.check_workdir(str(tmp_path / "run"), config)
    os.makedirs(tmp_path / "run" / "checkpoints" / "20")
    with pytest.raises(ValueError, match=r"holds checkpoints but no config\.json"):
        runs.check_workdir(str(tmp_path / "run"), config)


def test_a_resume_names_a_field_the_saved_config_lacks():
    # A config.json written before a field existed: the change from its default-less absence is still a change.
    saved, now = sps_config.load_config("configs/tiny.py"), sps_config.load_config("configs/tiny.py")
    with saved.unlocked():
        del saved.train["weight_decay"]
        del saved.data["val_windows"]
    assert runs.resume_changes(saved, now) == [f"train.weight_decay None -> {now.train.weight_decay!r}",
                                               f"data.val_windows None -> {now.data.val_windows!r}"]


def test_notebook_functions_refuse_params_of_another_model_or_holding_nan_before_any_work():
    # Flax ignores parameters a config does not name: a 2-layer model's params ran in a 1-layer config and gave
    # another NLL, other log-likelihoods and other probes without a word; NaN or integer weights gave NaN or argmax 0.
    from sps_jax.analysis import gradient_probe, window_nll
    from sps_jax.evaluation import val_nll
    from sps_jax.inference import decoding, scoring
    cfg, net, params = small_model("sps", 2)
    shallow = sps_model.Transformer(dataclasses.replace(cfg, num_layers=1))
    nan = jax.tree_util.tree_map(np.array, params)
    nan["embed"][0, 0] = np.nan
    ints = jax.tree_util.tree_map(lambda x: np.asarray(x).astype(np.int32), params)
    tokens, docs = np.arange(200) % 60, [np.arange(40) % 60]
    calls = {
        "validation_nll": lambda n, p: val_nll.validation_nll(n, p, tokens),
        "Scorer": lambda n, p: scoring.Scorer(n, p),
        "generate": lambda n, p: decoding.generate(n.cfg, p, [[1, 2]], 2),
        "window_nll_deltas": lambda n, p: window_nll.window_nll_deltas(n, p, docs, 2, log=lambda *a: None),
        "gradient_ratios": lambda n, p: gradient_probe.gradient_ratios(n, p, docs, [1], 1, log=lambda *a: None),
    }
    for name, call in calls.items():
        for n, p, says in ((shallow, params, r"^params do not match the model: it holds"),
                           (net, nan, r"^params: parameter \['embed'\] holds NaN or infinite values"),
                           (net, ints, r"^params do not match the model: parameter .* is int32, not floating point")):
            with pytest.raises(ValueError, match=says):
                call(n, p)
    for kwargs, says in (({"max_batch": 0}, r"^max_batch must be at least 1, got 0\.$"),  # was read as 1
                         ({"min_len": 2.7}, r"^min_len must be an integer")):
        with pytest.raises((TypeError, ValueError), match=says):
            scoring.Scorer(net, params, **kwargs)
    for name, call in calls.items():  # a ModelConfig where the Transformer belongs ("has no attribute 'cfg'")
        if name != "generate":  # which takes the config
            with pytest.raises(TypeError, match=r"^the model must be a sps_jax\.model\.Transformer, got a ModelConfig: "
                                                r"pass Transformer\(cfg\), or the one runs\.load_model gives\.$"):
                call(cfg, params)


def test_a_folder_holding_a_token_folder_is_no_workdir(tmp_path):
    # train --workdir data (the README's data/builtin in it, prepared by the run itself when missing) trained there:
    # `data prepare --force --out data/builtin` then refused to rebuild the tokens, as a folder inside a run.
    from sps_jax.cli import UserError
    config = sps_config.load_config("configs/tiny.py")
    tokens = tmp_path / "data" / "group" / "tok"
    tokens.mkdir(parents=True)
    (tokens / "manifest.json").write_text("{}")
    for holder in (tmp_path / "data", tmp_path / "data" / "group"):
        with pytest.raises(UserError, match=rf"^--workdir {holder} holds the token folder {tokens}, which a run made "
                                            r"there would hold among its own files"):
            runs.check_workdir(str(holder), config)
    config.data.dir = str(tmp_path / "fresh" / "builtin")  # not prepared yet: training would prepare it in the run
    with pytest.raises(UserError, match=rf"^--workdir {tmp_path / 'fresh'} holds the token folder {config.data.dir},"):
        runs.check_workdir(str(tmp_path / "fresh"), config)
    runs.check_workdir(str(tmp_path / "beside"), config)


def test_a_metrics_record_exactly_at_the_step_counts_the_tokens_seen_by_then(tmp_path):
    # Guards against ``<= step`` becoming ``< step``: the record at step 5 itself was ignored (250 -> 100).
    save_small_run(tmp_path / "run", metrics_lines=[{"step": 2, "tokens_seen": 100}, {"step": 5, "tokens_seen": 250}])
    assert runs.run_info(str(tmp_path / "run"), step=5)["tokens_seen"] == 250


def test_tokens_seen_is_the_checkpoints_own_record_where_metrics_lost_the_records_up_to_its_step(tmp_path):
    # A metrics.jsonl that ends before the checkpoint (its tail lost, or replaced) gave the last record's tokens, labelled
    # as the checkpoint's step: step 7's evaluation said 100 tokens where the checkpoint records 350.
    params = save_small_run(tmp_path / "run", metrics_lines=[{"step": 2, "tokens_seen": 100}])
    config = runs.read_config(str(tmp_path / "run"))
    runs.save_run(str(tmp_path / "run"), config, params, step=7, meta={"tokens_seen": 350})
    assert runs.run_info(str(tmp_path / "run"), step=7)["tokens_seen"] == 350


def test_configs_differing_only_in_how_the_model_is_computed_are_the_same_model():
    # Guards against dropping the EXECUTION_FIELDS filter: another attention backend, remat or loss chunk on resume
    # or init_from was called "another model".
    saved = sps_config.load_config("configs/tiny.py")
    config = sps_config.load_config("configs/tiny.py")
    config.model.attention = "pallas" if saved.model.attention != "pallas" else "xla"
    config.model.remat = not saved.model.remat
    config.model.loss_chunk = saved.model.loss_chunk + 7
    assert runs.model_differences(saved, config) == []
    config.model.num_layers = saved.model.num_layers + 1
    assert runs.model_differences(saved, config) == ["num_layers"]


def test_init_from_a_run_folder_starts_from_its_newest_checkpoint(tmp_path):
    # Guards against ``found[-1]`` becoming ``found[0]``: init_from a run folder took its earliest checkpoint.
    params = save_small_run(tmp_path / "run")  # step 5
    run = str(tmp_path / "run")
    config = ml_collections.ConfigDict(json.loads((tmp_path / "run" / "config.json").read_text()))
    runs.save_run(run, config, params, step=2)
    runs.save_run(run, config, params, step=9)
    config.train.init_from = run
    assert runs.check_init_from(config) == (run, 9, [])


@pytest.mark.parametrize("damage, says", [
    ("step file", "has no checkpoint: {run}/checkpoints/5 is not a checkpoint folder: put the checkpoint back."),
    ("checkpoints file", "has no checkpoint: {run}/checkpoints is not a folder: put the run's checkpoints back."),
    ("config folder", "{run}/config.json is a folder, not the run's config file: move it away and put back the "
                      "config.json the run was trained with.")])
def test_a_run_whose_files_are_of_the_wrong_kind_is_told_what_to_put_back(tmp_path, damage, says):
    # A file at checkpoints/5 was told to "train it until it saves one"; a folder at config.json that the path was
    # "neither a run folder nor a checkpoints/<step> folder".
    run = tmp_path / "run"
    save_small_run(run)
    if damage == "step file":
        shutil.rmtree(run / "checkpoints" / "5")
        (run / "checkpoints" / "5").write_text("")
    elif damage == "checkpoints file":
        shutil.rmtree(run / "checkpoints")
        (run / "checkpoints").write_text("")
    else:
        (run / "config.json").unlink()
        (run / "config.json").mkdir()
    with pytest.raises((OSError, ValueError)) as refusal:
        runs.load_model(str(run))
    assert str(refusal.value).endswith(says.format(run=run)), refusal.value


def renamed_checkpoint(tmp_path, name, recorded=None):
    """A small run whose checkpoint of step 5 was renamed by hand to checkpoints/<name>; ``recorded``, when given, is
    written over the step its meta item records (an edited meta item)."""
    save_small_run(tmp_path / "run", metrics_lines=[{"step": 5, "tokens_seen": 320, "val_loss": 4.0}])
    run = str(tmp_path / "run")
    os.rename(checkpoint.step_dir(run, 5), os.path.join(run, "checkpoints", name))
    if recorded is not None:
        meta_file = os.path.join(run, "checkpoints", name, "meta", "metadata")
        meta = json.loads(open(meta_file).read())
        with open(meta_file, "w") as f:
            json.dump({**meta, "step": recorded}, f)
    return run


def renamed_sentence(run, name, step):
    ckpts = os.path.join(run, "checkpoints")
    return (f"{ckpts}/{name} holds the checkpoint of step {step} (its meta item records it), not of step {int(name)} "
            f"as its name says: rename it back to {ckpts}/{step}, or move it out of {ckpts}.")


def test_a_checkpoint_folder_renamed_to_another_step_is_refused_naming_both_before_its_weights_load(tmp_path,
                                                                                                  monkeypatch):
    # checkpoints/5 renamed to checkpoints/9 was read as step 9: evaluate wrote step_9.json, and "the latest" of a run
    # with a real step 7 was the older weights.
    import re
    from sps_jax.cli import UserError
    run = renamed_checkpoint(tmp_path, "9")
    monkeypatch.setattr(checkpoint, "restore_params", no_weights)
    sentence = "^" + re.escape(renamed_sentence(run, "9", 5)) + "$"
    for call in (lambda: runs.load_run(run), lambda: runs.load_run(os.path.join(run, "checkpoints", "9")),
                 lambda: runs.run_info(run, 9), lambda: checkpoint.steps(run)):
        with pytest.raises(UserError, match=sentence):
            call()


def test_cli_every_command_that_reads_a_checkpoint_refuses_one_renamed_by_hand(tmp_path, monkeypatch, capsys):
    from sps_jax.analysis import figures
    run = renamed_checkpoint(tmp_path, "9")
    monkeypatch.setattr(checkpoint, "restore_params", no_weights)
    sentence = renamed_sentence(run, "9", 5)
    for name, err in refusals_of_every_loading_command(tmp_path, run, run, capsys):
        assert sentence in err, (name, err)
    assert figures.main(["curves", run, "--out", str(tmp_path / "curves.png")]) == 2
    assert capsys.readouterr().err.strip().endswith(sentence)
    assert sorted(os.listdir(tmp_path)) == ["data", "run"]  # nothing written


def test_a_checkpoint_folder_orbax_does_not_read_as_a_step_is_refused_not_taken_for_no_checkpoint(tmp_path):
    # Orbax skips checkpoints/005: a reader said the run had no checkpoint yet ("train it until it saves one"), and a
    # resume started the run over from step 0, emptying its metrics.jsonl.
    from sps_jax.cli import UserError
    run = renamed_checkpoint(tmp_path, "005")
    ckpts = os.path.join(run, "checkpoints")
    sentence = (f"{ckpts}/005 is the checkpoint of step 5, but Orbax reads a step only from its number written "
                f"plainly (ASCII digits, no leading zeros), so every reader would skip it: rename it to {ckpts}/5.")
    for call in (lambda: runs.load_run(run), lambda: runs.check_workdir(run, runs.read_config(run))):
        with pytest.raises(UserError) as refusal:
            call()
        assert str(refusal.value) == sentence
    assert (tmp_path / "run" / "metrics.jsonl").read_text() != ""


@pytest.mark.parametrize("name, step", [("\u00b2", None), ("\u0661", 1)],
                         ids=["superscript-two", "arabic-indic-one"])
def test_a_folder_named_by_digits_is_a_step_folder_to_every_check_alike_only_when_they_are_decimal(tmp_path, name,
                                                                                                    step):
    # '²' is a digit (str.isdigit) that int() cannot read: has_checkpoints counted checkpoints/² as a checkpoint (train
    # then left train.init_from unread) where check_step_names passed it by, and find_run and a reader's "no
    # checkpoint" sentence stopped in int(). '١' (Arabic-Indic one) is decimal: every check takes it for step 1.
    from sps_jax.cli import UserError
    ckpts = tmp_path / "run" / "checkpoints"
    os.makedirs(ckpts / name)
    assert run_files.has_checkpoints(str(tmp_path / "run")) is (step is not None)
    if step is None:
        checkpoint.check_step_names(str(tmp_path / "run"))
        with pytest.raises(FileNotFoundError, match="is neither a run folder"):
            run_files.find_run(str(ckpts / name))
    else:
        with pytest.raises(UserError, match=f"{ckpts}/{name} is the checkpoint of step {step}, but Orbax reads"):
            checkpoint.check_step_names(str(tmp_path / "run"))
        assert run_files.find_run(str(ckpts / name)) == (str(tmp_path / "run"), step)
    os.rmdir(ckpts / name)
    (ckpts / name).write_text("")  # a file where a step's folder would be
    assert (f"{ckpts / name} is not a checkpoint folder" in checkpoint._no_checkpoint(str(tmp_path / "run"))) is (
        step is not None)


def test_a_checkpoint_past_the_last_step_a_run_can_reach_is_refused_and_never_saved(tmp_path):
    # checkpoints/2147483648 (its meta item edited to match) loaded as that step, which no run reaches (AdamW counts
    # its updates in int32) and no --step can name; save_run wrote one.
    from sps_jax.cli import UserError
    run = renamed_checkpoint(tmp_path, "2147483648", recorded=2 ** 31)
    ckpts = os.path.join(run, "checkpoints")
    with pytest.raises(UserError) as refusal:
        runs.load_run(run)
    assert str(refusal.value) == (f"{ckpts}/2147483648 is the checkpoint of step 2147483648, past step 2147483647, the "
                                  "last step a run can reach (AdamW counts updates in int32), so no run saved it: move "
                                  f"it out of {ckpts}.")
    cfg, _, params = small_model("sps", 2)
    config = ml_collections.ConfigDict({"name": "r", "model": dataclasses.asdict(cfg), "train": {"global_batch": 2}})
    with pytest.raises(ValueError, match=r"^step=2147483648 is past step 2147483647, the last step a run can reach "
                                         r"\(AdamW counts updates in int32\): save it at a step up to that\.$"):
        runs.save_run(str(tmp_path / "new"), config, params, step=2 ** 31)
    assert not (tmp_path / "new").exists()


# Overrides of each kind a field holds, with the value config.json must hold for each: ints stay ints (2e3 is 2000),
# floats keep their value, None and the word none on a number field None may fill are null, text stays text.
WRITTEN_OVERRIDES = {"train.seed": ("3", 3), "train.warmup_tokens": ("2e3", 2000), "train.peak_lr": ("2e-3", 2e-3),
                     "train.final_lr": ("1e-4", 1e-4), "train.b2": ("0.99", 0.99), "train.eps": ("1e-9", 1e-9),
                     "train.grad_clip": ("none", None), "train.peak_flops_per_device": ("1e12", 1e12),
                     "model.window": ("5", 5), "model.persistent_window": ("NONE", None),
                     "model.rope_theta": ("5e3", 5000.0), "model.remat": ("True", True), "data.prefetch": ("1", 1),
                     "data.dir": ("2024", "2024"), "metrics.wandb_entity": ("none", "none"),
                     "metrics.wandb_name": ("None", None)}


def test_overridden_values_reach_config_json_unchanged_and_a_resume_reads_back_the_same_config(tmp_path):
    config = sps_config.load_config("configs/tiny.py", [f"{k}={text}" for k, (text, _) in WRITTEN_OVERRIDES.items()])
    runs.write_config(str(tmp_path), config)
    data = json.loads((tmp_path / "config.json").read_text())
    written = {k: data[k.split(".")[0]][k.split(".")[1]] for k in WRITTEN_OVERRIDES}
    assert {k: (v, type(v)) for k, v in written.items()} == {k: (v, type(v)) for k, (_, v) in WRITTEN_OVERRIDES.items()}
    saved = runs.read_config(str(tmp_path))
    # a resume with the same command changes nothing it would name, and builds the same model
    assert runs.resume_changes(saved, config) == []
    assert runs.checked_model_config(saved, str(tmp_path)) == sps_model.ModelConfig.from_config(config.model)
    assert saved.to_dict() == config.to_dict()
