"""Export to the authors' PyTorch layout (.pt and .safetensors): their key names and shapes, the same
numbers in both formats, an exact round trip through import_torch for every variant, their model's
logits from the exported file alone, and no silent overwrite."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.torch as safetensors_torch  # the test extra has torch and safetensors: no skips
import torch

from sps_jax import config as sps_config, export_torch, import_torch, model as sps_model, runs
from tests import fuzz
from tests.helpers import REPO, SMALL, SMALL_OVERRIDES, env
from tests.torch_reference import numpy_forward
from tests.helpers import not_one_path

L, D, H, T = 2, 32, 2, 16  # the small model of SMALL_OVERRIDES
STEP = 7
VARIANTS = ["standard", "sps", "two_x_memory", "delayed_state", "reverse_sps"]


def make_run(path, variant, window, seed=0):
    """A run folder (configs/tiny.py shrunk by SMALL_OVERRIDES) at step STEP with random weights large
    enough that every parameter moves the logits: N(0, 1) embeddings, N(0, 0.3) matrices, norm scales
    1 + N(0, 0.3)."""
    config = sps_config.load_config(f"configs/tiny.py:{variant},{window}", SMALL_OVERRIDES)
    net = sps_model.Transformer(sps_model.ModelConfig.from_config(config.model))
    leaves, tree = jax.tree_util.tree_flatten_with_path(sps_model.param_shapes(net))
    rng = np.random.default_rng(seed)
    values = []
    for key_path, leaf in leaves:
        name = jax.tree_util.keystr(key_path)
        noise = rng.standard_normal(leaf.shape).astype(np.float32)
        values.append(noise if "embed" in name else 1 + 0.3 * noise if "scale" in name else 0.3 * noise)
    runs.save_run(str(path), config, jax.tree_util.tree_unflatten(tree, values), step=STEP)
    return str(path)


def their_shapes(V=SMALL["vocab_size"]):
    """The authors' state dict: names and shapes, written out from their model's definition."""
    shapes = {"transformer.wte.weight": (V, D), "transformer.output_norm.weight": (D,), "lm_head.weight": (V, D)}
    for i in range(L):
        h = f"transformer.h.{i}."
        shapes.update({h + "attention_norm.weight": (D,), h + "attn.c_attn.weight": (3 * D, D),
                       h + "attn.c_proj.weight": (D, D), h + "mlp_norm.weight": (D,),
                       h + "mlp.gate_proj.weight": (3 * D, D), h + "mlp.up_proj.weight": (3 * D, D),
                       h + "mlp.down_proj.weight": (D, 3 * D)})
    return shapes


def assert_same_run(a, b):
    """Bit-identical f32 parameters, an equal config.json and the same step."""
    config_a, params_a, step_a = runs.load_run(a)
    config_b, params_b, step_b = runs.load_run(b)
    assert config_a.to_dict() == config_b.to_dict() and step_a == step_b == STEP
    leaves_a, tree_a = jax.tree_util.tree_flatten(params_a)
    leaves_b, tree_b = jax.tree_util.tree_flatten(params_b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b):
        assert x.dtype == y.dtype == jnp.float32 and np.array_equal(np.asarray(x), np.asarray(y))


# w = 0, a small w, and the far edges T - 1, T + 1 and none (exported as the context, read back as the run's own).
@pytest.mark.parametrize("window", [0, 3, T - 1, T + 1, "none"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_round_trip_through_both_formats_is_exact(tmp_path, variant, window):
    run = make_run(tmp_path / "run", variant, window)
    for suffix in ("pt", "safetensors"):
        export_torch.export_run(run, str(tmp_path / f"ckpt.{suffix}"))
        import_torch.import_checkpoint(str(tmp_path / f"ckpt.{suffix}"), str(tmp_path / f"back-{suffix}"))
        assert_same_run(run, str(tmp_path / f"back-{suffix}"))


def test_exported_tensors_have_the_authors_names_shapes_and_model_args(tmp_path):
    run = make_run(tmp_path / "run", "sps", 3)
    export_torch.export_run(run, str(tmp_path / "ckpt.pt"))
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert {k: tuple(v.shape) for k, v in ckpt["model"].items()} == their_shapes()
    assert all(v.dtype == torch.float32 for v in ckpt["model"].values())
    # Their config's field names (an unknown one stops their loader), with this run's values.
    assert ckpt["model_args"] == {"n_layer": L, "n_head": H, "hidden_size": D, "intermediate_size": 3 * D,
                                  "vocab_size": SMALL["vocab_size"], "block_size": T, "norm_eps": 1e-6,
                                  "eos_token_id": SMALL["eos_id"], "pad_token_id": SMALL["pad_id"],
                                  "predict_token_id": SMALL["predict_id"], "window_size": 3}
    assert ckpt["iter_num"] == STEP
    # Tied as in their module: one tensor under both names.
    assert ckpt["model"]["lm_head.weight"].data_ptr() == ckpt["model"]["transformer.wte.weight"].data_ptr()


@pytest.mark.parametrize("variant,window_size", [("standard", None), ("two_x_memory", T), ("sps", T)])
def test_model_args_hold_only_the_fields_their_config_of_that_model_has(tmp_path, variant, window_size):
    # Their standard model's config has no predict_token_id or window_size, and their window_size is an int: an
    # unbounded window is the context, as in their w=4096 runs.
    run = make_run(tmp_path / "run", variant, "none")
    args = export_torch.checkpoint_dict(*runs.load_run(run))["model_args"]
    assert args.get("window_size") == window_size
    assert ("predict_token_id" in args) == (variant != "standard")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pt_and_safetensors_hold_the_same_numbers(tmp_path, dtype):
    run = make_run(tmp_path / "run", "delayed_state", 3)
    for suffix in ("pt", "safetensors"):
        assert export_torch.main([run, "--out", str(tmp_path / f"ckpt.{suffix}"), "--dtype", dtype]) == 0
    pt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    st = safetensors_torch.load_file(tmp_path / "ckpt.safetensors")
    assert set(st) == set(pt["model"]) == set(their_shapes())
    for key, tensor in pt["model"].items():
        assert tensor.dtype == st[key].dtype == getattr(torch, dtype) and torch.equal(tensor, st[key]), key
    with open(tmp_path / "ckpt.safetensors", "rb") as f:  # the header: 8-byte length, then JSON
        metadata = json.loads(f.read(int.from_bytes(f.read(8), "little")))["__metadata__"]
    assert json.loads(metadata["model_args"]) == pt["model_args"] and metadata["iter_num"] == str(STEP)
    assert json.loads(metadata["sps_jax_config"]) == json.loads(pt["sps_jax_config"])
    upper = tmp_path / "CKPT.SAFETENSORS"  # the suffix in any case: it went to torch.load, which cannot read one
    upper.write_bytes((tmp_path / "ckpt.safetensors").read_bytes())
    assert set(import_torch.load_torch_checkpoint(str(upper))["model"]) == set(st)
    if dtype == "bfloat16":  # rounded as torch rounds the float32 export
        export_torch.export_run(run, str(tmp_path / "f32.pt"))
        f32 = torch.load(tmp_path / "f32.pt", weights_only=True)["model"]
        for key, tensor in pt["model"].items():
            assert torch.equal(tensor, f32[key].to(torch.bfloat16)), key


def test_an_authors_file_without_our_config_imports_its_window_and_predict_id(tmp_path):
    run = make_run(tmp_path / "run", "reverse_sps", 3)
    export_torch.export_run(run, str(tmp_path / "ours.pt"))
    ckpt = torch.load(tmp_path / "ours.pt", weights_only=True)
    del ckpt["sps_jax_config"]
    torch.save(ckpt, tmp_path / "theirs.pt")
    with pytest.raises(ValueError, match=r": pass variant \(standard, "):  # import_checkpoint's argument
        import_torch.import_checkpoint(str(tmp_path / "theirs.pt"), str(tmp_path / "nope"))
    config, _, _ = import_torch.import_checkpoint(str(tmp_path / "theirs.pt"), str(tmp_path / "back"),
                                               variant="reverse_sps")
    m = config.model
    assert (m.window, m.predict_id, m.eos_id, m.pad_id, m.num_heads, m.seq_len, m.num_layers) == \
        (3, SMALL["predict_id"], SMALL["eos_id"], SMALL["pad_id"], H, T, L)
    _, params, _ = runs.load_run(run)
    _, back, _ = runs.load_run(str(tmp_path / "back"))
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(lambda a, b: np.array_equal(a, b), params, back))


@pytest.mark.parametrize("variant,window", [("sps", 2), ("standard", None)])
def test_their_forward_on_the_exported_file_gives_our_logits(tmp_path, variant, window):
    run = make_run(tmp_path / "run", variant, window, seed=3)
    export_torch.export_run(run, str(tmp_path / "ckpt.safetensors"))
    from safetensors.numpy import load_file

    sd = load_file(tmp_path / "ckpt.safetensors")
    net, params, _ = runs.load_model(run)
    eos = SMALL["eos_id"]
    tokens = [5, 17, 3, 44, eos, 9, 9, 12, 30, 2, 1, 58, eos, 7, 7, 40]
    ours = np.asarray(jax.jit(net.apply)({"params": params}, jnp.asarray([tokens], jnp.int32))[0])
    theirs = numpy_forward(sd, tokens, variant, window, H, SMALL["predict_id"], eos, SMALL["pad_id"])
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_the_safetensors_path_needs_no_torch(tmp_path, monkeypatch, capsys):
    run = make_run(tmp_path / "run", "sps", 3)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now fails
    assert export_torch.main([run, "--out", str(tmp_path / "ckpt.pt")]) == 2
    assert capsys.readouterr().err.strip() == ("error: writing .pt files needs the torch package: "
                                               "pip install -e '.[torch]'.")
    assert export_torch.main([run, "--out", str(tmp_path / "ckpt.safetensors")]) == 0
    import_torch.import_checkpoint(str(tmp_path / "ckpt.safetensors"), str(tmp_path / "back"))
    assert_same_run(run, str(tmp_path / "back"))


def test_cli_export_prints_nothing_and_says_the_file_it_wrote_on_stderr(tmp_path, capsys):
    # stdout holds a command's results alone (what a pipe reads); the file a command wrote is said on stderr.
    run = make_run(tmp_path / "run", "sps", 3)
    out = tmp_path / "ckpt.safetensors"
    assert export_torch.main([run, "--out", str(out)]) == 0
    said = capsys.readouterr()
    assert said.out == "" and f"wrote {out}: step {STEP}, " in said.err, said


def test_cli_export_takes_the_run_as_workdir_and_as_a_word_of_its_own_but_not_both(tmp_path):
    # Every other command that reads one run says --workdir RUN; export_torch took the run only as a word of its
    # own, which scripts still give.
    run = make_run(tmp_path / "run", "sps", 3)
    flag, word = tmp_path / "flag.safetensors", tmp_path / "word.safetensors"
    for argv in (["--workdir", run, "--out", str(flag)], [run, "--out", str(word)]):
        outcome = fuzz.call(export_torch.main, argv)
        assert outcome.status == 0 and outcome.problem() is None, outcome.stderr
    from safetensors import safe_open

    with safe_open(str(flag), "np") as a, safe_open(str(word), "np") as b:
        assert a.metadata() == b.metadata() and sorted(a.keys()) == sorted(b.keys())
        assert all(np.array_equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())
    for argv, sentence in (
            ([run, "--workdir", run, "--out", str(tmp_path / "both.pt")],
             f"the run is given twice, as {run} and as --workdir {run}: pass --workdir alone"),
            (["--out", str(tmp_path / "none.pt")], "no run is given: pass --workdir RUN")):
        outcome = fuzz.call(export_torch.main, argv)
        assert outcome.status == 2 and outcome.stderr == (
            f"error: python -m sps_jax.export_torch: {sentence} (see --help).\n"), outcome.stderr
    assert sorted(os.listdir(tmp_path)) == ["flag.safetensors", "run", "word.safetensors"]


def test_an_existing_file_is_kept_unless_forced(tmp_path, capsys):
    out = tmp_path / "ckpt.safetensors"
    out.write_bytes(b"precious")
    # Refused before anything is loaded: the run need not even exist.
    assert export_torch.main([str(tmp_path / "no-such-run"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out) in err and "--force" in err
    assert out.read_bytes() == b"precious"
    run = make_run(tmp_path / "run", "sps", 3)
    assert export_torch.main([run, "--out", str(out)]) == 2 and out.read_bytes() == b"precious"
    assert export_torch.main([run, "--out", str(out), "--force"]) == 0
    assert f"wrote {out}: step " in capsys.readouterr().err and out.read_bytes() != b"precious"
    assert not list(tmp_path.glob("*.partial"))
    bad = tmp_path / "ckpt.bin"
    assert export_torch.main([run, "--out", str(bad)]) == 2
    assert capsys.readouterr().err.strip() == f"error: --out '{bad}' must end in .pt (torch) or .safetensors."
    # Before: "--out 'DIR/.pt' must end in .pt (torch) or .safetensors.", of a name that does.
    assert export_torch.main([run, "--out", str(tmp_path / ".pt")]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --out {tmp_path / '.pt'} has no file name before .pt: add "
                                               f"one, for example {tmp_path / 'model.pt'}.")
    # A suffix in capitals names the same format, as import_torch reads MODEL.SAFETENSORS (.PT was refused).
    for name, reader in (("MODEL.PT", torch.load), ("MODEL.SafeTensors", safetensors_torch.load_file)):
        assert export_torch.main([run, "--out", str(tmp_path / name)]) == 0, capsys.readouterr().err
        assert reader(str(tmp_path / name))


def test_the_notebook_functions_keep_existing_files_and_refuse_params_of_another_model(tmp_path):
    # write() replaced any file, a run's own included; checkpoint_dict() dropped a deeper model's extra layers.
    run = make_run(tmp_path / "run", "sps", 3)
    config, params, _ = runs.load_run(run)
    ckpt = export_torch.checkpoint_dict(config, params, STEP)
    out = tmp_path / "x.pt"
    out.write_bytes(b"precious")
    with pytest.raises(ValueError, match=r"^out .*x\.pt already exists: pass --force"):  # the argument, not --out
        export_torch.write(ckpt, str(out))
    assert out.read_bytes() == b"precious"
    with pytest.raises(ValueError, match=r"would write into the run"):
        export_torch.write(ckpt, str(tmp_path / "run" / "checkpoints" / "x.pt"), force=True)
    with pytest.raises(TypeError, match=r"^force must be True or False, got 'no'\.$"):
        export_torch.write(ckpt, str(out), force="no")
    export_torch.write(ckpt, out, force=True)
    assert out.read_bytes() != b"precious"
    shallower = sps_config.load_config("configs/tiny.py", SMALL_OVERRIDES + ["--config.model.num_layers=1"])
    with pytest.raises(ValueError, match=r"^params do not match config\.model"):
        export_torch.checkpoint_dict(shallower, params, STEP)
    for step, says in ((4.7, r"^step must be an integer"), (-3, r"^step=-3 must be 0 or more")):
        with pytest.raises((TypeError, ValueError), match=says):
            export_torch.checkpoint_dict(config, params, step)


def test_both_formats_get_the_file_mode_of_any_other_output(tmp_path):
    import stat
    run = make_run(tmp_path / "run", "sps", 3)
    (tmp_path / "plain.txt").write_text("x")  # what this process's umask gives a new file
    expected = stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode)
    for name in ("ckpt.pt", "ckpt.safetensors"):
        assert export_torch.main([run, "--out", str(tmp_path / name)]) == 0
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == expected, name


def test_an_output_that_cannot_be_written_is_refused_before_loading_and_long_names_work(tmp_path, capsys):
    # Refused before anything is loaded (the run need not exist): before, a file as the parent folder and a
    # name past the file system's limit failed after the weights loaded, the latter with a traceback.
    (tmp_path / "afile").write_text("x")
    for out, needle in [(tmp_path / "afile" / "e.pt", "which is a file, not a folder"),
                        (tmp_path / ("a" * 250 + ".safetensors"), "more than the 255 a file system allows")]:
        assert export_torch.main([str(tmp_path / "no-such-run"), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err
    # A name just under the limit is written: the partial file's longer name is shortened to fit.
    run = make_run(tmp_path / "run", "sps", 3)
    out = tmp_path / ("a" * 252 + ".pt")
    assert export_torch.main([run, "--out", str(out)]) == 0 and out.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["afile", "run", out.name])


def test_a_config_json_that_is_not_a_model_is_named_before_the_weights_load(tmp_path, capsys, monkeypatch):
    # As generate, evaluate and probes do: the sentence names the run's config.json, and no weights are read
    # for a model the file cannot describe (before, the checkpoint was restored first and the file went unnamed).
    run = make_run(tmp_path / "run", "sps", 3)
    path = tmp_path / "run" / "config.json"
    config = json.loads(path.read_text())
    config["model"]["seq_len"] = "abc"
    path.write_text(json.dumps(config))

    def no_restore(*args, **kwargs):
        raise AssertionError("the weights were loaded")
    monkeypatch.setattr(runs.checkpoint, "restore_params", no_restore)
    assert export_torch.main([run, "--out", str(tmp_path / "ckpt.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {path}: model.seq_len must be an integer of at least 1, got 'abc': put back the "
                   "config.json the run was trained with.\n"), err
    assert not (tmp_path / "ckpt.safetensors").exists()


def test_paths_may_be_pathlib_paths(tmp_path):
    # Notebooks build paths with pathlib: every path argument takes an os.PathLike as well as a str.
    run = make_run(tmp_path / "run", "sps", 3)
    export_torch.export_run(tmp_path / "run", tmp_path / "ckpt.safetensors")
    import_torch.import_checkpoint(tmp_path / "ckpt.safetensors", tmp_path / "back")
    assert_same_run(run, str(tmp_path / "back"))


def test_a_bfloat16_export_imports_as_the_rounded_weights_at_the_step_asked(tmp_path):
    run = make_run(tmp_path / "run", "sps", 3)
    export_torch.export_run(run, str(tmp_path / "ckpt.pt"), dtype="bfloat16")
    import_torch.import_checkpoint(str(tmp_path / "ckpt.pt"), str(tmp_path / "back"), step=STEP + 5)
    _, params, _ = runs.load_run(run)
    _, back, step = runs.load_run(str(tmp_path / "back"))
    assert step == STEP + 5  # --step wins over the file's iter_num
    rounded = jax.tree_util.tree_map(lambda a: torch.from_numpy(np.array(a)).to(torch.bfloat16).float().numpy(),
                                     params)
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(lambda a, b: np.array_equal(a, b), rounded, back))
    assert not jax.tree_util.tree_all(jax.tree_util.tree_map(lambda a, b: np.array_equal(a, b), params, back))


def test_an_export_imported_as_another_model_says_so_in_a_note(tmp_path):
    # The flags replaced the variant or window an exported run was trained as without a word (a file of the authors'
    # got a note); its weights then computed other logits than the exported run.
    run = make_run(tmp_path / "run", "sps", 3)
    export_torch.export_run(run, str(tmp_path / "ckpt.safetensors"))
    _, _, notes = import_torch.import_checkpoint(str(tmp_path / "ckpt.safetensors"), str(tmp_path / "same"))
    assert notes == []
    _, _, notes = import_torch.import_checkpoint(str(tmp_path / "ckpt.safetensors"), str(tmp_path / "standard"),
                                                 variant="standard", overrides=["model.rope_theta=500.0"])
    assert notes == ["the flags replace the rope_theta=10000.0, variant='sps', window=3 the exported run was trained "
                     "as with rope_theta=500.0, variant='standard', window=None: the imported model computes other "
                     "logits than the exported one"]


@pytest.mark.parametrize("args, name, kind", [((["run1", "run2"], "ckpt.pt"), "run", "list"),
                                              (("run", None), "out", "NoneType")])
def test_a_path_argument_that_is_not_one_path_is_one_sentence(tmp_path, args, name, kind):
    # Before: Python's "expected str, bytes or os.PathLike object, not list" from os.fspath.
    with pytest.raises(TypeError, match=not_one_path(name, kind)):
        export_torch.export_run(*(str(tmp_path / a) if isinstance(a, str) else a for a in args))
    assert not list(tmp_path.iterdir())


def test_a_safetensors_file_gets_the_mode_this_processs_umask_gives(tmp_path):
    # safetensors writes 0600; the export gives it 0666 less the umask, as every other output gets.
    import os
    import stat

    ckpt = {"model": {"w": np.zeros(2, np.float32)}, "model_args": {}, "iter_num": 0}
    old = os.umask(0o027)
    try:
        export_torch.write(ckpt, str(tmp_path / "ckpt.safetensors"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "ckpt.safetensors").stat().st_mode) == 0o640


def test_a_negative_step_is_refused(tmp_path):
    run = make_run(tmp_path / "run", "sps", 3)
    config, params, _ = runs.load_run(run)
    with pytest.raises(ValueError, match=r"^step=-1 must be 0 or more"):
        export_torch.checkpoint_dict(config, params, -1)
    assert export_torch.checkpoint_dict(config, params, 0)["iter_num"] == 0


def test_cli_a_run_that_is_not_there_is_refused_before_torch_loads(tmp_path):
    """Whether the writer's package is installed is asked without importing it: torch's import (seconds) came before
    the sentence that the run passed does not exist."""
    script = ("import sys\nfrom sps_jax import export_torch\n"
              f"status = export_torch.main([{str(tmp_path / 'missing')!r}, '--out', {str(tmp_path / 'y.pt')!r}])\n"
              "print('answered', status, 'torch' in sys.modules, 'jax' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.split() == ["answered", "2", "False", "False"], proc.stderr[-2000:]
    assert "missing' does not exist: pass a run folder" in proc.stderr, proc.stderr[-2000:]


def test_export_run_refuses_a_dtype_of_no_export_before_the_weights_load(tmp_path, monkeypatch):
    # The command's --dtype choices refuse it as it parses; a notebook's export_run loaded the run's weights first.
    run = make_run(tmp_path / "run", "sps", 3)
    monkeypatch.setattr(runs, "load_run", lambda *a, **k: pytest.fail("the weights were loaded"))
    with pytest.raises(ValueError) as refusal:
        export_torch.export_run(run, str(tmp_path / "ckpt.pt"), dtype="bf16")
    assert str(refusal.value) == "dtype 'bf16' (did you mean 'bfloat16'?) must be one of float32, bfloat16."
    assert not (tmp_path / "ckpt.pt").exists()
