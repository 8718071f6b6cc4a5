"""Config files, the SCALE,VARIANT[,WINDOW] argument and command-line overrides."""

import os
import re
import subprocess
import sys

import ml_collections
import pytest

from sps_jax import config as sps_config, config_checks, config_overrides, masks, optim
from sps_jax import model as sps_model
from tests.helpers import REPO, env, not_one_path


@pytest.mark.parametrize("scale", sorted(sps_config.SCALES))
@pytest.mark.parametrize("variant", ["standard", "sps", "two_x_memory", "delayed_state", "reverse_sps"])
def test_paper_config_builds_a_valid_model_config(scale, variant):
    config = sps_config.load_config(f"configs/paper.py:{scale},{variant},16")
    cfg = sps_model.ModelConfig.from_config(config.model)
    layers, d, heads = sps_config.SCALES[scale]
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.d_ff, cfg.head_dim) == (layers, d, heads, 3 * d, 64)
    assert cfg.window == (None if variant in ("standard", "two_x_memory") else 16)
    assert (cfg.vocab_size, cfg.seq_len) == (50304, 4096)


def test_loading_and_checking_a_config_file_imports_no_jax():
    """A config file's value out of range is refused before jax loads (seconds, and the CUDA plugin's log lines):
    loading the shipped configs (whose model sections are ModelConfig's, checked) and checking them as train does
    need no jax."""
    script = ("import sys\nfrom sps_jax import config\n"
              "for spec in ('configs/tiny.py', 'configs/paper.py:s,sps,64'):\n"
              "    config.check_run_config(config.load_config(spec))\n"
              "print('loaded', 'jax' in sys.modules, 'flax' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.splitlines()[-1:] == ["loaded False False"], proc.stdout[-1000:] + proc.stderr[-2000:]


def test_attention_dims_are_the_scales_heads_of_64_or_its_width_in_wider_heads():
    # The benches' defaults and the compile report's shapes: S is 12 x 64, XL 25 x 64; S's 768 in heads of 128 is 6.
    assert [sps_config.attention_dims(s) for s in ("s", "xl")] == [(12, 64), (25, 64)]
    assert sps_config.attention_dims("s", 128) == (6, 128)


def test_paper_defaults_and_training_recipe():
    config = sps_config.load_config("configs/paper.py")
    assert (config.model.variant, config.model.window, config.model.num_layers) == ("sps", 64, 12)
    t = config.train
    assert (t.b1, t.b2, t.weight_decay, t.grad_clip, t.peak_lr, t.final_lr) == (0.9, 0.95, 0.1, 1.0, 6e-4, 6e-5)
    assert (t.global_batch, t.decay_fraction) == (96, 0.1)
    # The footnote's AdamW is nanoGPT's, which names no eps and so takes torch's default, 1e-8.
    assert t.eps == 1e-8


def test_overrides_parse_literals_and_keep_types():
    config = sps_config.load_config(
        "configs/tiny.py:delayed_state,4",
        ["--config.model.window=None", "--config.train.peak_lr=1", "--config.model.attention=pallas"])
    assert config.model.variant == "delayed_state"
    assert config.model.window is None
    assert config.train.peak_lr == 1.0 and isinstance(config.train.peak_lr, float)
    assert config.model.attention == "pallas"


def test_config_errors_are_one_clear_sentence():
    with pytest.raises(FileNotFoundError, match="does not exist"):
        sps_config.load_config("configs/nope.py")
    with pytest.raises(ValueError, match="unknown variant|unknown attention variant"):
        sps_config.load_config("configs/paper.py:s,spss")
    with pytest.raises(ValueError, match="must be an integer from 0 to"):
        sps_config.load_config("configs/paper.py:s,sps,-1")
    with pytest.raises(ValueError, match="unknown scale"):
        sps_config.load_config("configs/paper.py:xxl,sps")
    with pytest.raises(ValueError, match="has no field"):
        sps_config.load_config("configs/tiny.py", ["--config.model.windw=3"])


def test_a_window_beyond_int32_is_refused_in_the_config_argument_and_in_an_override():
    with pytest.raises(ValueError, match=r"^window '99999999999999999999' must be an integer from 0 to 2147483647 "):
        sps_config.load_config("configs/tiny.py:sps,99999999999999999999")
    config = sps_config.load_config("configs/tiny.py", ["--config.model.window=2147483648"])
    with pytest.raises(ValueError, match=r"^model\.window must be an integer from 0 to 2147483647 .* got 2147483648\.$"):
        sps_model.ModelConfig.from_config(config.model)
    assert sps_config.load_config("configs/tiny.py:sps,2147483647").model.window == 2147483647


def test_the_shipped_configs_load_from_any_folder(tmp_path, monkeypatch):
    # The bench commands default to configs/paper.py; from outside the checkout that relative path
    # names nothing, so it is looked up in the checkout this package runs from.
    monkeypatch.chdir(tmp_path)
    assert sps_config.load_config("configs/paper.py:s,standard").model.variant == "standard"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        sps_config.load_config("configs/nope.py")


def test_a_config_in_the_current_folder_wins_over_the_shipped_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tiny.py").write_text(
        "from sps_jax import config\n\ndef get_config():\n    c = config.paper_config('xs', 'standard', None)\n"
        "    c.name = 'mine'\n    return c\n")
    assert sps_config.load_config("configs/tiny.py").name == "mine"


def test_a_config_under_a_folder_with_a_colon_in_its_name_loads_with_its_argument(tmp_path):
    # The argument follows ".py:"; a colon earlier in the path (runs/2026-11-24T10:00/...) is part of the path.
    folder = tmp_path / "sweep:lr"
    folder.mkdir()
    (folder / "cfg.py").write_text(
        "from sps_jax import config\n\ndef get_config(arg='standard'):\n    return config.paper_config('xs', arg, None)\n")
    assert sps_config.load_config(f"{folder}/cfg.py").model.variant == "standard"
    assert sps_config.load_config(f"{folder}/cfg.py:sps").model.variant == "sps"


def test_the_shipped_configs_pass_the_run_checks_for_every_scale_and_variant():
    for spec in ["configs/tiny.py", *[f"configs/paper.py:{scale},{variant}" for scale in sps_config.SCALES
                                      for variant in masks.VARIANTS]]:
        sps_config.check_run_config(sps_config.load_config(spec))


def test_a_warmup_that_does_not_end_within_the_run_is_refused_naming_the_settings():
    config = sps_config.load_config("configs/tiny.py", ["--config.train.total_tokens=6144",
                                                        "--config.train.warmup_tokens=1000000000"])
    with pytest.raises(ValueError, match="train.warmup_tokens=1000000000 is beyond train.total_tokens=6144: the run "
                                         "would end before the learning rate reaches peak_lr"):
        sps_config.check_run_config(config)


def test_milestones_that_are_not_a_multiple_of_the_checkpoint_steps_are_refused():
    # milestone_every=3 with checkpoint_every=2 kept only steps 6, 12, ... (no checkpoint is saved at 3, 9, ...)
    config = sps_config.load_config("configs/tiny.py", ["--config.train.checkpoint_every=2",
                                                        "--config.train.milestone_every=3"])
    with pytest.raises(ValueError, match=r"^train\.milestone_every=3 is not a multiple of train\.checkpoint_every=2, "
                                         r"the steps checkpoints are saved at: milestones would be kept only every 6 "
                                         r"steps; make milestone_every a multiple of checkpoint_every, or 0 for none\.$"):
        sps_config.check_run_config(config)
    for milestone_every in (0, 4):  # none, and a multiple
        sps_config.check_run_config(sps_config.load_config("configs/tiny.py", [
            "--config.train.checkpoint_every=2", f"--config.train.milestone_every={milestone_every}"]))


def test_the_schedule_counts_a_last_step_of_fewer_tokens():
    # tiny: 8 x 128 = 1024 tokens a step; 2048 tokens are 2 steps, 2049 are 3, 307200 are 300
    config = sps_config.load_config("configs/tiny.py")
    for tokens, steps in ((2048, 2), (2049, 3), (307200, 300), (2 ** 60 + 1, 2 ** 50 + 1)):
        config.train.total_tokens = tokens
        assert config_checks.schedule_steps(config.train, 128) == steps


def test_a_config_shortened_by_total_tokens_alone_is_accepted():
    # The README's tiny run cut to its 20 warmup steps: the warmup ends inside the decay of the last 10%.
    for overrides in (["total_tokens=20480"], ["total_tokens=1000", "warmup_tokens=1000"],
                      ["warmup_tokens=0", "decay_fraction=1.0"],
                      ["total_tokens=2049", "warmup_tokens=0", "stop_at_step=3"]):  # a stop at the last step
        sps_config.check_run_config(sps_config.load_config("configs/tiny.py", [f"--config.train.{o}" for o in overrides]))


@pytest.mark.parametrize("overrides, sentence", [
    # W&B read these only when the first step had compiled and run, then blamed the login
    (["metrics.wandb=True", "metrics.wandb_mode=foo"], r"metrics\.wandb_mode='foo' must be one of online, offline, "
                                                       r"disabled, or None for WANDB_MODE \(else online\)\.$"),
    (["metrics.wandb=True", "metrics.wandb_project="], r"metrics\.wandb_project='' must be a non-empty string, or "
                                                       r"None for W&B's default project\.$"),
    (["metrics.wandb=True", "metrics.wandb_entity=5"], r"metrics\.wandb_entity=5 must be a non-empty string"),
    (["metrics.wandb=None"], r"metrics\.wandb=None must be True or False\.$"),
    # 0 was read as unset: MFU against the device's known peak, not the one given
    (["train.peak_flops_per_device=0"], r"train\.peak_flops_per_device=0 cannot divide MFU: set the device's peak "
                                        r"FLOP/s, or None for its known peak\.$"),
    # float32 holds no such number: the step turned it into inf, and the parameters into NaN or -inf
    *[([f"train.{field}=1e300"], rf"^train\.{field}=1e\+300 is beyond float32's largest number \(3\.403e\+38\), in "
                                 r"which the training step computes it: it would become inf there; set a smaller value\.$")
      for field in ("peak_lr", "eps", "weight_decay", "grad_clip")],
    (["train.peak_lr=1e300", "train.final_lr=1e300"], r"^train\.peak_lr=1e\+300 is beyond float32's"),
    # ... nor one below its smallest normal number, which the step flushes to 0: a grad_clip of 1e-40 zeroed every
    # update, a peak_lr of 1e-50 trained at -0.0 without the note a 0 gets
    *[([f"train.{field}=1e-40", "train.final_lr=0"], rf"^train\.{field}=1e-40 is below float32's smallest normal "
                                                      r"number \(1\.175e-38\), in which the training step computes it: "
                                                      r"it would be 0 there; set a larger value\.$")
      for field in ("peak_lr", "eps", "weight_decay", "grad_clip")],
    # AdamW's decoupled decay scales each weight by 1 - lr * wd: at or below 0, the weights flip sign every step
    (["train.weight_decay=1e6"], r"^train\.peak_lr=0\.003 x train\.weight_decay=1000000\.0 is at least 1: AdamW's decay "
                                 r"multiplies every weight by 1 - lr x weight_decay each step, which would be 0 or "
                                 r"below; lower either\.$"),
    (["train.weight_decay=500", "train.peak_lr=2e-3", "train.final_lr=0"], r"is at least 1"),
    # W&B's settings are checked with W&B off too: config.json keeps them for a resume that turns it on
    (["metrics.wandb_mode=bogus"], r"metrics\.wandb_mode='bogus' must be one of online, offline, disabled"),
    # none is text on a text field: it was told "did you mean 'online'?", where the literal None was meant
    (["metrics.wandb_mode=none"], r"^metrics\.wandb_mode='none' \(did you mean None\?\) must be one of online, "),
    (["metrics.wandb_name=[1]"], r"metrics\.wandb_name=\[1\] must be a non-empty string"),
    # optax's AdamW update is mu / (sqrt(nu) + eps): 0 / 0, NaN, where a gradient and its moments are 0
    (["train.eps=0"], r"^train\.eps=0\.0 makes AdamW's update 0 / 0, NaN, for a weight whose gradient and both "
                      r"moments are 0 \(a gradient of 0 from the first step, or one that stays 0 until its moments "
                      r"decay away\): set it above 0 \(the paper's 1e-08\)\.$"),
    # the internal cap of an unbounded count is no bound a person set
    (["train.global_batch=0"], r"^train\.global_batch=0 must be an integer of at least 1 and below 2\*\*62\.$"),
    # grain sized its buffer up front: a depth of 1e9 hung before the first batch
    (["data.prefetch=1e9"], r"data\.prefetch=1000000000 must be an integer between 0 and 1024\.$"),
    # written out, the number ran to 101 digits
    (["train.log_every=1e100"], r"^train\.log_every=1e\+100 must be an integer of at least 1 and below 2\*\*62\.$"),
])
def test_settings_read_only_once_training_runs_are_checked_with_the_config(overrides, sentence):
    config = sps_config.load_config("configs/tiny.py", [f"--config.{o}" for o in overrides])
    with pytest.raises(ValueError, match=sentence):
        sps_config.check_run_config(config)


@pytest.mark.parametrize("override, sentence", [
    ("train.peak_lr=-1", "train.peak_lr=-1.0 must be a finite number of at least 0."),
    ("data.prefetch=1e9", "data.prefetch=1000000000 must be an integer between 0 and 1024."),
    ("model.num_layers=100000", "model.num_layers=100000 is above 1024: the layers are unrolled in the traced program, "
                                "so a model this deep would take hours to trace and compile; use fewer layers."),
])
def test_cli_an_override_out_of_range_is_refused_before_the_config_file_runs_in_the_later_checks_sentence(
        tmp_path, override, sentence):
    # The file runs only after the overrides' values are checked: running it loads jax (its model section is
    # ModelConfig's), which a refused value need not wait for. Each command that takes --config asks the same check.
    from sps_jax import train
    from sps_jax.bench import __main__ as bench_cli
    from tests import fuzz

    ran = tmp_path / "ran"
    config_file = tmp_path / "marks.py"
    config_file.write_text("import pathlib\n\n"
                           "def get_config():\n"
                           f"    pathlib.Path({str(ran)!r}).touch()\n"
                           "    return __import__('sps_jax.config').config.paper_config('xs', 'sps', 8)\n")
    for main, argv in ((train.main, ["--workdir", str(tmp_path / "w")]), (bench_cli.main, ["train"]),
                       (bench_cli.main, ["smoke"]), (bench_cli.main, ["generate"]),
                       (bench_cli.main, ["compile", "--target", "h100"])):
        said = fuzz.call(main, [*argv, "--config", str(config_file), f"--config.{override}"])
        assert (said.status, said.stderr, ran.exists()) == (2, f"error: {sentence}\n", False), argv
    # the sentence the config's own checks give once the value is set
    later = sps_config.load_config("configs/tiny.py")
    config_overrides.apply_override(later, override)
    with pytest.raises(ValueError) as checked:
        sps_config.check_run_config(later)
        sps_model.ModelConfig.from_config(later.model)
    assert str(checked.value) == sentence


@pytest.mark.parametrize("vocab_size, sentence", [
    (50000, "model.eos_id=50256, model.predict_id=50257 and model.pad_id=50303 are outside the vocabulary of "
            "model.vocab_size=50000: raise model.vocab_size to at least 50304, or set those ids below 50000."),
    (50258, "model.pad_id=50303 is outside the vocabulary of model.vocab_size=50258: raise model.vocab_size to at "
            "least 50304, or set model.pad_id to an id below 50258."),
])
def test_cli_a_vocabulary_too_small_for_the_special_ids_names_the_override_that_set_it(tmp_path, vocab_size, sentence):
    # The sentence blamed the config file for the override's value ("config file configs/tiny.py: model.eos_id=50256
    # is outside the vocabulary of 50000") and offered only to move the id, which GPT-2's tokens fix at 50256.
    from sps_jax import train
    from tests import fuzz

    said = fuzz.call(train.main, ["--config", "configs/tiny.py", "--workdir", str(tmp_path / "w"),
                                  f"--config.model.vocab_size={vocab_size}"])
    assert (said.status, said.stderr) == (2, f"error: {sentence}\n")
    assert not (tmp_path / "w").exists()


def test_the_refusal_of_ids_outside_the_vocabulary_is_the_same_sentence_in_another_process():
    # A worker process hands its exception back pickled; an exception class whose __init__ takes other arguments
    # than its message fails to unpickle there.
    import pickle

    from sps_jax import model_config

    with pytest.raises(model_config.IdsOutsideVocabulary) as refusal:
        model_config.ModelConfig(vocab_size=50300)
    again = pickle.loads(pickle.dumps(refusal.value))
    assert (type(again), str(again)) == (model_config.IdsOutsideVocabulary, str(refusal.value))


def test_only_the_last_override_of_a_field_is_held_to_its_range():
    # a key given twice takes its last value, so a script may correct a shared list's value
    sps_config.check_override_values(["--config.train.peak_lr=-1", "--config.train.peak_lr=1e-3"])
    with pytest.raises(ValueError, match=r"^train\.peak_lr=-1\.0 must be a finite number of at least 0\.$"):
        sps_config.check_override_values(["--config.train.peak_lr=1e-3", "--config.train.peak_lr=-1"])


@pytest.mark.parametrize("spec, overrides, name", [
    ("configs/tiny.py", [], "tiny-sps-w8"),
    ("configs/tiny.py", ["--config.model.variant=standard"], "tiny-standard"),
    ("configs/tiny.py", ["--config.model.window=16"], "tiny-sps-w16"),
    ("configs/tiny.py:sps,none", [], "tiny-sps-wnone"),  # the spec's word for no bound, not Python's None
    ("configs/paper.py:s,sps,64", ["--config.model.window=None"], "s-sps-wnone"),
    ("configs/paper.py:m,standard", ["--config.model.variant=reverse_sps", "--config.model.window=32"],
     "m-reverse_sps-w32"),
])
def test_a_generated_run_name_follows_the_overrides_of_variant_and_window(spec, overrides, name):
    assert sps_config.load_config(spec, overrides).name == name


def test_a_name_set_on_the_command_line_or_in_the_config_file_is_kept(tmp_path):
    assert sps_config.load_config("configs/tiny.py", ["--config.name=tiny-sps-w8",
                                                      "--config.model.variant=standard"]).name == "tiny-sps-w8"
    own = tmp_path / "own.py"
    own.write_text("from sps_jax import config as sps_config\n\n"
                   "def get_config():\n"
                   "    config = sps_config.paper_config('xs', 'sps', 8)\n"
                   "    config.name = 'ablation-7'\n"
                   "    return config\n")
    assert sps_config.load_config(str(own), ["--config.model.variant=standard"]).name == "ablation-7"
    plain = tmp_path / "plain.py"  # the paper's config as it is: its name is the generated one
    plain.write_text("from sps_jax import config as sps_config\n\n"
                     "def get_config():\n"
                     "    return sps_config.paper_config('xs', 'sps', 8)\n")
    assert sps_config.load_config(str(plain), ["--config.model.variant=standard"]).name == "xs-standard"


@pytest.mark.parametrize("name, model, stale", [
    ("tiny-sps-w8", {"variant": "sps", "window": 8}, None),
    ("tiny-sps-w8", {"variant": "standard"}, ("sps with window 8", "tiny-standard")),
    ("tiny-sps-w8", {"variant": "sps", "window": 2}, ("sps with window 8", "tiny-sps-w2")),
    ("tiny-sps-wnone", {"variant": "sps", "window": None}, None),
    ("tiny-sps-wnone", {"variant": "sps", "window": 8}, ("sps with window none", "tiny-sps-w8")),
    ("tiny-sps-w8", {"variant": "sps", "window": None}, ("sps with window 8", "tiny-sps-wnone")),
    ("xs-two_x_memory", {"variant": "reverse_sps", "window": 64}, ("two_x_memory", "xs-reverse_sps-w64")),
    ("tiny-standard", {"variant": "standard", "window": 64}, None),  # standard has no window: 64 is dropped
    ("tiny-sps", {"variant": "sps", "window": 8}, None),  # names the variant trained, and no window
    ("ablation-7", {"variant": "standard"}, None), ("sps", {"variant": "standard"}, None)])
def test_a_name_that_reads_as_another_variant_or_window_is_stale(name, model, stale):
    # A notebook's config.model.variant = "standard" after load_config kept the name tiny-sps-w8 (train renames it).
    config = sps_config.load_config("configs/tiny.py")
    config.name = name
    config.model.update(model)
    assert sps_config.stale_name(config) == stale


@pytest.mark.parametrize("spec, sentence", [
    ("configs/paper.py:s,,64", "config argument 's,,64' leaves VARIANT empty: pass SCALE,VARIANT[,WINDOW], e.g. s,sps,64."),
    ("configs/paper.py:,sps", "config argument ',sps' leaves SCALE empty: pass SCALE,VARIANT[,WINDOW], e.g. s,sps,64."),
    ("configs/tiny.py:,16", "config argument ',16' leaves VARIANT empty: pass VARIANT[,WINDOW], e.g. sps,8."),
    ("configs/tiny.py:sps,", "config argument 'sps,' leaves WINDOW empty: pass VARIANT[,WINDOW], e.g. sps,8."),
])
def test_an_empty_field_of_the_config_argument_is_named_not_filled_by_the_next_one(spec, sentence):
    # Dropping the empty field moved the later ones up: s,,64 asked for the variant '64'.
    with pytest.raises(ValueError) as refusal:
        sps_config.load_config(spec)
    assert str(refusal.value) == sentence


@pytest.mark.parametrize("spec", ["configs/paper.py:", "configs/tiny.py: "])
def test_a_config_argument_left_empty_after_the_colon_is_refused_not_read_as_the_defaults(spec):
    # configs/paper.py:$ARG with ARG unset trained the file's defaults (s, sps, 64) without a word, where an empty
    # field inside the argument (s,,64) is refused.
    with pytest.raises(ValueError, match=rf"^config {re.escape(repr(spec))} has nothing after ':': give the "
                                         r"argument \(configs/paper\.py:s,sps,64\), or drop the ':' for the file's "
                                         r"defaults\.$"):
        sps_config.load_config(spec)


@pytest.mark.parametrize("argv", [
    ["--config.train.peak_lr", "3e-4"],  # the value after a space
    ["--config.train.peak_lr", "=", "3e-4"],  # spaces around '=' (the sentence said --config.train.peak_lr==)
    ["--config.train.peak_lr", "=3e-4"],  # a space before '=' (it said --config.train.peak_lr==3e-4)
    ["--config.train.peak_lr=", "3e-4"],  # a space after '=' (argparse called 3e-4 an unrecognized argument)
    ["--config.train.peak_lr:3e-4"],  # YAML's ':' for '=' (it said --config.train.peak_lr:3e-4=VALUE)
])
def test_an_override_split_by_spaces_is_told_the_one_word_to_write(argv):
    with pytest.raises(ValueError) as refusal:
        config_overrides.split_config_args(["--workdir", "w", *argv, "--force"])
    assert str(refusal.value) == ("override --config.train.peak_lr has no value: write --config.train.peak_lr=3e-4, "
                                  "the value after '=' with no space.")


def test_a_users_config_that_leaves_the_variant_to_the_model_default_loads(tmp_path):
    # Fields a config leaves out take ModelConfig's defaults; the name check for overrides raised AttributeError.
    path = tmp_path / "mine.py"
    path.write_text("import ml_collections\n\ndef get_config():\n    c = ml_collections.ConfigDict()\n"
                    "    c.name = 'x'\n    c.model = ml_collections.ConfigDict({'d_model': 8})\n    return c\n")
    config = sps_config.load_config(str(path), ["--config.model.d_model=8"])
    assert config.name == "x" and sps_model.ModelConfig.from_config(config.model).d_model == 8


def test_the_20b_token_budget_meets_the_chinchilla_ratio_at_every_scale_but_xl():
    # Section 4 (Data): "Each model is trained for 20B tokens by default. This budget meets or exceeds the
    # Chinchilla compute-optimal ratio of ~20 tokens per parameter at every scale, except for XL", with the
    # footnote "Chinchilla-optimal ~1.1B, 2.6B, 7.6B, 16.6B, and 33.6B tokens for XS, S, M, L, and XL".
    chinchilla_billions = {"xs": 1.1, "s": 2.6, "m": 7.6, "l": 16.6, "xl": 33.6}
    for scale, billions in chinchilla_billions.items():
        config = sps_config.load_config(f"configs/paper.py:{scale},sps")
        params = sps_model.ModelConfig.from_config(config.model).num_params
        assert round(20 * params / 1e9, 1) == billions, scale
        assert config.train.total_tokens == 20_000_000_000
        assert (config.train.total_tokens >= 20 * params) == (scale != "xl"), scale
    # Section 4 (Training): "The global batch size is 96 sequences of length 4,096, i.e. ~400,000 tokens per
    # gradient update".
    assert config.train.global_batch * config.model.seq_len == 96 * 4096 == 393_216


@pytest.mark.parametrize("scale, warmup_millions", [("xs", 50), ("s", 50), ("m", 100), ("l", 100), ("xl", 100)])
def test_the_schedule_is_the_papers_warmup_constant_decay_with_the_authors_warmup(scale, warmup_millions):
    # Section 4 (Training): peak 6e-4, "a brief linear warmup", constant, then a linear decay over the final 10% of
    # the 20B tokens to 6e-5; the warmup's length is the authors' released configs' (warmup_tokens: 50M in their
    # xs and s experiments, 100M in m, l and xl). Values by hand.
    t = sps_config.load_config(f"configs/paper.py:{scale},sps").train
    warmup = warmup_millions * 1_000_000
    assert t.warmup_tokens == warmup
    tokens_per_update = t.global_batch * 4096
    lr = optim.schedule(t, tokens_per_update)
    expected = {warmup // 2: 3e-4, warmup: 6e-4, 10_000_000_000: 6e-4, 18_000_000_000: 6e-4,
                19_000_000_000: (6e-4 + 6e-5) / 2, 20_000_000_000: 6e-5}
    for tokens, rate in expected.items():
        assert float(lr(tokens / tokens_per_update)) == pytest.approx(rate, rel=1e-5), tokens


def test_the_headline_runs_seed_is_neither_seed_of_the_appendix_c_sweep():
    # Appendix C: "the headline run plus seed 0 and seed 1"; the authors' headline runs use seed 1337 (their
    # released training config). With seed 0 the paper's "seed 0" run was the headline run again.
    for scale in ("xs", "s", "m", "l", "xl"):
        assert sps_config.load_config(f"configs/paper.py:{scale},sps").train.seed == 1337
    assert sps_config.load_config("configs/tiny.py").train.seed == 0  # the README's measured curve is seed 0's


def test_validation_scores_as_many_tokens_as_the_authors():
    # The authors' trainer scores eval_total_tokens = 10M tokens in whole batches of 96 sequences of 4096:
    # ceil(10e6 / 393216) = 26 batches, 2496 windows (10,223,616 tokens). A smaller sample is a noisier val_loss.
    config = sps_config.load_config("configs/paper.py:s,sps")
    assert config.data.val_windows == 2496 and config.model.seq_len == 4096


@pytest.mark.parametrize("field", [f for f, (_, _, _, optional) in sps_config.RANGES.items() if not optional])
def test_none_for_a_field_that_takes_a_number_is_one_sentence(field):
    # Overrides accept None everywhere and leave it to the checks; comparing None with the bound was a TypeError.
    config = sps_config.load_config("configs/tiny.py", [f"--config.{field}=None"])
    with pytest.raises(ValueError, match=rf"^{field}=None must be (an integer|a finite number) "):
        sps_config.check_run_config(config)


@pytest.mark.parametrize("body, sentence", [
    ("def get_config(:\n", r"config file .*bad\.py line 1 is not valid Python \(.*\): fix that line\.$"),
    ("import nowhere_module\n", r"config file .*bad\.py failed at line 1: ModuleNotFoundError: No module named "
                                r"'nowhere_module': fix the file there\.$"),
    ("def get_config():\n    return 1 / 0\n", r"get_config\(\) of .*bad\.py failed at line 2: ZeroDivisionError: "
                                              r"division by zero: fix the file there\.$"),
    ("def get_config():\n    return {}\n", r"get_config of .*bad\.py returned dict, not an ml_collections\.ConfigDict: "
                                          r"return one, as configs/tiny\.py does\.$"),
    # SystemExit is no Exception: it passed through, and the command ended with the file's status and no word.
    ("import sys\nsys.exit(3)\n", r"^config file .*bad\.py failed at line 2: SystemExit: 3: fix the file there\.$"),
    ("def get_config():\n    raise SystemExit('no')\n",
     r"^get_config\(\) of .*bad\.py failed at line 2: SystemExit: no: fix the file there\.$"),
    # a ValueError of the file's own passed through as it was ("invalid literal for int() ..."), naming no file
    ("def get_config():\n    return int('abc')\n",
     r"^get_config\(\) of .*bad\.py failed at line 2: ValueError: invalid literal for int\(\) with base 10: 'abc': "
     r"fix the file there\.$"),
    # an error of no message is named once, not as "MemoryError: MemoryError"
    ("def get_config():\n    raise MemoryError\n",
     r"^get_config\(\) of .*bad\.py failed at line 2: MemoryError: fix the file there\.$"),
    # the package's builders, called by the file, keep their own sentence
    ("from sps_jax import config\ndef get_config():\n    return config.paper_config('q')\n", r"^unknown scale 'q'"),
])
def test_a_config_file_that_fails_is_one_sentence_saying_where_and_what_to_do(tmp_path, body, sentence):
    path = tmp_path / "bad.py"
    path.write_text(body)
    with pytest.raises(ValueError, match=sentence):
        sps_config.load_config(str(path))


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32"])
def test_a_config_file_saved_as_utf16_says_to_save_it_as_utf8(tmp_path, encoding):
    # Python names no line for its null bytes: the sentence said "line None is not valid Python".
    path = tmp_path / "tiny16.py"
    path.write_text((config_overrides._SHIPPED_CONFIGS / "tiny.py").read_text(), encoding=encoding)
    with pytest.raises(ValueError) as refusal:
        sps_config.load_config(str(path))
    assert str(refusal.value) == (f"config file {path} is not valid Python (source code string cannot contain null "
                                  "bytes): save it as UTF-8 text.")


def test_a_config_path_may_be_a_pathlib_path():
    import pathlib

    assert sps_config.load_config(pathlib.Path("configs/tiny.py")).model.num_layers == 2


def test_a_notebooks_config_mistakes_are_one_sentence_saying_what_to_pass():
    # A string of overrides was read one character at a time ("override '-' must look like ..."), and a
    # plain dict config was said to have no model section, which it had.
    with pytest.raises(ValueError, match=r"overrides must be a list of 'a\.b=value' strings, not the string "
                                         r"'--config\.train\.seed=1': pass \['--config\.train\.seed=1'\]\.$"):
        sps_config.load_config("configs/tiny.py", "--config.train.seed=1")
    with pytest.raises(ValueError, match=r"the config is a dict, not an ml_collections\.ConfigDict: pass "
                                         r"ml_collections\.ConfigDict\(it\)"):
        sps_config.check_run_config(sps_config.load_config("configs/tiny.py").to_dict())


# Section 4, Table "Model configurations across the five scales", copied as printed: layers L, hidden size d,
# heads H, FFN size, and the parameter count at the table's own precision.
PAPER_TABLE = {
    "xs": (8, 512, 8, 1536, "53M"),
    "s": (12, 768, 12, 2304, "131M"),
    "m": (24, 1024, 16, 3072, "379M"),
    "l": (36, 1280, 20, 3840, "831M"),
    "xl": (48, 1600, 25, 4800, "1.678B"),
}


@pytest.mark.parametrize("scale", list(PAPER_TABLE))
def test_each_scale_is_the_papers_table_row_with_its_printed_parameter_count(scale):
    """The paper's scale table, literally: the configs' sizes, d_h = d / H (Appendix A), and the built model's
    parameters (tied embedding counted once) rounded as the table prints them. At that precision an untied head,
    biases on the linear layers (+0.85M at XL: 1.679B) or another FFN width would show."""
    layers, d, heads, ffn, printed = PAPER_TABLE[scale]
    cfg = sps_model.ModelConfig.from_config(sps_config.load_config(f"configs/paper.py:{scale},sps").model)
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.d_ff) == (layers, d, heads, ffn)
    assert cfg.head_dim == d // heads
    n = cfg.num_params  # arithmetic; tests/test_model.py holds it to the built model's parameters
    got = f"{n / 1e9:.3f}B" if printed.endswith("B") else f"{n / 1e6:.0f}M"
    assert got == printed, (scale, n)


# Each scale's parameters from the backbone of Section 4 and Appendix A, counted by hand: the 50304-row embedding,
# tied to the unembedding and so counted once (V d), per layer the q/k/v/out projections (4 d^2), a SwiGLU of width
# 3d (gate, up, down: 3 x 3 d^2) and two RMSNorm scales (2 d), no biases, and the final RMSNorm (d):
#   xs: 50304 x 512  + 8 x (13 x 512^2  + 2 x 512)  + 512  =    53,027,328
#   s:  50304 x 768  + 12 x (13 x 768^2  + 2 x 768)  + 768  =   130,665,216
#   m:  50304 x 1024 + 24 x (13 x 1024^2 + 2 x 1024) + 1024 =   378,717,184
#   l:  50304 x 1280 + 36 x (13 x 1280^2 + 2 x 1280) + 1280 =   831,253,760
#   xl: 50304 x 1600 + 48 x (13 x 1600^2 + 2 x 1600) + 1600 = 1,678,081,600
# docs/design.md section 5 prints them in millions to two decimals.
EXACT_PARAMS = {"xs": (53_027_328, "53.03M"), "s": (130_665_216, "130.67M"), "m": (378_717_184, "378.72M"),
                "l": (831_253_760, "831.25M"), "xl": (1_678_081_600, "1678.08M")}


@pytest.mark.parametrize("scale", list(EXACT_PARAMS))
def test_each_scales_parameters_are_the_backbone_counted_by_hand_to_the_last_one(scale):
    """The table's rounding hides a missing final norm or norm scales (a few thousand parameters); the exact count
    does not. docs/design.md's table states the same numbers."""
    exact, in_design = EXACT_PARAMS[scale]
    cfg = sps_model.ModelConfig.from_config(sps_config.load_config(f"configs/paper.py:{scale},sps").model)
    assert cfg.num_params == exact
    assert sps_model.count_params(sps_model.Transformer(cfg)) == exact  # the built model's, by jax.eval_shape
    layers, d, heads, _, _ = PAPER_TABLE[scale]
    with open(os.path.join(REPO, "docs", "design.md")) as f:
        assert f"| {scale} | {layers} | {d} | {heads} | {in_design} |" in f.read().splitlines()


def test_the_shared_setup_of_section_4_holds_at_every_scale_and_variant():
    """Section 4: all variants share one backbone with a context of 4,096 tokens, train in bfloat16 mixed precision
    (f32 parameters), and 'all sliding-window variants use w = 64 at every scale' unless told otherwise; the
    variants differ only in attention pattern (the same parameter count)."""
    for scale in PAPER_TABLE:
        counts = set()
        for variant in masks.VARIANTS:
            model = sps_config.load_config(f"configs/paper.py:{scale},{variant}").model
            cfg = sps_model.ModelConfig.from_config(model)
            assert (cfg.seq_len, cfg.dtype, cfg.param_dtype) == (4096, "bfloat16", "float32")
            assert cfg.window == (64 if variant in ("sps", "delayed_state", "reverse_sps") else None), (scale, variant)
            counts.add(cfg.num_params)
        assert len(counts) == 1, scale


@pytest.mark.parametrize("override, sentence", [
    ("model.seqlen=64", r"^override '--config\.model\.seqlen=64': config\.model has no field 'seqlen' \(did you mean "
                        r"--config\.model\.seq_len\?\): its fields are attention, d_ff, .*, window\.$"),
    ("train.Seed=1", r"^override '--config\.train\.Seed=1': config\.train has no field 'Seed' \(did you mean "
                     r"--config\.train\.seed\?\): its fields are "),
    ("modle.seq_len=64", r"^override '--config\.modle\.seq_len=64': the config has no section 'modle' \(did you mean "
                         r"--config\.model\?\): its sections are data, mesh, metrics, model, train\.$"),
    ("model.zzz=1", r"^override '--config\.model\.zzz=1': config\.model has no field 'zzz': its fields are "),
    ("name.x=1", r"^override '--config\.name\.x=1': config\.name is a field, not a section: set it as "
                 r"--config\.name=VALUE\.$"),
    ("model..seq_len=64", r"^override '--config\.model\.\.seq_len=64' leaves a name empty: write "
                          r"--config\.SECTION\.FIELD=VALUE, e\.g\. --config\.train\.seed=1\.$"),
    ("=3", r"^override '--config\.=3' leaves a name empty: "),
])
def test_a_mistyped_override_key_is_named_with_the_key_it_likely_means(override, sentence):
    # The sentence said "config section has no field 'seqlen'; fields are [...]", naming neither the section nor
    # the field meant; a field used as a section was "no section 'name'", and an empty name listed the sections.
    with pytest.raises(ValueError, match=sentence):
        sps_config.load_config("configs/tiny.py", [f"--config.{override}"])


@pytest.mark.parametrize("spec, model", [
    ("configs/paper.py:S,SPS,64", ("sps", 64, 12)), ("configs/paper.py:XL,Reverse_SPS,None", ("reverse_sps", None, 48)),
    ("configs/tiny.py:DELAYED_STATE,4", ("delayed_state", 4, 2)),
])
def test_the_config_argument_is_read_in_any_case(spec, model):
    # The scale was lowered but not the variant: S,SPS was 'unknown attention variant 'SPS''.
    m = sps_config.load_config(spec).model
    assert (m.variant, m.window, m.num_layers) == model


def test_an_unknown_scale_is_named_with_the_one_it_likely_means():
    with pytest.raises(ValueError, match=r"^unknown scale 'xll' \(did you mean 'xl'\?\): choose one of xs, s, m, l, "
                                         r"xl\.$"):
        sps_config.load_config("configs/paper.py:xll,sps")


def test_an_override_of_a_config_without_sections_says_so(tmp_path):
    # The sentence listed the sections there are as an empty list: "its sections are ."
    path = tmp_path / "empty.py"
    path.write_text("import ml_collections\ndef get_config():\n    return ml_collections.ConfigDict()\n")
    with pytest.raises(ValueError, match=r"^override '--config\.train\.steps=3': the config has no sections, so no "
                                         r"section 'train': its get_config builds none \(see configs/tiny\.py\)\.$"):
        sps_config.load_config(str(path), ["--config.train.steps=3"])


@pytest.mark.parametrize("spec, kind", [(["configs/tiny.py", "configs/paper.py"], "list"), (None, "NoneType"),
                                        (b"configs/tiny.py", "bytes")])
def test_a_config_spec_that_is_not_one_path_is_one_sentence(spec, kind):
    # Before: Python's "expected str, bytes or os.PathLike object, not list" from os.fspath (bytes: a str.find error).
    with pytest.raises(TypeError, match=not_one_path('spec', kind)):
        sps_config.load_config(spec)


def test_a_config_file_returning_a_frozen_config_loads_and_takes_overrides(tmp_path):
    # FrozenConfigDict is a ConfigDict that refuses writes: naming the run and each override ended in a traceback.
    path = tmp_path / "frozen.py"
    path.write_text("import ml_collections\nfrom sps_jax import config\n\ndef get_config():\n"
                    "    return ml_collections.FrozenConfigDict(config.paper_config('xs', 'sps', 8))\n")
    config = sps_config.load_config(str(path), ["model.window=4"])
    assert config.model.window == 4 and config.name == "xs-sps-w4"


def test_numpy_numbers_a_config_file_sets_are_the_numbers_they_hold(tmp_path):
    # np.float32(0.003) was refused as not "a finite number of at least 0", and np.int64(8) as not an integer.
    path = tmp_path / "np.py"
    path.write_text("import numpy as np\nfrom sps_jax import config\n\ndef get_config():\n"
                    "    c = config.paper_config('xs', 'sps', 8)\n    with c.ignore_type():\n"
                    "        c.train.peak_lr = np.float32(0.5)\n        c.train.global_batch = np.int64(16)\n"
                    "        c.model.remat = np.bool_(True)\n    return c\n")
    config = sps_config.load_config(str(path), ["train.micro_batch=8"])
    sps_config.check_run_config(config)
    assert (config.train.peak_lr, config.train.global_batch, config.model.remat) == (0.5, 16, True)
    assert all(type(v) in (float, int, bool) for v in (config.train.peak_lr, config.train.global_batch,
                                                        config.model.remat))


@pytest.mark.parametrize("line, sentence", [
    ("c.model.window = np.int64(8)", r"field 'window' holds int values, and 8 is a numpy\.int64: set an int or None there"),
    ("c.model.num_layers = '2'", r"field 'num_layers' holds int values, and '2' is a str: set an int there"),
    # a field None may fill says so, as its override does (a text 'none' in the file is no None)
    ("c.model.window = 'none'", r"field 'window' holds int values, and 'none' is a str: set an int or None there"),
])
def test_a_value_of_another_type_set_on_a_field_says_which_type_the_field_takes(tmp_path, line, sentence):
    # Without ignore_type, ml_collections refuses the assignment itself, in its own words ("cannot be casted").
    path = tmp_path / "typed.py"
    path.write_text("import numpy as np\nfrom sps_jax import config\n\ndef get_config():\n"
                    f"    c = config.paper_config('xs', 'sps', 8)\n    {line}\n    return c\n")
    with pytest.raises(ValueError, match=rf"^get_config\(\) of {re.escape(str(path))} failed at line 6: {sentence} \(a "
                                         r"plain Python number: int\(value\)\)\.$"):
        sps_config.load_config(str(path))


@pytest.mark.parametrize("line, sentence", [
    # Both were told "(a plain Python number: str(value))", and the section its class's dotted name three times.
    ("c.model.variant = 5", "field 'variant' holds str values, and 5 is an int: set a str there."),
    ("c.train = 5", "'train' is a section of fields, and 5 is an int: set its fields instead of replacing it."),
])
def test_a_value_set_on_a_text_field_or_over_a_section_is_told_what_goes_there_not_a_number(tmp_path, line, sentence):
    assert_line_refused(tmp_path, line, sentence)


def assert_line_refused(tmp_path, line: str, sentence: str) -> None:
    """A config file whose ``get_config`` sets ``line`` on the xs paper config is refused, at that line, in ``sentence``."""
    path = tmp_path / "typed.py"
    path.write_text("from sps_jax import config\n\ndef get_config():\n"
                    f"    c = config.paper_config('xs', 'sps', 8)\n    {line}\n    return c\n")
    with pytest.raises(ValueError) as refusal:
        sps_config.load_config(str(path))
    assert str(refusal.value) == f"get_config() of {path} failed at line 5: {sentence}"


@pytest.mark.parametrize("line, sentence", [
    # ml_collections stores True on a float field as 1.0, and keeps it on an int field: the run trained at
    # peak_lr=1.0, where --config.train.peak_lr=True is refused.
    ("c.train.peak_lr = True", "field 'peak_lr' holds float values, and True is a bool: set a number there, not True "
                               "or False."),
    ("c.train.seed = False", "field 'seed' holds int values, and False is a bool: set an integer there, not True or "
                             "False."),
    ("c.model.window = True", "field 'window' holds int values, and True is a bool: set an integer there, not True or "
                              "False."),
])
def test_a_bool_set_on_a_number_field_in_a_config_file_is_refused_as_on_the_command_line(tmp_path, line, sentence):
    assert_line_refused(tmp_path, line, sentence)
    field = line.split(" = ")[0].removeprefix("c.")
    with pytest.raises(ValueError, match=rf"^override '{field}=True': the field takes an? (number|integer) "):
        sps_config.load_config("configs/paper.py:xs,sps,8", [f"{field}=True"])


@pytest.mark.parametrize("signature, spec_arg, sentence", [
    # Python's "get_config() missing 1 required positional argument: 'arg': fix the file." and "takes 0 positional
    # arguments but 1 was given: fix the file.": the spec, not the file, is what to change.
    ("arg", None, "get_config of {path} needs an argument: give it after ':' (--config {path}:ARG)."),
    ("", "s,sps", "get_config of {path} takes no argument, so the config's ':s,sps' cannot be passed to it: drop it "
                  "(--config {path}), or give get_config an argument."),
])
def test_a_config_argument_that_get_config_does_not_take_or_needs_is_said_of_the_spec(tmp_path, signature, spec_arg,
                                                                                       sentence):
    path = tmp_path / "takes.py"
    path.write_text(f"from sps_jax import config\n\ndef get_config({signature}):\n    return config.paper_config('xs')\n")
    with pytest.raises(ValueError) as refusal:
        sps_config.load_config(str(path) + (f":{spec_arg}" if spec_arg else ""))
    assert str(refusal.value) == sentence.format(path=path)
    # A default makes the argument optional: both specs load.
    path.write_text("from sps_jax import config\n\ndef get_config(arg='s'):\n    return config.paper_config(arg)\n")
    assert sps_config.load_config(str(path)).model.num_layers == 12
    assert sps_config.load_config(f"{path}:xs").model.num_layers == 8


def test_a_switch_a_config_file_sets_to_a_word_is_one_sentence():
    # train.tensorboard = "no" is truthy: TensorBoard stayed on without a word.
    config = sps_config.load_config("configs/tiny.py")
    with config.ignore_type():
        config.train.tensorboard = "no"
    with pytest.raises(ValueError, match=r"^train\.tensorboard='no' must be True or False\.$"):
        sps_config.check_run_config(config)


@pytest.mark.parametrize("name", ["None", "''"])
def test_a_run_name_that_names_nothing_is_one_sentence(name):
    # --config.name=None trained a run whose every log line began "None:".
    config = sps_config.load_config("configs/tiny.py", [f"name={name}"])
    with pytest.raises(ValueError, match=r"^name=(None|'') must name the run \(a non-empty string, as in its logs and "
                                         r"results\)\.$"):
        sps_config.check_run_config(config)


def test_a_section_no_run_reads_is_refused_and_the_known_ones_are_paper_configs():
    # c.optim = {"lr": 1.0} in a config file trained without it, and config.json then held it as if it had been read.
    assert sorted(sps_config.paper_config().keys()) == sorted(config_checks.RUN_FIELDS)
    for name, says in (("optim", r"'optim': a run reads only data, mesh, metrics, model, name, train; rename it, or "
                                 r"remove it\.$"), ("trian", r"'trian' \(did you mean 'train'\?\)")):
        config = sps_config.load_config("configs/tiny.py")
        config[name] = {"lr": 1.0}
        with pytest.raises(ValueError, match=rf"^the config has no section or field {says}"):
            sps_config.check_run_config(config)


@pytest.mark.parametrize("section, field", [("train", "peak_learning_rate"), ("data", "val_window"),
                                            ("mesh", "tensor"), ("metrics", "wandb_projekt")])
def test_a_field_set_in_python_that_no_run_reads_is_refused(section, field):
    # Set in a notebook, a misspelt train field was ignored and the run trained with the default (an unknown
    # model field was already refused, and so was every --config override).
    config = sps_config.load_config("configs/tiny.py")
    config[section][field] = 1
    with pytest.raises(ValueError, match=rf"^config\.{section} has no field '{field}'.*: a run reads only the fields "
                                         rf"of sps_jax\.config\.{section}_config\(\); rename it, or remove it\.$"):
        sps_config.check_run_config(config)


def test_window_zero_is_a_window_and_only_a_negative_one_or_one_past_the_limit_is_refused():
    assert sps_config.parse_window("0") == 0
    assert sps_config.parse_window(str(masks.MAX_WINDOW)) == masks.MAX_WINDOW
    assert sps_config.parse_window("None") is None
    for text in ("-1", str(masks.MAX_WINDOW + 1), "2.5", "w"):
        with pytest.raises(ValueError, match=r"must be an integer from 0 to"):
            sps_config.parse_window(text)
    # A scale given to configs/tiny.py (which takes none) was read as its window without saying what it takes.
    with pytest.raises(ValueError, match=r"^window 'sps' must be an integer from 0 to \d+ \(or 'none' for unbounded\): "
                                         r"the config's argument is VARIANT\[,WINDOW\]\.$"):
        sps_config.load_config("configs/tiny.py:s,sps")


def test_a_text_field_takes_an_override_that_reads_as_a_number_as_text():
    # A folder named 2024 and a run named 123: the literal's int would not be a path or a name.
    config = sps_config.load_config("configs/tiny.py", ["--config.data.dir=2024", "--config.name=123"])
    assert config.data.dir == "2024" and config.name == "123"


@pytest.mark.parametrize("field", ["b1", "b2"])
def test_an_adam_beta_of_one_is_refused_and_one_just_below_it_accepted(field):
    # A beta of 1 divides by zero in AdamW's bias correction (1 - beta ** t): their range is [0, 1).
    from sps_jax.cli import UserError

    config = sps_config.load_config("configs/tiny.py", [f"--config.train.{field}=1.0"])
    with pytest.raises(UserError, match=rf"^train\.{field}=1\.0 must be a finite number in \[0, 1\)\.$"):
        sps_config.check_run_config(config)
    sps_config.check_run_config(sps_config.load_config("configs/tiny.py", [f"--config.train.{field}=0.9999"]))


def test_a_model_section_missing_a_field_of_what_the_model_is_is_refused(tmp_path):
    # A config file whose model section left out window trained the paper's default w=64 without a word (where a
    # missing train field is refused); how the model is computed (attention, remat, ...) may be left out.
    path = tmp_path / "partial.py"
    path.write_text("import ml_collections\n"
                    "from sps_jax import config as sps_config\n\n"
                    "def get_config():\n"
                    "    config = sps_config.load_config('configs/tiny.py')\n"
                    "    fields = config.model.to_dict()\n"
                    "    del fields['window'], fields['d_ff'], fields['attention'], fields['remat']\n"
                    "    config.model = ml_collections.ConfigDict(fields)\n"
                    "    return config\n")
    config = sps_config.load_config(str(path))
    with pytest.raises(ValueError) as refusal:
        sps_config.check_run_config(config)
    assert str(refusal.value) == ("the config's model section has no d_ff, window: set them "
                                  "(sps_jax.config.model_section(variant, window, **fields) gives every field), where a "
                                  "default would describe another model.")
    config.model.d_ff, config.model.window = 192, 8
    sps_config.check_run_config(config)  # attention and remat take their defaults


def test_config_field_names_are_unique_across_sections_and_field_paths_names_every_one():
    """A flag such as --attention is told its one override: no field name may sit in two sections, and field_paths,
    which reads the model's fields without jax, has the paths of the config the model builds."""
    config = sps_config.paper_config()
    paths = [f"{s}.{k}" for s in config_checks.RUN_FIELDS if isinstance(config[s], ml_collections.ConfigDict)
             for k in config[s]]
    assert sorted(sps_config.field_paths().values()) == sorted(paths)
    assert sps_config.field_paths()["attention"] == "model.attention"
    assert sps_config.field_paths()["micro_batch"] == "train.micro_batch"


def test_an_override_of_a_number_field_set_to_none_takes_the_kind_of_number_the_field_holds():
    # A field set to None took any literal: persistent_window=1e3 was the float 1000.0 where window=1e3 is 1000, and
    # {} an empty section, which the refusal printed over two lines.
    config = sps_config.load_config("configs/tiny.py", ["model.persistent_window=1e3", "train.grad_clip=None",
                                                        "train.peak_flops_per_device=2e14"])
    assert config.model.persistent_window == 1000 and isinstance(config.model.persistent_window, int)
    assert config.train.grad_clip is None and config.train.peak_flops_per_device == 2e14
    for item, takes in (("train.peak_flops_per_device=[1]", "a number or None (its value is None), not '[1]'."),
                        ("train.init_from={}", "a value, not the section of fields '{}'."),
                        ("model.window={'a': 1}", "a value, not the section of fields \"{'a': 1}\".")):
        with pytest.raises(ValueError) as refusal:
            sps_config.load_config("configs/tiny.py", [item])
        assert str(refusal.value) == f"override {item!r}: the field takes {takes}"


def test_an_override_of_a_number_field_none_may_fill_takes_none_in_any_case_as_the_config_argument_does():
    # configs/tiny.py:sps,none took 'none' where --config.model.window=none was refused as no integer.
    config = sps_config.load_config("configs/tiny.py", ["model.window=none", "model.persistent_window=NONE",
                                                        "train.grad_clip=None", "train.peak_flops_per_device=none"])
    assert (config.model.window, config.model.persistent_window) == (None, None)
    assert (config.train.grad_clip, config.train.peak_flops_per_device) == (None, None)
    assert config.name == "tiny-sps-wnone"
    # the window's other words for unbounded, as configs/tiny.py:sps,inf takes them
    for word in ("inf", "Unbounded"):
        assert sps_config.load_config("configs/tiny.py", [f"model.window={word}"]).model.window is None
    with pytest.raises(ValueError) as refusal:  # a word no number field takes, told that None is one of its values
        sps_config.load_config("configs/tiny.py", ["train.grad_clip=off"])
    assert str(refusal.value) == ("override 'train.grad_clip=off': the field takes a number or None (its value is 1.0), "
                                  "not 'off'.")


def test_an_override_of_a_text_field_keeps_none_as_text_and_only_the_literal_None_unsets_it():
    # A folder or a W&B entity may be named none: on a text field the word is text, as 2024 is (data.dir=2024).
    config = sps_config.load_config("configs/tiny.py", ["metrics.wandb_entity=none", "train.init_from=NONE",
                                                        "metrics.wandb_name=None"])
    assert (config.metrics.wandb_entity, config.train.init_from, config.metrics.wandb_name) == ("none", "NONE", None)
