"""The authors' PyTorch checkpoint layout imports to a run folder that computes the same logits as an
independent numpy forward of their state dict, in the paper's interleaved x0 rho0 x1 rho1 ... order; bad
files are one sentence, and an existing run is never overwritten without --force."""

import json
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch  # the test extra installs it: a missing torch fails here instead of skipping

from sps_jax import cli, config as sps_config, export_torch, import_torch, runs
from sps_jax.evaluation import evaluate
from tests import fuzz
from tests.helpers import run_module
from tests.torch_reference import allowed, numpy_forward
from tests.helpers import not_one_path

V, D, H, L, T = 64, 32, 2, 2, 12
EOS, PREDICT, PAD = 60, 61, 63
OVERRIDES = [f"--config.model.eos_id={EOS}", f"--config.model.predict_id={PREDICT}",
             f"--config.model.pad_id={PAD}", "--config.model.attention=xla", "--config.model.dtype=float32"]


def synthetic_state_dict(seed=0, compiled=True):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=0.3):
        return torch.randn(*shape, generator=g) * scale

    p = "_orig_mod." if compiled else ""
    sd = {p + "transformer.wte.weight": rnd(V, D, scale=1.0), p + "transformer.output_norm.weight": 1 + rnd(D)}
    for i in range(L):
        h = f"{p}transformer.h.{i}."
        sd.update({h + "attention_norm.weight": 1 + rnd(D), h + "attn.c_attn.weight": rnd(3 * D, D),
                   h + "attn.c_proj.weight": rnd(D, D), h + "mlp_norm.weight": 1 + rnd(D),
                   h + "mlp.gate_proj.weight": rnd(3 * D, D), h + "mlp.up_proj.weight": rnd(3 * D, D),
                   h + "mlp.down_proj.weight": rnd(D, 3 * D)})
    sd[p + "lm_head.weight"] = sd[p + "transformer.wte.weight"]
    return {k: v.contiguous() for k, v in sd.items()}


def authors_checkpoint(sd, window=1, target="modeling.models.sps.SPSModel", **changes):
    """The dict the authors' trainer saves: their model's config fields as model_args (a dataclass's asdict, so
    hidden_size and window_size, not n_embd or window), the optimizer's state, a step and the resolved config."""
    args = {"block_size": T, "vocab_size": V, "n_layer": L, "n_head": H, "hidden_size": D, "intermediate_size": 3 * D,
            "norm_eps": 1e-6, "dropout": 0.0, "bias": False, "eos_token_id": EOS, "pad_token_id": PAD,
            "predict_token_id": PREDICT, "window_size": window, "enable_triton_attention": True,
            "warp_specialize": False, **changes}
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))])
    optimizer.step()  # gives it per-parameter state tensors
    return {"model": sd, "optimizer": optimizer.state_dict(), "model_args": args, "iter_num": 4,
            "best_val_loss": torch.tensor(3.5), "last_save_tokens": 4 * T, "cpu_rng_state": torch.get_rng_state(),
            "wandb_run_id": "local_1", "config": {"model": {"_target_": target, "config": dict(args)}}}


def logits_match(run, sd, variant="sps", window=2, rope_theta=10000.0):
    net, params, step = runs.load_model(str(run))
    tokens = [5, 17, 3, 44, EOS, 9, 9, 12, 30, 2, 1, 58]
    ours = np.asarray(jax.jit(net.apply)({"params": params}, jnp.asarray([tokens], jnp.int32))[0])
    theirs = numpy_forward({k.replace("_orig_mod.", ""): v.numpy() for k, v in sd.items()}, tokens, variant, window,
                           H, PREDICT, EOS, PAD, rope_theta)
    np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=2e-4)
    return net, step


@pytest.mark.parametrize("variant,window", [("sps", 2), ("standard", None), ("reverse_sps", 1), ("delayed_state", 1),
                                            ("two_x_memory", None)])
def test_imported_checkpoint_gives_the_logits_of_the_original(tmp_path, variant, window):
    # Every variant of Sections 3-4 against the numpy forward of Appendix A's equations.
    sd = synthetic_state_dict()
    path = tmp_path / "ckpt.pt"
    torch.save({"model": sd, "model_args": {"n_head": H, "n_layer": L, "hidden_size": D, "block_size": T},
                "config": {"dataset": "fineweb-edu"}, "iter_num": 3}, path)
    rc = import_torch.main([str(path), "--variant", variant, "--window", str(window),
                            "--out", str(tmp_path / "run"), *OVERRIDES])
    assert rc == 0
    net, step = logits_match(tmp_path / "run", sd, variant, window)
    assert step == 3 and net.cfg.num_heads == H and net.cfg.seq_len == T and net.cfg.variant == variant


def test_the_authors_model_args_give_the_window_ids_and_norm_eps(tmp_path, capsys):
    # Their model_args are their config's fields: window_size, not window. The window was read from a key they
    # never write, so every file of theirs imported with window 64 (and the GPT-2 ids, outside this vocabulary).
    sd = synthetic_state_dict()
    path = tmp_path / "ckpt_tokens_4.pt"
    torch.save(authors_checkpoint(sd, window=1, norm_eps=1e-5), path)
    assert import_torch.main([str(path), "--variant", "sps", "--out", str(tmp_path / "run"),
                              "--config.model.attention=xla", "--config.model.dtype=float32"]) == 0
    assert "note:" not in capsys.readouterr().err
    m = runs.load_model(str(tmp_path / "run"))[0].cfg
    assert (m.window, m.eos_id, m.pad_id, m.predict_id, m.norm_eps) == (1, EOS, PAD, PREDICT, 1e-5)
    torch.save(authors_checkpoint(sd, window=1), path)
    assert import_torch.main([str(path), "--variant", "sps", "--out", str(tmp_path / "eps6"),
                              "--config.model.attention=xla", "--config.model.dtype=float32"]) == 0
    _, step = logits_match(tmp_path / "eps6", sd, "sps", 1)
    assert step == 4


def test_model_args_that_contradict_the_tensors_are_said_and_the_tensors_used(tmp_path, capsys):
    # hidden_size and n_layer of another model beside these tensors were ignored without a word.
    sd = synthetic_state_dict()
    path = tmp_path / "ckpt.pt"
    torch.save(authors_checkpoint(sd, window=1, hidden_size=2 * D, n_layer=L + 1), path)
    assert import_torch.main([str(path), "--out", str(tmp_path / "run"), "--config.model.attention=xla",
                              "--config.model.dtype=float32"]) == 0
    out = capsys.readouterr().err
    assert f"note: the checkpoint's model_args['hidden_size'] = {2 * D} contradicts its tensors, which have " \
           f"d_model={D}: the tensors are used" in out
    assert f"model_args['n_layer'] = {L + 1} contradicts its tensors, which have num_layers={L}" in out
    assert "intermediate_size" not in out  # the fields that agree are not named
    logits_match(tmp_path / "run", sd, "sps", 1)


def test_an_id_of_model_args_outside_the_vocabulary_says_what_to_set(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save(authors_checkpoint(synthetic_state_dict(), predict_token_id=V), path)
    outcome = fuzz.call(import_torch.main, [str(path), "--out", str(tmp_path / "run")])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr == f"error: model.predict_id={V} is outside the vocabulary of model.vocab_size={V}: set " \
        f"model.predict_id to an id below {V} (the value of the checkpoint's model_args['predict_token_id']; pass " \
        "--config.model.predict_id=VALUE to replace it).\n"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("iter_num,step", [(torch.tensor(7), 7), (torch.tensor(7, dtype=torch.int32), 7),
                                            (torch.tensor(7.0), None), (torch.tensor([7]), None), ("7", None),
                                            (-1, None), (2 ** 31, None), (2 ** 31 - 1, 2 ** 31 - 1)])
def test_a_step_saved_as_an_integer_scalar_is_read_and_anything_else_is_one_sentence(tmp_path, iter_num, step):
    # A 0-d integer tensor (as a trainer that saves its counter as a tensor writes it) was asked for --step.
    path = tmp_path / "ckpt.pt"
    torch.save({**authors_checkpoint(synthetic_state_dict(), window=1), "iter_num": iter_num}, path)
    outcome = fuzz.call(import_torch.main, [str(path), "--out", str(tmp_path / "run"), "--config.model.attention=xla",
                                            "--config.model.dtype=float32"])
    if step is None:
        assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
        assert ("is not a step: pass --step." in outcome.stderr or "iter_num 2147483648 is beyond 2147483647, the last "
                "step a run can reach (AdamW counts updates in int32): pass --step." in outcome.stderr)
        assert not (tmp_path / "run").exists()
    else:
        assert outcome.status == 0, outcome.stderr
        assert runs.load_model(str(tmp_path / "run"))[2] == step


@pytest.mark.parametrize("module,argv", [(import_torch, ["ckpt.pt", "--out", "run"]), (export_torch, ["run", "--out", "x.pt"]),
                                         (evaluate, ["--workdir", "run", "--val-data", "tokens"])])
def test_a_step_beyond_adamws_int32_count_is_refused_before_anything_is_read(tmp_path, module, argv, monkeypatch):
    # --step 99999999999999999999 was taken, and import_torch recorded it; no run reaches a step past 2**31 - 1.
    monkeypatch.chdir(tmp_path)
    outcome = fuzz.call(module.main, [*argv, "--step", "2147483648"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert ("argument --step: 2147483648 must be from 0 to 2147483647, the last step a run can reach (AdamW counts "
            "updates in int32)") in outcome.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("target,variant", [("modeling.models.full_attention_model.Model", "standard"),
                                            ("modeling.models.delayed_state.DelayedStateModel", "delayed_state"),
                                            ("modeling.models.reverse_sps.ReverseSPSModel", "reverse_sps")])
def test_the_model_class_their_config_names_gives_the_variant(tmp_path, target, variant):
    # Their trainer saves its resolved config, whose model._target_ is the class it built: no --variant is needed.
    sd = synthetic_state_dict()
    torch.save(authors_checkpoint(sd, window=1, target=target), tmp_path / "ckpt.pt")
    assert import_torch.main([str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "run"),
                              "--config.model.attention=xla", "--config.model.dtype=float32"]) == 0
    net, _ = logits_match(tmp_path / "run", sd, variant, None if variant == "standard" else 1)
    assert net.cfg.variant == variant


@pytest.mark.parametrize("variant", ["standard", "sps", "two_x_memory", "delayed_state", "reverse_sps"])
def test_an_authors_checkpoint_imported_exported_and_imported_again_keeps_their_tensors_bit_for_bit(tmp_path, variant):
    # Import -> export -> import: the exported file holds the authors' float32 tensors unchanged under their names,
    # and its import is the first import's run.
    sd = synthetic_state_dict(compiled=True)
    torch.save(authors_checkpoint(sd, window=2), tmp_path / "ckpt.pt")
    assert import_torch.main([str(tmp_path / "ckpt.pt"), "--variant", variant, "--out", str(tmp_path / "run"),
                              *OVERRIDES]) == 0
    export_torch.export_run(str(tmp_path / "run"), str(tmp_path / "back.pt"))
    back = torch.load(tmp_path / "back.pt", weights_only=True)["model"]
    assert set(back) == {k.removeprefix("_orig_mod.") for k in sd}
    for key, tensor in sd.items():
        assert back[key.removeprefix("_orig_mod.")].dtype == torch.float32
        assert torch.equal(back[key.removeprefix("_orig_mod.")], tensor), key
    import_torch.import_checkpoint(str(tmp_path / "back.pt"), str(tmp_path / "again"))
    (config, params, step), (config2, params2, step2) = runs.load_run(str(tmp_path / "run")), \
        runs.load_run(str(tmp_path / "again"))
    assert config.model.to_dict() == config2.model.to_dict() and step == step2 == 4
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(lambda a, b: np.array_equal(a, b), params, params2))


def test_a_variant_against_the_saved_model_class_is_said_and_an_unknown_class_needs_the_flag(tmp_path, capsys):
    torch.save(authors_checkpoint(synthetic_state_dict(), target="modeling.models.sps.SPSModel"), tmp_path / "a.pt")
    assert import_torch.main([str(tmp_path / "a.pt"), "--variant", "delayed_state", "--out", str(tmp_path / "r")]) == 0
    assert "note: --variant delayed_state replaces the sps model the checkpoint was trained as" in capsys.readouterr().err
    torch.save(authors_checkpoint(synthetic_state_dict(), target="mine.Model"), tmp_path / "b.pt")
    outcome = fuzz.call(import_torch.main, [str(tmp_path / "b.pt"), "--out", str(tmp_path / "s")])
    assert outcome.status == 2 and "its config names no model class of the authors'): pass --variant" in outcome.stderr


def test_a_file_without_a_window_says_which_window_it_used(tmp_path, capsys):
    args = {k: v for k, v in authors_checkpoint({})["model_args"].items() if k != "window_size"}
    torch.save({"model": synthetic_state_dict(), "model_args": args}, tmp_path / "ckpt.pt")
    assert import_torch.main([str(tmp_path / "ckpt.pt"), "--variant", "sps", "--out", str(tmp_path / "run")]) == 0
    assert "note: the checkpoint has no model_args['window_size']: using a window of 64 (pass --window" in \
        capsys.readouterr().err


def test_a_model_arg_of_the_wrong_type_is_one_sentence(tmp_path):
    torch.save(authors_checkpoint(synthetic_state_dict(), eos_token_id="50256"), tmp_path / "ckpt.pt")
    outcome = fuzz.call(import_torch.main, [str(tmp_path / "ckpt.pt"), "--variant", "sps", "--out", str(tmp_path / "r")])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "model_args['eos_token_id'] = '50256' is not of type int: pass --config.model.eos_id=VALUE" in outcome.stderr


@pytest.mark.parametrize("model_args, sentence, fix, field, value", [
    ({"eos_token_id": "50256"}, "model_args['eos_token_id'] = '50256' is not of type int: pass "
     "--config.model.eos_id=VALUE.", ["--config.model.eos_id=60"], "eos_id", 60),
    ({"window_size": "64"}, "model_args['window_size'] = '64' is not of type int: pass --window N.",
     ["--window", "8"], "window", 8),
    ({"window_size": -3}, "model_args['window_size'] = -3 is not a window (window must be an integer from 0 to",
     ["--window", "8"], "window", 8),
])
def test_the_fix_a_bad_model_arg_is_refused_with_imports_the_file(tmp_path, model_args, sentence, fix, field, value):
    """The sentence names the file's key and the flag that replaces it, and that flag does: the file's value is not
    read where a flag gives the field (it was, and the same sentence came back)."""
    torch.save(authors_checkpoint(synthetic_state_dict(), **model_args), tmp_path / "ckpt.pt")
    argv = [str(tmp_path / "ckpt.pt"), "--variant", "sps", "--out", str(tmp_path / "r")]
    outcome = fuzz.call(import_torch.main, argv)
    assert outcome.status == 2 and outcome.problem() is None and sentence in outcome.stderr, outcome.stderr
    outcome = fuzz.call(import_torch.main, argv + fix)
    assert outcome.status == 0, outcome.stderr
    assert json.loads((tmp_path / "r" / "config.json").read_text())["model"][field] == value


def rope_angles(base=10000.0, head_dim=D // H, positions=T, scale=1.0):
    """[positions, head_dim / 2] angles as their precompute_freqs_cis computes them (float32)."""
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    return torch.outer(torch.arange(positions).float() * scale, freqs)


def slot_mask(variant="sps", window=2, positions=T):
    """bool [N, N]: who sees whom over one document, from the numpy reference (no sps-jax code)."""
    return torch.from_numpy(allowed([5] * positions, variant, window, EOS, PAD))


def _buffers(sd):  # what other PyTorch models register beside their parameters: RoPE caches, masks, position ids
    angles = rope_angles()
    mask = slot_mask("sps", 2)
    return {**sd, "freqs_cis": torch.polar(torch.ones_like(angles), angles),
            "transformer.h.0.attn.rotary.inv_freq": angles[1].clone(),
            "transformer.h.0.attn.rotary.cos_cached": angles.repeat_interleave(2, -1).cos()[None, None],
            "transformer.h.1.attn.rotary.sin_cached": angles.sin(),
            "transformer.h.0.attn.bias": mask.float()[None, None], "transformer.h.1.attn.mask": mask,
            "transformer.h.1.attn.causal_mask": torch.zeros(2 * T, 2 * T).masked_fill(~mask, float("-inf")),
            "position_ids": torch.arange(T)[None], "transformer.h.0.attn.calls": torch.tensor(7)}


@pytest.mark.filterwarnings("error")  # a buffer's cast warned (complex to real discards the imaginary part)
@pytest.mark.parametrize("save", [
    lambda sd: sd,  # the state dict at the top level, with no "model" entry
    lambda sd: {"model": {k: v.half() for k, v in sd.items()}},
    lambda sd: {"model": {k: v.bfloat16() for k, v in sd.items()}},
    lambda sd: {"model": {k: v.t().contiguous().t() if v.ndim == 2 else v[::1] for k, v in sd.items()}},
    lambda sd: {"model": {**sd, "lm_head.weight": sd["transformer.wte.weight"].clone()}},  # untied but equal
    lambda sd: {"model": _buffers(sd)},
], ids=["top-level", "float16", "bfloat16", "non-contiguous", "untied-equal", "buffers"])
def test_real_world_variants_of_the_file_import_with_the_same_logits(tmp_path, save):
    sd = synthetic_state_dict(compiled=False)
    saved = save(sd)
    torch.save(saved, tmp_path / "ckpt.pt")
    outcome = fuzz.call(import_torch.main, [str(tmp_path / "ckpt.pt"), "--variant", "sps", "--window", "2",
                                            "--num-heads", str(H), "--seq-len", str(T), "--out", str(tmp_path / "run"),
                                            *OVERRIDES])
    # no note or warning: the one line on stderr says the run written
    assert outcome.status == 0 and outcome.stderr.startswith(f"wrote {tmp_path / 'run'}: sps (window 2), ") \
        and outcome.stderr.count("\n") == 1, outcome.stderr
    model = saved.get("model", saved)
    logits_match(tmp_path / "run", {k: model[k].float() for k in sd})  # the file's own (rounded) numbers


@pytest.mark.parametrize("change,needle", [
    (lambda sd: {"model": {**sd, "transformer.h.0.attn.c_attn.bias": torch.zeros(3 * D)}},
     "holds 1 parameter(s) this model has not, e.g. transformer.h.0.attn.c_attn.bias"),
    (lambda sd: {"model": {**sd, "transformer.wpe.weight": torch.zeros(T, D),
                           "transformer.h.1.mlp_norm.bias": torch.zeros(D)}},
     "holds 2 parameter(s) this model has not, e.g. transformer.wpe.weight, transformer.h.1.mlp_norm.bias"),
    (lambda sd: {"model": {"model." + k: v for k, v in sd.items()}},
     "no 'transformer.wte.weight' but 'model.transformer.wte.weight', a wrapper's prefix that the authors' trainer "
     "never writes; save the state dict again without 'model.'"),
    (lambda sd: {"model": {"module.module." + k: v for k, v in sd.items()}}, "without 'module.'"),
    (lambda sd: sd["transformer.wte.weight"], "a state dict with 'transformer.wte.weight', not a Tensor"),
], ids=["linear-bias", "positions-and-norm-bias", "other-prefix", "ddp-prefix-twice", "a-tensor"])
def test_files_whose_parameters_are_not_the_models_are_one_sentence(tmp_path, change, needle):
    # A bias or learned positions were dropped without a word, and the import computed other logits than the file.
    sd = synthetic_state_dict(compiled=False)
    message = bad_file_message(tmp_path, lambda p: torch.save(change(sd), p))
    assert needle in message, message


@pytest.mark.parametrize("prefix", ["module.", "module._orig_mod.", "_orig_mod.module."])
def test_a_state_dict_saved_from_a_ddp_wrapped_model_imports_with_a_note(tmp_path, capsys, prefix):
    # DistributedDataParallel puts module. before every key (before or after torch.compile's _orig_mod.): such a
    # file was refused, though its weights are the model's.
    sd = synthetic_state_dict(compiled=False)
    torch.save(authors_checkpoint({prefix + k: v for k, v in sd.items()}, window=2), tmp_path / "ckpt.pt")
    assert import_torch.main([str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "run"), *OVERRIDES]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "note: every key of the state dict starts with 'module.', the prefix of a " \
        "DistributedDataParallel wrapper, which the authors' trainer removes before saving: it is removed."
    assert len(err) == 2 and err[1].startswith(f"wrote {tmp_path / 'run'}: sps (window 2)")
    logits_match(tmp_path / "run", sd)


@pytest.mark.parametrize("prefix", ["", "_orig_mod.", "module.", "module._orig_mod."])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_a_safetensors_file_of_any_float_dtype_under_any_wrappers_prefix_imports_with_its_own_numbers_logits(
        tmp_path, dtype, prefix):
    # The .pt files above cover the dtypes unprefixed and the prefixes in float32; safetensors reads bfloat16 by
    # another path (no numpy dtype), and a compiled or DDP-wrapped model's keys keep their prefix there too.
    import safetensors.torch

    sd = {k: v.to(dtype) for k, v in synthetic_state_dict(compiled=False).items()}
    sd["lm_head.weight"] = sd["transformer.wte.weight"].clone()  # safetensors refuses tensors that share memory
    safetensors.torch.save_file({prefix + k: v for k, v in sd.items()}, str(tmp_path / "ckpt.safetensors"))
    assert import_torch.main([str(tmp_path / "ckpt.safetensors"), "--variant", "sps", "--window", "2", "--num-heads",
                              str(H), "--seq-len", str(T), "--out", str(tmp_path / "run"), *OVERRIDES]) == 0
    logits_match(tmp_path / "run", {k: v.float() for k, v in sd.items()})


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod."])
def test_a_wrapper_prefix_on_only_some_keys_is_one_sentence(tmp_path, prefix):
    # A partial _orig_mod. was removed key by key, so a key saved both ways kept one of its two tensors unsaid.
    sd = synthetic_state_dict(compiled=False)
    sd = {(prefix + k if ".h.1." in k else k): v for k, v in sd.items()}
    sd[prefix + "transformer.h.0.mlp_norm.weight"] = torch.zeros(D)
    message = bad_file_message(tmp_path, lambda p: torch.save({"model": sd}, p))
    assert message == f"error: 8 of the state dict's {len(sd)} keys start with {prefix!r} (e.g. " \
        f"'{prefix}transformer.h.0.mlp_norm.weight') and the others do not (e.g. 'lm_head.weight'): save the state " \
        "dict of the one model, with every key under the wrapper's prefix or none.\n", message


@pytest.mark.parametrize("buffers, sentence, fix", [
    ({"attn.rotary.cos_cached": rope_angles(500000.0).repeat_interleave(2, -1).cos()},
     "transformer.h.0.attn.rotary.cos_cached holds RoPE frequencies of base 500000, not the 10000 this import rotates "
     "with: pass --config.model.rope_theta=500000.", ["--config.model.rope_theta=500000"]),
    ({"attn.freqs_cis": torch.polar(torch.ones(T, 4), rope_angles(head_dim=8))},
     "transformer.h.0.attn.freqs_cis holds RoPE frequencies for heads of 8 features, not the 16 (d / heads) this "
     "import splits q and k into: pass --num-heads 4.", ["--num-heads", "4"]),
    ({"attn.rotary.inv_freq": rope_angles(1000.0, head_dim=8)[1]},
     "transformer.h.0.attn.rotary.inv_freq holds RoPE frequencies for heads of 8 features, not the 16 (d / heads) "
     "this import splits q and k into: pass --num-heads 4 and --config.model.rope_theta=1000.",
     ["--num-heads", "4", "--config.model.rope_theta=1000"]),
    ({"attn.rotary.sin_cached": rope_angles().repeat(1, 2).sin()},
     "transformer.h.0.attn.rotary.sin_cached holds RoPE angles for the rotate-half pairs (k, k + 8), not the "
     "interleaved pairs (2k, 2k+1) the authors' model and this one rotate, so its q and k weights are in another "
     "order: import a checkpoint of a model that rotates interleaved pairs.", None),
    ({"attn.rotary.cos_cached": rope_angles(scale=0.5).cos()},
     "transformer.h.0.attn.rotary.cos_cached is not a RoPE table of base 10000 over heads of 16 features, nor of "
     "another base or head width", None),
    ({"attn.bias": slot_mask("sps", 1).float()[None, None]},
     "transformer.h.0.attn.bias is the attention mask of sps with window 1, not of the sps with window 2 this import "
     "builds: pass --window 1.", ["--window", "1"]),
    ({"attn.mask": torch.ones(T, T).tril().bool()},
     "transformer.h.0.attn.mask is the attention mask of sps with no window, not of the sps with window 2 this import "
     "builds: pass --window none.", ["--window", "none"]),
    ({"attn.mask": slot_mask("delayed_state", 3)},
     "transformer.h.0.attn.mask is the attention mask of delayed_state with window 3, not of the sps with window 2 "
     "this import builds: pass --variant delayed_state --window 3.", ["--variant", "delayed_state", "--window", "3"]),
    ({"attn.bias": torch.ones(2 * T, 2 * T)},
     "transformer.h.0.attn.bias is an attention mask (24 x 24) of no variant and window this model has", None),
], ids=["cos-base", "freqs-cis-heads", "inv-freq-heads-and-base", "rotate-half", "scaled", "mask-window",
        "mask-no-window", "mask-variant", "mask-of-none"])
def test_a_buffer_that_disagrees_with_the_import_is_refused_naming_the_flag(tmp_path, buffers, sentence, fix):
    # A module that saves a RoPE table or a mask computes with the one it loads; these were left out unread, and the
    # import computed other logits than the saved model.
    sd = synthetic_state_dict(compiled=False)
    sd.update({f"transformer.h.{i}.{name}": tensor for name, tensor in buffers.items() for i in range(L)})
    torch.save(authors_checkpoint(sd, window=2), tmp_path / "ckpt.pt")
    argv = [str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "run"), *OVERRIDES]
    outcome = fuzz.call(import_torch.main, argv)
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.startswith(f"error: {sentence}"), outcome.stderr
    assert not (tmp_path / "run").exists()
    if fix:
        outcome = fuzz.call(import_torch.main, argv + fix)
        assert outcome.status == 0 and "error" not in outcome.stderr, outcome.stderr


def test_a_complex_rope_table_in_a_safetensors_file_is_read_as_complex(tmp_path):
    # Its numpy array was cast to float32 (the imaginary part dropped, with a ComplexWarning) and then read as a
    # table of sines that matched no RoPE.
    import safetensors.numpy

    sd = {k: v.numpy() for k, v in synthetic_state_dict(compiled=False).items()}
    sd["freqs_cis"] = np.exp(1j * rope_angles().numpy()).astype(np.complex64)
    args = authors_checkpoint({}, window=2)["model_args"]
    safetensors.numpy.save_file(sd, str(tmp_path / "ckpt.safetensors"), metadata={"model_args": json.dumps(args)})
    outcome = fuzz.call(import_torch.main, [str(tmp_path / "ckpt.safetensors"), "--variant", "sps", "--out",
                                            str(tmp_path / "run"), *OVERRIDES])
    assert outcome.status == 0 and outcome.stderr.startswith(f"wrote {tmp_path / 'run'}: ") \
        and outcome.stderr.count("\n") == 1, outcome.stderr  # no warning, no note


def test_a_mask_of_another_variant_names_it_for_a_standard_model(tmp_path):
    sd = synthetic_state_dict(compiled=False)
    sd["transformer.h.0.attn.bias"] = slot_mask("sps", 2).float()
    torch.save(authors_checkpoint(sd, target="modeling.models.full_attention_model.Model"), tmp_path / "ckpt.pt")
    outcome = fuzz.call(import_torch.main, [str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "run"), *OVERRIDES])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr == "error: transformer.h.0.attn.bias is the attention mask of sps with window 2, not of the " \
        "standard this import builds: pass --variant sps --window 2.\n", outcome.stderr
    sd["transformer.h.0.attn.bias"] = torch.ones(1, 1, T, T).tril()  # nanoGPT's causal bias: the standard model's
    torch.save(authors_checkpoint(sd, target="modeling.models.full_attention_model.Model"), tmp_path / "ckpt.pt")
    assert import_torch.main([str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "run"), *OVERRIDES]) == 0


def test_untrusted_pickles_are_refused_unless_the_user_opts_in(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    torch.save({"model": synthetic_state_dict(), "config": {"odd": np.dtype("float32").type}}, path)
    with pytest.raises(ValueError, match=r"pass trust_pickle=True only if you trust where the file came from\.$"):
        import_torch.load_torch_checkpoint(str(path))  # the argument; the command names its flag
    with monkeypatch.context() as inside:
        inside.setattr(cli, "_nesting", 1)  # as while a command's main runs
        with pytest.raises(ValueError, match=r"pass --trust-pickle only if you trust where the file came from\.$"):
            import_torch.load_torch_checkpoint(str(path))
    assert "model" in import_torch.load_torch_checkpoint(str(path), trust_pickle=True)


def test_cli_reports_a_file_that_is_not_a_checkpoint(tmp_path):
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    proc = run_module("sps_jax.import_torch", tmp_path / "other.pt", "--variant", "sps", "--out", tmp_path / "run")
    assert proc.returncode == 2 and "not an SPS PyTorch checkpoint" in proc.stderr


def test_a_state_dict_without_prefix_or_model_args_imports_with_the_heads_and_context_given(tmp_path, capsys):
    sd = synthetic_state_dict(compiled=False)  # no _orig_mod. prefix (not saved from torch.compile)
    path = tmp_path / "plain.pt"
    torch.save({"model": sd}, path)
    assert import_torch.main([str(path), "--variant", "sps", "--window", "2", "--out", str(tmp_path / "run"),
                              "--num-heads", str(H), "--seq-len", str(T), *OVERRIDES]) == 0
    net, _ = logits_match(tmp_path / "run", sd)
    assert (net.cfg.num_heads, net.cfg.seq_len) == (H, T) and "note:" not in capsys.readouterr().err
    # Without the flags the file says nothing of heads or context: the output says which defaults were used.
    assert import_torch.main([str(path), "--variant", "sps", "--window", "2", "--out", str(tmp_path / "guess"),
                              *OVERRIDES]) == 0
    out = capsys.readouterr().err
    assert "using d/64 = 1 heads (pass --num-heads" in out and "context of 4096 (pass --seq-len" in out
    assert runs.load_model(str(tmp_path / "guess"))[0].cfg.num_heads == 1  # d = 32: d/64 rounds up to one head


def test_heads_that_contradict_the_files_n_head_are_said(tmp_path, capsys):
    """Before, --num-heads silently replaced the file's n_head, and with it the width of every head."""
    path = tmp_path / "ckpt.pt"
    torch.save({"model": synthetic_state_dict(), "model_args": {"n_head": H, "block_size": T}}, path)
    assert import_torch.main([str(path), "--variant", "sps", "--window", "2", "--out", str(tmp_path / "run"),
                              "--num-heads", "4", *OVERRIDES]) == 0
    assert f"note: --num-heads 4 replaces the checkpoint's {H} heads: each head is {D // 4} wide instead of " \
           f"{D // H}" in capsys.readouterr().err
    assert runs.load_model(str(tmp_path / "run"))[0].cfg.num_heads == 4
    # A notebook's notes name import_checkpoint's argument, not the command's flag.
    notes = import_torch.import_checkpoint(str(path), str(tmp_path / "run2"), variant="sps", window=2, num_heads=4,
                                           overrides=OVERRIDES)[2]
    assert any(note.startswith(f"num_heads=4 replaces the checkpoint's {H} heads: ") for note in notes), notes


def test_an_existing_run_is_not_overwritten_without_force(tmp_path):
    sd = synthetic_state_dict()
    path = tmp_path / "ckpt.pt"
    torch.save({"model": sd, "model_args": {"n_head": H, "block_size": T}}, path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"model": {"d_model": 768}}')
    argv = [str(path), "--variant", "sps", "--window", "2", "--out", str(run), *OVERRIDES]
    outcome = fuzz.call(import_torch.main, argv)
    assert outcome.status == 2 and outcome.problem() is None and "--force" in outcome.stderr and str(run) in outcome.stderr
    assert os.listdir(run) == ["config.json"] and (run / "config.json").read_text() == '{"model": {"d_model": 768}}'
    assert import_torch.main(argv + ["--force"]) == 0
    logits_match(run, sd)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "run"]  # swapped in whole, nothing left beside it


def test_an_out_that_is_a_run_is_never_replaced_even_with_force(tmp_path):
    # --force swapped the import in over a trained run, its checkpoints and metrics deleted.
    sd = synthetic_state_dict()
    path = tmp_path / "ckpt.pt"
    torch.save({"model": sd, "model_args": {"n_head": H, "block_size": T}}, path)
    argv = [str(path), "--variant", "sps", "--window", "2", "--out", str(tmp_path / "run"), *OVERRIDES]
    assert import_torch.main(argv) == 0
    before = sorted(os.listdir(tmp_path / "run"))
    outcome = fuzz.call(import_torch.main, argv + ["--force"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr == f"error: --out {tmp_path / 'run'} is a run, which replacing it would delete: choose a new --out.\n"
    assert sorted(os.listdir(tmp_path / "run")) == before


@pytest.mark.parametrize("kind, sentence", [
    ("meta", "transformer.h.0.attn.c_attn.weight is a meta tensor, which holds no values (saved from a model whose "
             "weights were never loaded): save the checkpoint from the model with its weights."),
    ("sparse", "transformer.h.0.attn.c_attn.weight is stored as torch.sparse_coo, not as a dense tensor: save the "
               "state dict with dense tensors (tensor.to_dense())."),
])
def test_a_weight_saved_as_a_meta_or_sparse_tensor_is_one_sentence(tmp_path, kind, sentence):
    # torch's own NotImplementedError ("Cannot copy out of meta tensor") or TypeError escaped as a traceback.
    sd = synthetic_state_dict(compiled=False)
    key = "transformer.h.0.attn.c_attn.weight"
    sd[key] = sd[key].to("meta") if kind == "meta" else sd[key].to_sparse()
    message = bad_file_message(tmp_path, lambda p: torch.save({"model": sd}, p))
    assert message == f"error: {sentence}\n", message


def bad_file_message(tmp_path, write):
    path = tmp_path / "bad.pt"
    write(path)
    outcome = fuzz.call(import_torch.main, [str(path), "--variant", "sps", "--out", str(tmp_path / "run"), *OVERRIDES])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert not (tmp_path / "run").exists()
    return outcome.stderr


def test_files_that_are_not_checkpoints_are_one_sentence(tmp_path):
    # Fixed junk: random bytes opened with pickle's PROTO opcode (0x80) one time in 256 and were read as a pickle.
    junk = bytes((7 * i + 1) % 256 for i in range(512))
    assert "bad.pt is not a PyTorch checkpoint" in bad_file_message(tmp_path, lambda p: p.write_bytes(junk))
    message = bad_file_message(tmp_path, lambda p: p.write_text("hello\n"))
    assert re.fullmatch(r"error: \S+bad\.pt is not a PyTorch checkpoint that torch\.load can read \(\w+[^()]*\): pass "
                        r"a file saved with torch\.save, or a \.safetensors export\.\n", message), message
    header = b'{"__metadata__":{}}'
    # torch's refusal was cut mid-word after 120 characters of advice about weights_only.
    message = bad_file_message(tmp_path, lambda p: p.write_bytes(len(header).to_bytes(8, "little") + header))
    assert message.endswith("bad.pt is a safetensors file: rename it to end in .safetensors, which this command reads "
                            "with safetensors.\n"), message
    # The other way round, safetensors' "header too large" named no fix.
    renamed = tmp_path / "renamed.safetensors"
    torch.save({"model": synthetic_state_dict()}, renamed)
    outcome = fuzz.call(import_torch.main, [str(renamed), "--variant", "sps", "--out", str(tmp_path / "r"), *OVERRIDES])
    assert outcome.status == 2 and outcome.stderr.endswith(
        "renamed.safetensors is a PyTorch checkpoint (torch.save's): rename it to end in .pt, which this command reads "
        "with torch.\n"), outcome.stderr
    sd = synthetic_state_dict()
    del sd["_orig_mod.transformer.h.1.mlp.up_proj.weight"]
    message = bad_file_message(tmp_path, lambda p: torch.save({"model": sd}, p))
    assert "lacks 1 tensor(s)" in message and "transformer.h.1.mlp.up_proj.weight" in message


def test_cli_a_state_dict_of_no_blocks_or_a_damaged_stored_config_says_what_to_do(tmp_path):
    # These said what was wrong and stopped: "layer indices [] of the state dict are not 0..L-1 (L >= 1).", "the
    # checkpoint's sps_jax_config is not JSON (...)." and "... is not a run config: it is list, not an object."
    sd = {k: v for k, v in synthetic_state_dict().items() if ".h." not in k}
    message = bad_file_message(tmp_path, lambda p: torch.save({"model": sd}, p))
    assert message.endswith("error: the state dict's blocks (transformer.h.<i>.*) are numbered none, not 0 to L - 1 for "
                            "some L of at least 1: it is not a complete SPS checkpoint; pass one.\n"), message
    for stored, says in (("{not json", "is not JSON (JSONDecodeError: "), ("[]", "is not a run config: it is list")):
        message = bad_file_message(tmp_path, lambda p: torch.save({"model": synthetic_state_dict(),
                                                                   "sps_jax_config": stored}, p))
        assert f"error: the checkpoint's sps_jax_config {says}" in message and message.endswith(
            "; export the run again.\n" if "list" in says else "): export the run again.\n"), message


def test_a_tensor_of_the_wrong_shape_names_the_parameter_and_both_shapes(tmp_path):
    sd = synthetic_state_dict()
    sd["_orig_mod.transformer.h.0.attn.c_attn.weight"] = torch.zeros(2 * D, D)
    message = bad_file_message(tmp_path, lambda p: torch.save({"model": sd}, p))
    assert f"transformer.h.0.attn.c_attn.weight has shape ({2 * D}, {D})" in message
    assert f"needs ({3 * D}, {D})" in message


@pytest.mark.parametrize("key", ["h.0.mlp.up_proj", "h.0.mlp.gate_proj", "h.1.mlp.down_proj"])
def test_one_mlp_tensor_of_another_width_is_the_one_named(tmp_path, key):
    # d_ff was read from layer 0's up_proj alone: a wrong up_proj made its correct gate_proj the one blamed.
    sd = synthetic_state_dict()
    shape = (D, 100) if "down" in key else (100, D)
    sd[f"_orig_mod.transformer.{key}.weight"] = torch.zeros(*shape)
    message = bad_file_message(tmp_path, lambda p: torch.save({"model": sd}, p))
    assert message.startswith(f"error: transformer.{key}.weight has shape {shape} but the model (d={D}, d_ff={3 * D},")


def test_a_missing_package_names_its_extra(tmp_path, monkeypatch):
    torch.save({"model": synthetic_state_dict()}, tmp_path / "ckpt.pt")
    # A safetensors file's start (its header's length, then the header): one that starts otherwise is refused as such.
    (tmp_path / "ckpt.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now fails
    monkeypatch.setitem(sys.modules, "safetensors", None)
    for name, extra in (("ckpt.pt", ".[torch]"), ("ckpt.safetensors", ".[safetensors]")):
        argv = [str(tmp_path / name), "--variant", "sps", "--out", str(tmp_path / "run")]
        outcome = fuzz.call(import_torch.main, argv)
        assert outcome.status == 2 and outcome.problem() is None and f"pip install -e '{extra}'" in outcome.stderr


def test_a_safetensors_file_of_float8_weights_is_one_sentence_naming_the_tensor_and_its_dtype(tmp_path):
    # safetensors reads float8 into no numpy array: a file it had written whole was said as "not a safetensors file
    # that safetensors can read (AttributeError: module 'numpy' has no attribute 'float8_e5m2')".
    from safetensors.torch import save_file

    sd = {k: v.clone() for k, v in synthetic_state_dict(compiled=False).items()}  # the tied head, a tensor of its own
    sd["transformer.h.0.mlp.up_proj.weight"] = sd["transformer.h.0.mlp.up_proj.weight"].to(torch.float8_e5m2)
    path = tmp_path / "ckpt.safetensors"
    save_file(sd, str(path), metadata={"model_args": json.dumps(authors_checkpoint({}, window=2)["model_args"])})
    _refused_with_nothing_written(path, f"{path} holds transformer.h.0.mlp.up_proj.weight in float8 (F8_E5M2), which "
                                  "safetensors cannot read without torch: save its weights as float32, bfloat16 or "
                                  "float16, or pass the checkpoint as a .pt file.")


def _refused_with_nothing_written(path, sentence):
    """import_torch of the file ``path`` as SPS (the tests' ids) says ``sentence`` alone, with status 2 and no run."""
    run = path.parent / "run"
    outcome = fuzz.call(import_torch.main, [str(path), "--variant", "sps", "--out", str(run), *OVERRIDES])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr == f"error: {sentence}\n"
    assert not run.exists()


def test_a_damaged_safetensors_file_is_one_sentence(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(b"\x80\x00" + np.random.default_rng(0).bytes(510))  # a pickle's first byte, no protocol
    outcome = fuzz.call(import_torch.main, [str(path), "--out", str(tmp_path / "run")])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "bad.safetensors is not a safetensors file" in outcome.stderr and not (tmp_path / "run").exists()


def test_the_working_directory_is_never_the_imported_run_even_with_force(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    torch.save({"model": synthetic_state_dict(), "model_args": {"n_head": H, "block_size": T}}, path)
    monkeypatch.chdir(tmp_path)
    for out in ("", "."):
        outcome = fuzz.call(import_torch.main, [str(path), "--variant", "sps", "--out", out, "--force", *OVERRIDES])
        assert outcome.status == 2 and outcome.problem() is None and "--out" in outcome.stderr, outcome.stderr
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]


def test_a_runs_checkpoints_are_never_the_imported_run_even_with_force(tmp_path):
    # --out RUN/checkpoints --force swapped the imported run in for every checkpoint of that run.
    path = tmp_path / "ckpt.pt"
    torch.save({"model": synthetic_state_dict(), "model_args": {"n_head": H, "block_size": T}}, path)
    run = tmp_path / "run"
    (run / "checkpoints" / "5").mkdir(parents=True)
    (run / "config.json").write_text('{"model": {"d_model": 768}}')
    for out in (run / "checkpoints", run / "checkpoints" / "5", run / "checkpoints" / "new"):
        outcome = fuzz.call(import_torch.main, [str(path), "--variant", "sps", "--out", str(out), "--force", *OVERRIDES])
        assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
        assert f"--out {out} would write into the run {run}'s own files" in outcome.stderr, outcome.stderr
    assert os.listdir(run / "checkpoints") == ["5"] and os.listdir(run / "checkpoints" / "5") == []


def test_an_override_out_of_range_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save({"model": synthetic_state_dict(), "model_args": {"n_head": H, "block_size": T}}, path)
    outcome = fuzz.call(import_torch.main, [str(path), "--variant", "sps", "--out", str(tmp_path / "run"), *OVERRIDES,
                                            "--config.train.micro_batch=0"])
    assert outcome.status == 2 and "train.micro_batch=0" in outcome.stderr, outcome.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, says", [("--config.data.dir=~/x", "data.dir='~/x'"),
                                            ("--config.name=", r"name='' must name the run")])
def test_a_name_or_path_train_would_refuse_is_refused_before_the_file_loads(tmp_path, monkeypatch, override, says):
    # The imported run's config.json held data.dir='~/x' (no shell expands it) or an empty name, which train refuses.
    monkeypatch.setattr(import_torch, "import_checkpoint", lambda *a, **k: pytest.fail("the checkpoint was read"))
    outcome = fuzz.call(import_torch.main, [str(tmp_path / "missing.pt"), "--variant", "sps", "--out",
                                            str(tmp_path / "run"), override])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert re.search(says, outcome.stderr), outcome.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, says", [
    ("--config.model.param_dtype=fp16", "model.param_dtype must be one of ['bfloat16', 'float16', 'float32'], got 'fp16'"),
    ("--config.model.dtype=bf16", "model.dtype must be one of"),
    ("--config.model.residual_dtype=f32", "model.residual_dtype must be one of"),
    ("--config.model.attention=flash", "unknown attention backend 'flash'"),
])
def test_a_dtype_or_attention_of_no_model_is_refused_before_the_file_loads(tmp_path, monkeypatch, override, says):
    # These name no size the file decides, yet were said only once the whole checkpoint was loaded and converted.
    monkeypatch.setattr(import_torch, "import_checkpoint", lambda *a, **k: pytest.fail("the checkpoint was read"))
    outcome = fuzz.call(import_torch.main, [str(tmp_path / "missing.pt"), "--variant", "sps", "--out",
                                            str(tmp_path / "run"), override])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert says in outcome.stderr, outcome.stderr
    assert not (tmp_path / "run").exists()


def test_a_window_beyond_int32_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save({"model": synthetic_state_dict(), "model_args": {"n_head": H, "block_size": T}}, path)
    outcome = fuzz.call(import_torch.main, [str(path), "--variant", "sps", "--window", "4611686018427387904",
                                            "--out", str(tmp_path / "run"), *OVERRIDES])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "window '4611686018427387904' must be an integer from 0 to 2147483647" in outcome.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("field,value,has", [("num_layers", 3, L), ("d_model", 2 * D, D), ("d_ff", 4 * D, 3 * D),
                                             ("vocab_size", 2 * V, V)])
def test_an_override_that_contradicts_the_tensors_names_the_field_and_the_file(tmp_path, field, value, has):
    # The shapes come from the tensors; blaming "the run folder's config" would point at a file the user never wrote.
    path = tmp_path / "ckpt.pt"
    torch.save({"model": synthetic_state_dict(), "model_args": {"n_head": H, "block_size": T}}, path)
    outcome = fuzz.call(import_torch.main, [str(path), "--variant", "sps", "--out", str(tmp_path / "run"), *OVERRIDES,
                                            f"--config.model.{field}={value}"])
    assert outcome.status == 2 and outcome.problem() is None, outcome
    assert f"--config.model.{field}={value}" in outcome.stderr and f"{has}" in outcome.stderr, outcome.stderr
    assert "run folder" not in outcome.stderr, outcome.stderr
    assert not (tmp_path / "run").exists()


def export_with_stored_config(tmp_path, edit, sd, name=None):
    """An exported .pt of ``sd`` whose stored run config (the tiny config at this file's sizes, window 2; named
    ``name`` when given) was changed by hand: ``edit`` changes its model section in place."""
    config = sps_config.load_config("configs/tiny.py", OVERRIDES)
    config.model.update(num_layers=L, d_model=D, d_ff=3 * D, vocab_size=V, num_heads=H, seq_len=T, window=2)
    stored = json.loads(config.to_json())
    stored["name"] = name or stored["name"]
    edit(stored["model"])
    path = tmp_path / "edited.pt"
    torch.save({"model": sd, "model_args": {"n_head": H, "block_size": T}, "sps_jax_config": json.dumps(stored)}, path)
    return path


def test_model_args_that_disagree_with_the_stored_config_are_said_with_the_value_used(tmp_path):
    # An exported file edited by hand: the stored config's window and norm_eps were used and model_args' n_head won,
    # each without a word.
    sd = synthetic_state_dict()
    path = export_with_stored_config(tmp_path, lambda model: None, sd)
    saved = torch.load(path, weights_only=False)
    saved["model_args"].update(n_head=1, window_size=16, norm_eps=1e-5)
    torch.save(saved, path)
    outcome = fuzz.call(import_torch.main, [str(path), "--out", str(tmp_path / "run")])
    assert outcome.status == 0 and outcome.problem() is None, outcome.stderr
    notes = [line for line in outcome.stderr.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: the checkpoint's model_args['norm_eps'] = 1e-05 disagrees with its stored config's model.norm_eps = "
        "1e-06: the stored config's value is used.",
        f"note: the checkpoint's model_args['n_head'] = 1 disagrees with its stored config's model.num_heads = {H}: "
        "the model_args value is used.",
        "note: the checkpoint's model_args['window_size'] = 16 disagrees with its stored config's model.window = 2: the "
        "stored config's value is used."]
    m = runs.load_model(str(tmp_path / "run"))[0].cfg
    assert (m.num_heads, m.norm_eps, m.window) == (1, 1e-6, 2)


def test_a_window_given_to_a_variant_without_one_is_said_to_be_dropped(tmp_path):
    sd = synthetic_state_dict()
    path = tmp_path / "ckpt.pt"
    torch.save(authors_checkpoint(sd), path)
    outcome = fuzz.call(import_torch.main, [str(path), "--variant", "standard", "--window", "16", "--out",
                                            str(tmp_path / "run"), *OVERRIDES[3:]])
    assert outcome.status == 0 and outcome.problem() is None, outcome.stderr
    assert "note: --window 16 is dropped: standard has no windowed stream." in outcome.stderr.splitlines()
    assert runs.load_model(str(tmp_path / "run"))[0].cfg.window is None


@pytest.mark.parametrize("field,value", [("seq_len", "abc"), ("num_heads", "2"), ("d_model", 32.0),
                                         ("num_layers", None)])
def test_a_stored_config_whose_sizes_are_not_integers_is_one_sentence(tmp_path, field, value):
    # An exported file's config edited by hand: the import sets these fields to integers over it, which
    # ConfigDict refused with a TypeError traceback when the stored value was a string or a float.
    path = export_with_stored_config(tmp_path, lambda model: model.update({field: value}), synthetic_state_dict())
    outcome = fuzz.call(import_torch.main, [str(path), "--out", str(tmp_path / "run")])
    if value is None:  # a missing size is filled from the tensors and model_args
        assert outcome.status == 0, outcome.stderr
        return
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert f"model.{field} is {value!r}, not a positive integer" in outcome.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("edit, says", [
    (lambda model: model.update(window=-3), "window must be an integer from 0 to 2147483647 or None (unbounded), got "
                                            "-3"),
    (lambda model: model.update(norm_eps=-1.0), "norm_eps"),
])
def test_a_stored_config_of_no_valid_model_names_the_file_and_the_fix(tmp_path, edit, says):
    # It said only "window must be an integer from 0 to 2147483647 or None (unbounded), got -3.": not that the
    # checkpoint's stored config said so, nor what to do.
    path = export_with_stored_config(tmp_path, edit, synthetic_state_dict())
    outcome = fuzz.call(import_torch.main, [str(path), "--out", str(tmp_path / "run")])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    line = outcome.stderr.strip()
    assert line.startswith("error: the checkpoint's stored config (sps_jax_config) is not a valid run config (")
    assert says in line and line.endswith("): replace that value with --window N or a --config override, or export "
                                          "the run again."), line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags, sentence", [
    (["--config.train.peak_lr=-1"], "error: train.peak_lr=-1.0 must be a finite number of at least 0.\n"),
    # It was "d_model=32 must split into num_heads=3 heads of even size (RoPE pairs).": no flag named, nothing to do.
    (["--num-heads", "3"], "error: --num-heads 3 does not split the checkpoint's width d=32 into heads of even size "
                           "(RoPE pairs): pass one that does, such as 1 (heads 32 wide).\n"),
])
def test_a_bad_flag_over_a_valid_stored_config_is_the_flags_sentence(tmp_path, flags, sentence):
    # The stored config's sentence took the blame for the user's own flag.
    path = export_with_stored_config(tmp_path, lambda model: None, synthetic_state_dict())
    outcome = fuzz.call(import_torch.main, [str(path), "--out", str(tmp_path / "run"), *flags])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr == sentence


@pytest.mark.parametrize("heads", [3, 32])
def test_a_head_count_of_the_file_that_does_not_split_its_width_names_the_key_and_the_flag(tmp_path, heads):
    # 3 heads do not divide d=32, and 32 heads are 1 wide, which holds no RoPE pair: both were "d_model=32 must split
    # into num_heads=... heads of even size (RoPE pairs).", which named neither the file's key nor --num-heads.
    path = tmp_path / "ckpt.pt"
    torch.save(authors_checkpoint(synthetic_state_dict(), window=1, n_head=heads), path)
    _refused_with_nothing_written(path, f"the checkpoint's model_args['n_head'] = {heads} does not split its width "
                                  "d=32 into heads of even size (RoPE pairs): pass --num-heads with a count that does, "
                                  "such as 1 (heads 32 wide).")


def test_a_notebooks_head_count_that_does_not_split_the_width_is_named_as_its_argument(tmp_path):
    # import_checkpoint(num_heads=3) was told "--num-heads 3 does not split ...", a flag it never passed.
    path = export_with_stored_config(tmp_path, lambda model: None, synthetic_state_dict())
    with pytest.raises(ValueError) as e:
        import_torch.import_checkpoint(str(path), str(tmp_path / "run"), num_heads=3)
    assert str(e.value) == ("num_heads=3 does not split the checkpoint's width d=32 into heads of even size (RoPE "
                            "pairs): pass one that does, such as 1 (heads 32 wide).")
    assert not (tmp_path / "run").exists()


def test_a_metrics_setting_train_would_refuse_is_refused_at_the_import(tmp_path):
    # --config.metrics.wandb_mode=bogus was written into the imported run's config.json, which train then refused.
    sd = synthetic_state_dict()
    path = tmp_path / "ckpt.pt"
    torch.save(authors_checkpoint(sd, window=1), path)
    outcome = fuzz.call(import_torch.main, [str(path), "--variant", "sps", "--out", str(tmp_path / "run"),
                                            *OVERRIDES, "--config.metrics.wandb_mode=bogus"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "metrics.wandb_mode='bogus' must be one of online, offline, disabled" in outcome.stderr, outcome.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("variant,window", [(5, 2), ("sps", "2"), (None, 2)])
def test_the_variant_and_window_flags_replace_a_stored_config_of_another_type(tmp_path, variant, window):
    # --variant and --window win over a hand-edited stored config; replacing a value of another type
    # (variant 5, window "2", variant null) was ConfigDict's TypeError traceback.
    sd = synthetic_state_dict()
    path = export_with_stored_config(tmp_path, lambda model: model.update(variant=variant, window=window), sd)
    outcome = fuzz.call(import_torch.main, [str(path), "--out", str(tmp_path / "run"), "--variant", "sps",
                                            "--window", "2"])
    assert outcome.status == 0 and outcome.problem() is None, outcome.stderr
    logits_match(tmp_path / "run", sd, "sps", 2)


def test_cli_import_prints_nothing_and_says_the_run_it_wrote_on_stderr(tmp_path):
    # stdout holds a command's results alone (what a pipe reads); the folder a command wrote is said on stderr.
    path = export_with_stored_config(tmp_path, lambda model: None, synthetic_state_dict())
    outcome = fuzz.call(import_torch.main, [str(path), "--out", str(tmp_path / "run")])
    assert outcome.status == 0 and outcome.problem() is None, outcome.stderr
    assert outcome.stdout == "" and f"wrote {tmp_path / 'run'}: sps (window 2), {L} layers, d={D}, " in outcome.stderr


@pytest.mark.parametrize("name, imported", [("tiny-sps-w2", "tiny-standard"), ("mine", "mine")])
def test_a_name_made_from_the_variant_follows_the_variant_flag_and_a_name_of_its_own_stays(tmp_path, name, imported):
    # The run imported as standard kept the name tiny-sps-w2, which evaluate then printed and wrote as its run.
    path = export_with_stored_config(tmp_path, lambda model: None, synthetic_state_dict(), name=name)
    outcome = fuzz.call(import_torch.main, [str(path), "--out", str(tmp_path / "run"), "--variant", "standard"])
    assert outcome.status == 0 and outcome.problem() is None, outcome.stderr
    assert runs.read_config(str(tmp_path / "run")).name == imported


def test_a_stored_config_that_leaves_the_variant_to_the_default_imports_and_says_so(tmp_path):
    # A run of a user's config may leave model.variant to ModelConfig's default; the import wrote the run and then
    # failed on its closing line (AttributeError), leaving status 1 after a complete run folder.
    sd = synthetic_state_dict()
    path = export_with_stored_config(tmp_path, lambda model: model.pop("variant"), sd)
    outcome = fuzz.call(import_torch.main, [str(path), "--out", str(tmp_path / "run")])
    assert outcome.status == 0 and outcome.problem() is None, outcome.stderr
    assert "sps (window 2)" in outcome.stderr
    logits_match(tmp_path / "run", sd, "sps", 2)


@pytest.mark.parametrize("key", ["transformer.wte.weight", "transformer.h.1.mlp.down_proj.weight"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weights_that_are_not_finite_are_refused_naming_the_tensor(tmp_path, key, value):
    # They imported without a word; evaluation then wrote val_nll null and generation argmaxed NaN logits.
    sd = synthetic_state_dict()
    sd["_orig_mod." + key][1, :3] = value  # the tied lm_head is the same tensor
    message = bad_file_message(tmp_path, lambda p: torch.save({"model": sd}, p))
    assert message == (f"error: {key} holds NaN or infinite values: the model diverged or the file is damaged; "
                       "import a checkpoint of finite weights.\n")


@pytest.mark.parametrize("dtype, value, largest, wider", [
    ("float16", -70000.0, "65504", "bfloat16 (float32's range) or float32"),
    ("bfloat16", 3.4e38, "3.38953e+38", "float32"),
])
def test_a_weight_beyond_the_stored_dtypes_range_is_refused_naming_it_and_a_wider_dtype(tmp_path, dtype, value,
                                                                                          largest, wider):
    # --config.model.param_dtype=float16 cast 70000 to inf, which was then refused as "NaN or infinite values" of a
    # parameter: the file's weights are finite, and the way out is another dtype.
    sd = synthetic_state_dict()
    sd["_orig_mod.transformer.h.1.mlp.down_proj.weight"][0, :2] = torch.tensor([value, 65504.0])
    path = tmp_path / "ckpt.pt"
    torch.save(authors_checkpoint(sd, window=1), path)
    stored = [str(path), "--variant", "sps", "--config.model.attention=xla", f"--config.model.param_dtype={dtype}"]
    outcome = fuzz.call(import_torch.main, [*stored, "--out", str(tmp_path / "run")])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr == (f"error: transformer.h.1.mlp.down_proj.weight holds values beyond {dtype}'s range "
                              f"({value:g}; {dtype} holds magnitudes up to {largest}), the dtype model.param_dtype "
                              f"stores the weights in: pass --config.model.param_dtype={wider}.\n")
    assert not (tmp_path / "run").exists()


def test_a_weight_of_float16s_largest_magnitude_imports_as_float16(tmp_path):
    sd = synthetic_state_dict()
    sd["_orig_mod.transformer.h.1.mlp.down_proj.weight"][0, :2] = torch.tensor([-65504.0, 65519.0])  # 65519 rounds down
    torch.save(authors_checkpoint(sd, window=1), tmp_path / "ckpt.pt")
    assert import_torch.main([str(tmp_path / "ckpt.pt"), "--variant", "sps", "--out", str(tmp_path / "run"),
                              "--config.model.attention=xla", "--config.model.param_dtype=float16"]) == 0
    _, params, _ = runs.load_model(str(tmp_path / "run"))
    assert np.asarray(params["block_1"]["mlp"]["down"], np.float32)[:2, 0].tolist() == [-65504.0, 65504.0]  # [in, out]


def test_a_weight_that_is_not_floating_point_is_named_as_such(tmp_path):
    # It was dropped as a buffer and then reported as a tensor the state dict lacks.
    sd = synthetic_state_dict()
    sd["_orig_mod.transformer.output_norm.weight"] = torch.ones(D, dtype=torch.int64)
    message = bad_file_message(tmp_path, lambda p: torch.save({"model": sd}, p))
    assert message == ("error: transformer.output_norm.weight holds torch.int64 values, not floating-point weights: "
                       "the file was not saved from the model's parameters.\n")
    sd["_orig_mod.transformer.output_norm.weight"] = None  # not a tensor at all (found by the fuzzer)
    message = bad_file_message(tmp_path, lambda p: torch.save({"model": sd}, p))
    assert message == ("error: transformer.output_norm.weight holds a NoneType, not floating-point weights: the file "
                       "was not saved from the model's parameters.\n")


@pytest.mark.parametrize("args, name, kind", [((["a.pt", "b.pt"], "out"), "path", "list"), (("a.pt", 3), "out", "int")])
def test_a_path_argument_that_is_not_one_path_is_one_sentence(tmp_path, args, name, kind):
    # Before: Python's "expected str, bytes or os.PathLike object, not list" from os.fspath.
    with pytest.raises(TypeError, match=not_one_path(name, kind)):
        import_torch.import_checkpoint(*(str(tmp_path / a) if isinstance(a, str) else a for a in args))
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("depth", [0, 2])
def test_an_out_holding_the_checkpoint_file_is_refused_even_with_force(tmp_path, depth):
    # --out DIR --force, DIR holding the .pt being imported: the run replaced DIR, and the checkpoint was deleted.
    out = tmp_path / "imported"
    folder = out.joinpath(*["d"] * depth)
    folder.mkdir(parents=True)
    path = folder / "ckpt.pt"
    torch.save({"model": synthetic_state_dict(), "model_args": {"n_head": H, "block_size": T}}, path)
    outcome = fuzz.call(import_torch.main, [str(path), "--variant", "sps", "--out", str(out), "--force", *OVERRIDES])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip() == (
        f"error: --out {out} holds the checkpoint {path}, which this command reads and replacing the folder would "
        "delete: choose another --out (--force replaces earlier results, never an input).")
    assert path.is_file()


def test_an_lm_head_that_differs_from_the_embedding_is_refused(tmp_path):
    # This model ties them: the import would score with the embedding and drop the file's own unembedding.
    sd = synthetic_state_dict(compiled=False)
    sd["lm_head.weight"] = sd["transformer.wte.weight"] + 0.01
    message = bad_file_message(tmp_path, lambda p: torch.save({"model": sd}, p))
    assert ("lm_head.weight differs from transformer.wte.weight, and this project ties them (the file's own "
            "unembedding would be dropped): pass a checkpoint of a model with tied embeddings.\n") in message


def test_an_mlp_width_other_than_three_times_d_is_read_from_the_tensors(tmp_path):
    sd = synthetic_state_dict(compiled=False)
    g = torch.Generator().manual_seed(1)
    for i in range(L):
        h = f"transformer.h.{i}.mlp."
        sd.update({h + "gate_proj.weight": torch.randn(2 * D, D, generator=g) * 0.3,
                   h + "up_proj.weight": torch.randn(2 * D, D, generator=g) * 0.3,
                   h + "down_proj.weight": torch.randn(D, 2 * D, generator=g) * 0.3})
    torch.save(authors_checkpoint(sd, window=2, intermediate_size=2 * D), tmp_path / "ckpt.pt")
    outcome = fuzz.call(import_torch.main, [str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "run"), *OVERRIDES])
    assert outcome.status == 0, outcome.stderr
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model"]["d_ff"] == 2 * D
    logits_match(tmp_path / "run", sd, "sps", 2)


def test_a_model_arg_n_head_of_zero_is_refused_naming_the_flag(tmp_path):
    torch.save(authors_checkpoint(synthetic_state_dict(), n_head=0), tmp_path / "ckpt.pt")
    outcome = fuzz.call(import_torch.main, [str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "r"), *OVERRIDES])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "model_args['n_head'] = 0 is not a positive integer: pass --num-heads." in outcome.stderr
    assert not (tmp_path / "r").exists()


def test_an_import_with_bfloat16_weights_stores_them_in_bfloat16(tmp_path):
    # --config.model.param_dtype=bfloat16: the float32 tensors were saved under a config that says bfloat16 (and the
    # stored-weights check then refused them as inference's copy).
    sd = synthetic_state_dict()
    path = tmp_path / "ckpt.pt"
    torch.save(authors_checkpoint(sd, window=1), path)
    assert import_torch.main([str(path), "--variant", "sps", "--out", str(tmp_path / "run"),
                              "--config.model.attention=xla", "--config.model.param_dtype=bfloat16"]) == 0
    _, params, _ = runs.load_model(str(tmp_path / "run"))
    assert {str(x.dtype) for x in jax.tree_util.tree_leaves(params)} == {"bfloat16"}
    wte = sd["_orig_mod.transformer.wte.weight"].numpy()  # the embedding, rounded once to bfloat16
    np.testing.assert_array_equal(np.asarray(params["embed"], np.float32), wte.astype(jnp.bfloat16).astype(np.float32))


@pytest.mark.parametrize("flag, says", [("2", "--window 2"), ("none", "--window none")])
def test_a_window_flag_that_replaces_the_files_window_size_is_said(tmp_path, capsys, flag, says):
    # --num-heads and --variant against the file were said; --window silently replaced the window the model was
    # trained with, and the imported run computed other logits than the saved one.
    sd = synthetic_state_dict()
    torch.save(authors_checkpoint(sd, window=1), tmp_path / "ckpt.pt")
    assert import_torch.main([str(tmp_path / "ckpt.pt"), "--window", flag, "--out", str(tmp_path / "run"),
                              *OVERRIDES]) == 0
    assert f"note: {says} replaces the checkpoint's model_args['window_size'] = 1: the imported model sees other " \
           "keys, so it computes other logits than the saved one." in capsys.readouterr().err
    logits_match(tmp_path / "run", sd, "sps", 2 if flag == "2" else None)


@pytest.mark.parametrize("flag", ["1", "none"])
def test_a_window_flag_that_computes_the_files_window_says_nothing(tmp_path, capsys, flag):
    # The same window, or no window over a file whose window_size is the whole context (their w=4096 runs).
    sd = synthetic_state_dict()
    torch.save(authors_checkpoint(sd, window=1 if flag == "1" else T), tmp_path / "ckpt.pt")
    assert import_torch.main([str(tmp_path / "ckpt.pt"), "--window", flag, "--out", str(tmp_path / "run"),
                              *OVERRIDES]) == 0
    assert "note:" not in capsys.readouterr().err


def test_a_saved_rope_inv_freq_of_another_base_is_refused_naming_the_override(tmp_path):
    # A persistent inv_freq buffer is what their module rotates with once loaded; it was dropped, and the import
    # rotated with base 10000, computing other logits than the saved model.
    sd = synthetic_state_dict(compiled=False)
    K = D // H
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, K, 2).double() / K))
    sd = {**sd, **{f"transformer.h.{i}.attn.rotary.inv_freq": inv_freq.float() for i in range(L)}}
    torch.save(authors_checkpoint(sd, window=2), tmp_path / "ckpt.pt")
    outcome = fuzz.call(import_torch.main, [str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "run"), *OVERRIDES])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "transformer.h.0.attn.rotary.inv_freq holds RoPE frequencies of base 500000, not the 10000 this import " \
           "rotates with: pass --config.model.rope_theta=500000." in outcome.stderr
    assert not (tmp_path / "run").exists()
    outcome = fuzz.call(import_torch.main, [str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "run"), *OVERRIDES,
                                            "--config.model.rope_theta=500000"])
    assert outcome.status == 0, outcome.stderr


def test_a_rope_theta_in_model_args_is_the_base_the_import_rotates_with(tmp_path, capsys):
    # Their config classes have no RoPE base, but code built on theirs saves one: it was ignored, and the import
    # rotated with 10000, computing other logits than the saved model.
    sd = synthetic_state_dict()
    torch.save(authors_checkpoint(sd, window=2, rope_theta=500000), tmp_path / "ckpt.pt")
    assert import_torch.main([str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "run"), *OVERRIDES]) == 0
    assert "note:" not in capsys.readouterr().err
    net, _ = logits_match(tmp_path / "run", sd, "sps", 2, rope_theta=500000.0)
    assert net.cfg.rope_theta == 500000.0


@pytest.mark.parametrize("changes, field, value, same, key", [
    ({"rope_theta": 500000}, "rope_theta", "10000", "500000.0", "rope_theta"),
    ({}, "eos_id", "3", str(EOS), "eos_token_id"),
])
def test_an_override_that_replaces_a_model_arg_is_said(tmp_path, capsys, changes, field, value, same, key):
    # As --num-heads and --window against the file: allowed, and said; the override replaced it without a word.
    torch.save(authors_checkpoint(synthetic_state_dict(), window=2, **changes), tmp_path / "ckpt.pt")
    argv = [str(tmp_path / "ckpt.pt"), *OVERRIDES]
    assert import_torch.main([*argv, "--out", str(tmp_path / "run"), f"--config.model.{field}={value}"]) == 0
    in_file = changes.get(key, EOS)
    assert f"note: --config.model.{field}={value} replaces the checkpoint's model_args[{key!r}] = {in_file!r}: the " \
           "imported model computes other logits than the saved one." in capsys.readouterr().err
    # The file's own value, written otherwise, says nothing.
    assert import_torch.main([*argv, "--out", str(tmp_path / "same"), f"--config.model.{field}={same}"]) == 0
    assert "note:" not in capsys.readouterr().err


@pytest.mark.parametrize("key, field, value", [("rope_theta", "rope_theta", True), ("rope_theta", "rope_theta", "1e4"),
                                               ("norm_eps", "norm_eps", True)])
def test_a_model_arg_of_the_wrong_type_names_the_override(tmp_path, key, field, value):
    # True was taken as a base or an epsilon of 1.0.
    torch.save(authors_checkpoint(synthetic_state_dict(), **{key: value}), tmp_path / "ckpt.pt")
    outcome = fuzz.call(import_torch.main, [str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "run")])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert f"model_args[{key!r}] = {value!r} is not of type float: pass --config.model.{field}=VALUE." \
        in outcome.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("change, flag, sentence", [
    ({"rope_theta": -1.0}, "--config.model.rope_theta=-2.0", "model.rope_theta must be a positive number that float32 holds (1.18e-38 to 3.4e+38), got "
                           "-1.0 (the value of the checkpoint's model_args['rope_theta']; pass "
                           "--config.model.rope_theta=VALUE to replace it)."),
    ({"eos_token_id": -3}, "--config.model.eos_id=-5", "model.eos_id must be an integer of at least 0, got -3 (the value of the checkpoint's "
                           "model_args['eos_token_id']; pass --config.model.eos_id=VALUE to replace it)."),
])
def test_cli_a_model_args_value_no_model_takes_names_the_files_key(tmp_path, capsys, change, flag, sentence):
    # The config's sentence alone named a field the user never wrote; the value came from the file.
    path = tmp_path / "ckpt.pt"
    torch.save(authors_checkpoint(synthetic_state_dict(), window=1, **change), path)
    assert import_torch.main([str(path), "--variant", "sps", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"error: {sentence}\n"
    # A flag's own bad value, replacing the file's, is the flag's sentence: the file is not blamed for it.
    assert import_torch.main([str(path), "--variant", "sps", "--out", str(tmp_path / "run"), flag]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model.") and f"got {flag.partition('=')[2]}" in err, err
    assert "model_args" not in err, err


@pytest.mark.parametrize("override, flag, given", [("--config.model.window=5", "--window 5", "3"),
                                                   ("--config.model.variant=standard", "--variant standard", "sps"),
                                                   ("--config.model.num_heads=4", "--num-heads 4", "2"),
                                                   ("--config.model.seq_len=64", "--seq-len 64", "32")])
def test_cli_an_override_of_a_field_the_import_has_a_flag_for_is_refused_naming_the_flag(tmp_path, override, flag,
                                                                                          given):
    # With the flag too, the override won without a word (--window 3 said it replaced the file's window, and the run
    # got the override's 5); alone, it replaced the file's value with no note, where the flag says so.
    name = flag.split()[0]
    for extra in ([], [name, given]):
        outcome = fuzz.call(import_torch.main, [str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "run"), override,
                                                *extra])
        assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
        assert f"{override} sets what {name} sets" in outcome.stderr and f"pass {flag} instead" in outcome.stderr, \
            outcome.stderr
    # A notebook is told import_checkpoint's argument (window=5), not the command's flag.
    field, _, value = override.removeprefix("--config.model.").partition("=")
    value = int(value) if value.isdigit() else value
    with pytest.raises(ValueError) as refusal:
        import_torch.import_checkpoint(str(tmp_path / "ckpt.pt"), str(tmp_path / "run"), variant="sps",
                                       overrides=[override.removeprefix("--config.")])
    assert str(refusal.value) == (f"model.{field}={override.partition('=')[2]} sets what {field} sets, which the "
                                  f"import reads against the file: pass {field}={value!r} instead.")
    assert not os.listdir(tmp_path)


def test_cli_a_seq_len_past_the_longest_context_is_refused_as_an_argument(tmp_path):
    # It was said as model.seq_len, a field the user never wrote, once the file had loaded.
    outcome = fuzz.call(import_torch.main, [str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "run"),
                                            "--seq-len", "1073741825"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "argument --seq-len: 1073741825 must be from 1 to 1073741824" in outcome.stderr, outcome.stderr
    assert not os.listdir(tmp_path)


def test_cli_a_file_that_starts_as_no_checkpoint_of_its_suffix_is_refused_before_jax_loads(tmp_path):
    """A file whose first bytes are not those its suffix's reader takes (torch.save's zip archive or pickle for .pt,
    safetensors' header length and '{' for .safetensors) is said before jax's and torch's seconds of import, with
    the rename that fixes a file of the other format."""
    from tests.test_commands import answers_without_jax

    header = b'{"__metadata__":{}}'
    files = {"text.pt": b"hello\n", "text.safetensors": b"hello\n",
             "safetensors.pt": len(header).to_bytes(8, "little") + header, "zip.safetensors": b"PK\x03\x04" + bytes(60)}
    said = {"text.pt": "text.pt is not a PyTorch checkpoint that torch.load can read (",
            "text.safetensors": "text.safetensors is not a safetensors file that safetensors can read (",
            "safetensors.pt": "safetensors.pt is a safetensors file: rename it to end in .safetensors",
            "zip.safetensors": "zip.safetensors is a PyTorch checkpoint (torch.save's): rename it to end in .pt"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        answers, stderr = answers_without_jax("sps_jax.import_torch", [[str(tmp_path / name), "--out",
                                                                        str(tmp_path / "out")]])
        assert answers == [["2", "False"]] and said[name] in stderr, (name, stderr[-2000:])
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("legacy, protocol", [(False, 2), (True, 1), (True, 2), (True, 5)])
def test_every_file_torch_save_writes_that_torch_load_reads_passes_the_check_of_its_first_bytes(tmp_path, legacy,
                                                                                               protocol):
    # torch.save's files as torch writes them: the zip archive, and its legacy format, whose protocol-1 pickle starts
    # with its magic number written as text ('L1195...L'), which torch.load reads and the check refused.
    path = tmp_path / "ckpt.pt"
    torch.save({"w": torch.zeros(2)}, path, _use_new_zipfile_serialization=not legacy, pickle_protocol=protocol)
    assert set(torch.load(path, weights_only=False)) == {"w"}  # a file torch reads
    import_torch.check_checkpoint_file(str(path))


def test_a_tar_archive_the_oldest_torch_save_format_passes_the_check_of_its_first_bytes(tmp_path):
    import tarfile  # torch.load reads a legacy file as a tar archive first; torch no longer writes them

    (tmp_path / "storages").write_bytes(b"x")
    with tarfile.open(tmp_path / "old.pt", "w", format=tarfile.PAX_FORMAT) as archive:
        archive.add(tmp_path / "storages", arcname="storages")
    import_torch.check_checkpoint_file(str(tmp_path / "old.pt"))


def test_a_safetensors_file_cut_short_in_its_header_is_said_to_be_cut_short(tmp_path):
    header = b'{"__metadata__":{}}'
    path = tmp_path / "cut.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header[:5])
    with pytest.raises(cli.UserError) as refusal:
        import_torch.check_checkpoint_file(str(path))
    assert str(refusal.value) == (f"{path} is not a safetensors file that safetensors can read (its header of 19 bytes "
                                  "runs past the file's end, at 13 bytes: cut short?).")


def test_cli_a_checkpoint_file_that_is_missing_or_empty_is_refused_before_jax_loads(tmp_path):
    """A checkpoint file that does not exist, or holds no byte, is said before jax's seconds of import and the CUDA
    plugin's log lines, and after the --out checks, which need no jax either."""
    from tests.test_commands import answers_without_jax

    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    out = str(tmp_path / "out")
    missing, missing_safetensors = str(tmp_path / "missing.pt"), str(tmp_path / "missing.safetensors")
    cases = [([missing, "--out", out], f"PyTorch checkpoint '{missing}' does not exist"),
             ([missing_safetensors, "--out", out], f"safetensors file '{missing_safetensors}' does not exist"),
             ([str(empty), "--out", out], f"PyTorch checkpoint '{empty}' is empty"),
             ([missing, "--out", "README.md"], "--out README.md")]  # the output's check first
    for argv, said in cases:
        answers, stderr = answers_without_jax("sps_jax.import_torch", [argv])
        assert answers == [["2", "False"]] and said in stderr, (argv, stderr[-2000:])
    assert not os.path.exists(out)
