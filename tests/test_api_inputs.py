"""What a notebook passes to the Python API: the values a command line cannot send (jax scalars, traced sizes, a
dict for a ConfigDict, the weights as inference holds them) either work as the documented kind does or are one
sentence naming the argument, before any work."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import cli, config as sps_config, export_torch, flops, masks, optim, runs, torch_layout, trainer
from sps_jax import model as sps_model
from sps_jax.bench import smoke
from sps_jax.evaluation import paper_tasks
from sps_jax.inference import completions, decoding
from tests.helpers import small_model


def test_the_schedule_takes_traced_sizes_and_a_dict_of_the_train_section():
    # max() of a traced warmup failed with TracerBoolConversionError; a dict failed on attribute access.
    t = sps_config.load_config("configs/tiny.py").train
    sizes = dict(peak_lr=t.peak_lr, final_lr=t.final_lr, decay_fraction=t.decay_fraction)
    tokens = np.array([0.0, 5e3, 2e4, 3e5])
    want = optim.learning_rate(tokens, warmup_tokens=t.warmup_tokens, total_tokens=t.total_tokens, **sizes)
    got = jax.jit(lambda w, n: optim.learning_rate(tokens, warmup_tokens=w, total_tokens=n, **sizes))(
        t.warmup_tokens, t.total_tokens)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # By hand: half of the 20480-token warmup is half the peak; the schedule's update 3 of 1024 tokens is 3072 tokens.
    assert float(want[1]) == pytest.approx(t.peak_lr * 5e3 / 20480)
    assert float(optim.schedule(t.to_dict(), 1024)(3)) == pytest.approx(t.peak_lr * 3072 / 20480)
    assert float(optim.schedule(t.to_dict(), 1024)(3)) == float(optim.schedule(t, 1024)(3))


def test_counts_of_a_size_known_only_when_traced_are_one_sentence():
    # The cache hashed the tracer first: "unhashable type: 'DynamicJaxprTracer'".
    with pytest.raises(ValueError, match=r"^seq_len must be a positive integer, got \w*Trac"):
        jax.jit(lambda T: flops.visible_keys_per_position(masks.Visibility("sps", 4), T))(16)


@pytest.mark.parametrize("rng, says", [(None, "a NoneType"), (jnp.zeros(3, jnp.uint32), "shape (3,) of uint32"),
                                       (jnp.zeros(2, jnp.int32), "shape (2,) of int32"),
                                       (jax.random.split(jax.random.key(0)), "shape (2,) of key<fry>")])
def test_an_rng_that_is_not_one_key_is_one_sentence(rng, says):
    _, net, _ = small_model("sps", 2)
    with pytest.raises(TypeError) as refusal:  # flax's InvalidRngError named no fix
        sps_model.init_params(net, rng)
    assert str(refusal.value) == (f"rng must be one jax PRNG key, got {says}: pass jax.random.PRNGKey(seed) (or "
                                  "jax.random.key(seed)).")
    # Both kinds of one key initialise the same weights.
    a, b = (sps_model.init_params(net, key) for key in (jax.random.PRNGKey(3), jax.random.key(3)))
    jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)


def test_saving_or_exporting_takes_the_stored_weights_of_a_run_config_only(tmp_path):
    # The weights as inference holds them (bf16 matrices) were exported and saved as if stored: the "exact" float32
    # export was rounded without a word; a ModelConfig for the config failed with "has no attribute 'model'".
    config = sps_config.load_config("configs/tiny.py", ["--config.model.dtype=bfloat16"])
    cfg = sps_model.ModelConfig.from_config(config.model)
    params = sps_model.init_params(sps_model.Transformer(cfg), jax.random.PRNGKey(0))
    held = sps_model.compute_params(params, cfg)
    says = (r"^parameter \['block_0'\]\['attn'\]\['\w+'\] is bfloat16, where model\.param_dtype=float32: pass the "
            r"weights as stored \(runs\.load_model\), not as inference holds them")
    for call in (lambda: export_torch.checkpoint_dict(config, held, 1),
                 lambda: runs.save_run(str(tmp_path / "run"), config, held, 1)):
        with pytest.raises(ValueError, match=says):
            call()
    assert not (tmp_path / "run").exists()
    for wrong in (cfg, config.to_dict()):
        with pytest.raises(TypeError, match=rf"^config must be a run's ConfigDict \(with its model section\), got a "
                                            rf"{type(wrong).__name__}: pass sps_jax\.config\.load_config"):
            export_torch.checkpoint_dict(wrong, params, 1)
    assert export_torch.checkpoint_dict(config, params, 1)[torch_layout.STEP] == 1


def test_commands_functions_name_the_argument_a_notebook_got_wrong(tmp_path):
    config = sps_config.load_config("configs/tiny.py")
    cases = [
        (lambda: smoke.smoke(config.model), TypeError,
         "config must be a run config with a model section, got a ConfigDict: pass sps_jax.config.load_config(...) "
         "whole."),
        (lambda: smoke.smoke(config, variants="sps"), TypeError,
         "variants must be a list of variant names, got the str 'sps': pass ['sps']."),
        (lambda: trainer.train(config, str(tmp_path / "run"), log=None), TypeError,
         "log must be a function of one line of text (print, say), got None."),
        (lambda: completions.encode(config.model, [[464]], 5), TypeError,
         "prompt 0 must be a text (str), got a list: pass the text (token ids go to decoding.generate)."),
        (lambda: sps_config.load_config("configs/tiny.py", "--config.model.dtype=bfloat16"), ValueError,
         "overrides must be a list of 'a.b=value' strings, not the string '--config.model.dtype=bfloat16': pass "
         "['--config.model.dtype=bfloat16']."),
        # None failed on "'NoneType' object is not iterable", here as in decoding.generate.
        (lambda: completions.encode(config.model, None, 5), TypeError,
         "prompts must be a list of texts, got a NoneType: pass e.g. ['The module']."),
        (lambda: decoding.generate(config.model, None, None, 5), TypeError,
         "prompts must be a list of prompts of token ids, got a NoneType: pass e.g. [[464, 8265]]."),
        # expand('paper') was the tasks 'p', 'a', 'e', 'r'; None failed on "'NoneType' object is not iterable".
        (lambda: paper_tasks.expand("paper"), TypeError,
         "names must be a list of tasks and groups, not the string 'paper': pass e.g. ['paper'] or "
         "['arc_easy,wikitext']."),
        (lambda: paper_tasks.expand(None), TypeError,
         "names must be a list of tasks and groups, not a NoneType: pass e.g. ['paper'] or ['arc_easy,wikitext']."),
    ]
    for call, kind, sentence in cases:
        with pytest.raises(kind) as refusal:
            call()
        assert str(refusal.value) == sentence
    assert not (tmp_path / "run").exists()


def test_a_function_names_the_argument_a_notebook_passed_where_its_command_names_the_flag(tmp_path, monkeypatch):
    from sps_jax import run_files
    from sps_jax.analysis import figures
    from sps_jax.bench import train as bench_train
    from sps_jax.data import corpus, prepare
    from sps_jax.evaluation import evaluate, val_nll

    cases = [
        (lambda: val_nll.windows(1000, 32, 31),
         "max_tokens 31 is less than one window, which scores seq_len=32 tokens: raise max_tokens to at least 32.",
         "--val-tokens 31 is less than one window, which scores seq_len=32 tokens: raise --val-tokens to at least 32."),
        (lambda: figures.seed_variance(["a", "b"], str(tmp_path / "s.png"), margin=float("inf")),
         "margin inf is not a positive finite NLL difference: pass one such as 0.01.",
         "--margin inf is not a positive finite NLL difference: pass one such as 0.01."),
        (lambda: paper_tasks.check_known(["no_such_task"], []), "add include_path=DIR for your own YAMLs.",
         "add --include-path DIR for your own YAMLs."),
        (lambda: paper_tasks.check_task_path("arc_easy", str(tmp_path)),
         "pass the path of the task's .jsonl/.json(.gz) or .parquet file, as task_data={'arc_easy': FILE}.",
         "pass the path of the task's .jsonl/.json(.gz) or .parquet file, as --task-data arc_easy=FILE."),
        (lambda: corpus.check_options("builtin", hf_split="test"),
         "hf_split='test' picks a split of a hf:NAME source, and source 'builtin' is not one: drop hf_split, or pass "
         "the dataset as hf:NAME[:CONFIG].",
         "--hf-split test picks a split of a hf:NAME source, and source 'builtin' is not one: drop --hf-split, or pass "
         "the dataset as hf:NAME[:CONFIG]."),
        (lambda: export_torch.checkpoint_dict(None, None, 0, dtype="float8"),
         "dtype 'float8' (did you mean 'float32'?) must be one of float32, bfloat16.",
         "--dtype 'float8' (did you mean 'float32'?) must be one of float32, bfloat16."),
        (lambda: bench_train.check_steps(2147483647, 1),
         "warmup 1 + steps 2147483647 steps pass step 2147483647, the last step a run can reach (AdamW counts "
         "updates in int32): lower them.",
         "--warmup 1 + --steps 2147483647 steps pass step 2147483647, the last step a run can reach (AdamW counts "
         "updates in int32): lower them."),
        (lambda: run_files.checkpoint_step(str(tmp_path / "run" / "checkpoints" / "3"), 5),
         "but step 5 was asked for (step): pass the run folder with step, or the checkpoint alone.",
         "but step 5 was asked for (--step): pass the run folder with --step, or the checkpoint alone."),
        (lambda: prepare.prepare("builtin", str(tmp_path / "notes.txt")),
         f"out {tmp_path / 'notes.txt'} is a file, not a folder: pass the folder to write the token files into.",
         f"--out {tmp_path / 'notes.txt'} is a file, not a folder: pass the folder to write the token files into."),
        (lambda: export_torch.check_output(str(tmp_path / "model.txt")),
         f"out {str(tmp_path / 'model.txt')!r} must end in .pt (torch) or .safetensors.",
         f"--out {str(tmp_path / 'model.txt')!r} must end in .pt (torch) or .safetensors."),
    ]
    (tmp_path / "run" / "checkpoints" / "3").mkdir(parents=True)
    (tmp_path / "run" / "config.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("not a token folder")
    for call, python, command in cases:
        with pytest.raises(ValueError) as refusal:
            call()
        assert str(refusal.value).endswith(python), refusal.value
        with monkeypatch.context() as inside:
            inside.setattr(cli, "_nesting", 1)  # as while a command's main runs
            with pytest.raises(ValueError) as refusal:
                call()
        assert str(refusal.value).endswith(command), refusal.value
    # evaluate refuses task files without tasks as it parses; evaluate_checkpoint said "--task-data needs --tasks".
    with pytest.raises(ValueError, match=r"^task_data needs keys naming those tasks\.$"):
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), val_data=str(tmp_path / "data"),
                                     task_data={"arc_easy": str(tmp_path / "arc.jsonl")})
    assert not (tmp_path / "s.png").exists()


def test_import_checkpoint_reads_overrides_as_a_list_before_the_file(tmp_path):
    # One string was read a character at a time: "override '-' must look like --config.a.b=value".
    from sps_jax import import_torch

    with pytest.raises(ValueError, match=r"^overrides must be a list of 'a\.b=value' strings, not the string"):
        import_torch.import_checkpoint(str(tmp_path / "missing.pt"), str(tmp_path / "out"),
                                       overrides="--config.model.dtype=bfloat16")


def test_a_raw_key_of_the_prng_implementation_chosen_later_is_one_key():
    # The expected raw key was fixed at first use: after switching to rbg (uint32 [4] keys) a valid key was refused.
    _, net, _ = small_model("sps", 2)
    sps_model.check_rng(jax.random.PRNGKey(0))
    before = jax.config.jax_default_prng_impl
    try:
        jax.config.update("jax_default_prng_impl", "rbg")
        sps_model.check_rng(jax.random.PRNGKey(0))
        with pytest.raises(TypeError, match=r"got shape \(2,\) of uint32"):
            sps_model.check_rng(jnp.zeros(2, jnp.uint32))
    finally:
        jax.config.update("jax_default_prng_impl", before)


def test_document_ids_of_the_wrong_kind_are_one_sentence_wherever_they_go():
    # dense_mask refused float ids, while block_tables.tables made tables of them; a list was "got shape None" or
    # failed on .shape, and score_counts of a 1-D array raised IndexError.
    from sps_jax import block_tables, kernel_tuning, pallas_attention, splash_attention

    vis = masks.Visibility("sps", 4)
    says = r"^doc_ids_BT must be an integer array of shape \[batch, positions\], got float32 of shape \(1, 8\)"
    calls = [lambda d: masks.dense_mask(vis, d), lambda d: block_tables.tables(d, vis, 8, 8),
             lambda d: block_tables.row_intervals(d, vis), block_tables.doc_bounds,
             lambda d: pallas_attention.score_counts(d, vis, kernel_tuning.default_tuning(64, 2)),
             lambda d: splash_attention.score_counts(d, vis)]
    for call in calls:
        with pytest.raises(ValueError, match=says):
            call(np.zeros((1, 8), np.float32))
        with pytest.raises(ValueError, match=r"got int64 of shape \(8,\): add a batch axis with x\[None\]"):
            call(np.zeros(8, np.int64))
    # A nested list is the array it spells: the same tables as from numpy.
    want = block_tables.tables(np.zeros((1, 8), np.int32), vis, 8, 8)
    got = block_tables.tables([[0] * 8], vis, 8, 8)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def test_block_tables_of_a_rule_or_padding_they_cannot_use_are_one_sentence():
    # row_intervals of a variant's name failed on "'str' object has no attribute 'num_streams'", a padded_len below
    # the positions on numpy's "index can't contain negative values", a fractional one on "`pad_width` must be of
    # integral type" (tables' too), and round_up by 0 on a ZeroDivisionError.
    from sps_jax import block_tables

    doc, vis = np.zeros((1, 8), np.int32), masks.Visibility("sps", 4)
    with pytest.raises(TypeError, match=r"^vis must be a masks\.Visibility, not str 'sps': pass e\.g\. "):
        block_tables.row_intervals(doc, "sps")
    for call in (lambda n: block_tables.row_intervals(doc, vis, padded_len=n),
                 lambda n: block_tables.tables(doc, vis, 8, 8, padded_len=n)):
        with pytest.raises(ValueError, match=r"^padded_len=4 must be at least the 8 positions"):
            call(4)
        for n in (8.5, 16.0, "16", True):
            with pytest.raises(ValueError, match=rf"^padded_len={re.escape(repr(n))} must be an integer number of "
                                                 r"positions, or None\.$"):
                call(n)
    with pytest.raises(ValueError, match=r"^multiple must be a positive integer, got 0\.$"):
        block_tables.round_up(8, 0)
    # A numpy integer pads as the int it holds.
    for a, b in zip(block_tables.row_intervals(doc, vis, padded_len=np.int64(16)),
                    block_tables.row_intervals(doc, vis, padded_len=16)):
        np.testing.assert_array_equal(a, b)


def test_jax_scalars_count_where_python_numbers_do():
    # Sampling(temperature=jnp.float32(0.8)) and mfu(num_devices=jnp.int32(1)) were refused ("must be a number"); a
    # jax array in a Sampling is no hashable static argument of the decode loop.
    from sps_jax.inference.sampling import Sampling

    s = Sampling(jnp.float32(0.5), jnp.int32(3), np.float64(0.9))
    s.validate()
    assert s == Sampling(0.5, 3, 0.9) and hash(s) == hash(Sampling(0.5, 3, 0.9))
    cfg, _, _ = small_model("sps", 2)
    assert flops.mfu(cfg, 100.0, jnp.int32(2), 1e12) == flops.mfu(cfg, 100.0, 2, 1e12)


@pytest.mark.parametrize("seed", [jax.random.key(0), jax.random.PRNGKey(0)])
def test_a_key_where_generation_takes_a_seed_is_one_line(seed):
    # The key's repr ran over two lines ("Array((), dtype=key<fry>) overlaying: [0 0]").
    from sps_jax.inference import decoding

    cfg, _, params = small_model("sps", 2)
    with pytest.raises(TypeError) as refusal:
        decoding.generate(cfg, params, [[1, 2]], 2, seed=seed)
    assert str(refusal.value) == (f"seed must be an integer, got a jax array of shape {tuple(seed.shape)}: pass the "
                                  "int a key is made from, e.g. seed=0.")


def test_yes_no_arguments_are_true_or_false_before_anything_is_replaced(tmp_path):
    # "no" is truthy: import_checkpoint(force="no") deleted a folder holding the user's file, prepare rebuilt a token
    # folder over another, and trust_pickle="no" unpickled the file.
    from sps_jax import import_torch
    from sps_jax.data import prepare

    held = tmp_path / "held"
    held.mkdir()
    (held / "keep.txt").write_text("mine")
    config = sps_config.load_config("configs/tiny.py")
    calls = [(lambda: import_torch.import_checkpoint(str(tmp_path / "m.pt"), str(held), force="no"), "force", "'no'"),
             (lambda: import_torch.import_checkpoint(str(tmp_path / "m.pt"), str(tmp_path / "new"), trust_pickle="no"),
              "trust_pickle", "'no'"),
             (lambda: prepare.prepare(str(tmp_path / "corpus.txt"), str(held), force=1), "force", "1"),
             (lambda: trainer.train(config, str(held), force="yes"), "force", "'yes'"),
             (lambda: export_torch.export_run(str(tmp_path), str(tmp_path / "m.pt"), force=0), "force", "0")]
    for call, name, shown in calls:
        with pytest.raises(TypeError) as refusal:
            call()
        assert str(refusal.value) == f"{name} must be True or False, got {shown}."
    assert sorted(p.name for p in tmp_path.iterdir()) == ["held"]
    assert [p.name for p in held.iterdir()] == ["keep.txt"]


def test_the_model_refuses_the_params_of_a_deeper_model():
    # They ran in the shallower config without a word: flax ignores extra parameters.
    cfg, net, params = small_model("sps", 2)
    tokens = np.array([[1, 2, 3]], np.int32)
    with pytest.raises(ValueError) as refusal:
        net.apply({"params": small_model("sps", 2, num_layers=3)[2]}, tokens)
    assert str(refusal.value) == ("params do not match the model: they hold 'block_2', which a model of "
                                  "model.num_layers=2 has not; pass the params of this config's model "
                                  "(runs.load_model gives a run's model and params).")
    assert net.apply({"params": params}, tokens).shape == (1, 3, cfg.vocab_size)


@pytest.mark.filterwarnings("error::DeprecationWarning")  # jnp.shape of a list, which a later jax refuses
def test_the_dense_attention_holds_the_kernels_contract():
    # Mismatched k or doc ids failed in jax's reshape or broadcasting words, a str visibility as an AttributeError.
    from sps_jax import attention

    vis = masks.Visibility("sps", 4)
    q, doc = jnp.ones((1, 4, 2, 2, 8)), np.zeros((1, 4), np.int32)
    cases = [((q, jnp.ones((1, 5, 2, 2, 8)), q, doc, vis), ValueError,
              "q, k and v must have the same shape, got (1, 4, 2, 2, 8), (1, 5, 2, 2, 8), (1, 4, 2, 2, 8)."),
             ((q, q, q, np.zeros((2, 4), np.int32), vis), ValueError, "doc_ids_BT must be [B, T] = (1, 4), got (2, 4)."),
             ((q[:, :, 0], q[:, :, 0], q[:, :, 0], doc, vis), ValueError,
              "q must be [B, T, S=2, H, K] for variant 'sps', got shape (1, 4, 2, 8)."),
             ((q, q, q, doc, "sps"), TypeError, "vis must be a masks.Visibility, not str 'sps': pass e.g. masks.Visibility('sps', window=64).")]
    for backend in (attention.xla_attention, attention.rounded_attention):
        for args, kind, sentence in cases:
            with pytest.raises(kind) as refusal:
                backend(*args)
            assert str(refusal.value) == sentence
    # Ids as a nested list are still the array they spell.
    np.testing.assert_array_equal(attention.xla_attention(q, q, q, [[0, 0, 1, 1]], vis),
                                  attention.xla_attention(q, q, q, np.array([[0, 0, 1, 1]]), vis))


def test_the_probes_take_a_list_of_documents_and_say_what_else_they_got():
    # One document for the list failed in len() or an IndexError, float ids were read as integers (1.5 as 1), a
    # [1, L] row was "no document has 1 source positions", log=None failed after the first batch, offsets=4 was
    # "'int' object is not iterable" and seed=-1 numpy's "expected non-negative integer".
    from sps_jax.analysis import probes

    _, net, params = small_model("sps", 2)
    doc = (np.arange(20) % 50).astype(np.int32)
    quiet = lambda line: None  # noqa: E731
    for call in (lambda docs, log=quiet: probes.gradient_curve(net, params, docs, [0, 1], 1, log=log),
                 lambda docs, log=quiet: probes.window_nll_curve(net, params, docs, 2, log=log)):
        for docs, got in ((doc, "int32 of shape ()"), ([doc + 0.5], "float64 of shape (20,)"),
                          ([doc[None]], "int32 of shape (1, 20)"), ([[]], "float64 of shape (0,)")):
            with pytest.raises(ValueError) as refusal:
                call(docs)
            assert str(refusal.value) == (f"docs[0] must be one document, a non-empty 1-D array of integer token ids, "
                                          f"got {got}: pass a list of documents (analysis.documents.read_documents "
                                          "gives them).")
        with pytest.raises(TypeError, match=r"^log must be a function of one line of text \(print, say\), got None\.$"):
            call([doc], log=None)
    for kwargs, kind, sentence in ((dict(offsets=4), TypeError,
                                    "offsets must be a list of offsets k, got 4: pass e.g. [4] or range(0, 65)."),
                                   (dict(offsets=[0, 1], seed=-1), ValueError, "seed must be at least 0, got -1.")):
        with pytest.raises(kind) as refusal:
            probes.gradient_curve(net, params, [doc], positions_per_doc=1, log=quiet, **kwargs)
        assert str(refusal.value) == sentence
    # A tuple of documents is the list it holds (window_nll had concatenated it with a list).
    want = probes.window_nll_curve(net, params, [doc, doc[:12]], 2, log=quiet)
    got = probes.window_nll_curve(net, params, (doc, doc[:12]), 2, log=quiet)
    assert (got["count"], got["mean_nll"]) == (want["count"], want["mean_nll"])


def test_complete_takes_names_as_a_list_and_prompts_from_any_iterable():
    # names="ab" named two prompts "a" and "b" without a word; a generator of prompts failed in len().
    cfg = sps_config.load_config("configs/tiny.py").model
    with pytest.raises(TypeError) as refusal:
        completions.encode(cfg, ["The", "A"], 2, names="ab")
    assert str(refusal.value) == "names must be a list of one name per prompt, got the str 'ab': pass ['ab']."
    assert completions.encode(cfg, (text for text in ["The", "A"]), 2) == completions.encode(cfg, ["The", "A"], 2)


def test_verify_takes_a_path_object(tmp_path):
    # pathlib.Path failed in shlex.quote ("expected string or bytes-like object") before any check.
    from sps_jax.data import loader
    from tests.helpers import write_token_folder

    folder = write_token_folder(tmp_path / "tokens")
    assert loader.verify(folder, 64) == loader.verify(str(folder), 64)


def test_smoke_refuses_a_bad_count_seed_variants_or_log_before_compiling():
    # batch_size=0 stopped in jax's IndexError, 2.0 in "Shapes must be 1D sequences", seed="0" in str + int, no
    # variants in "max() arg is an empty sequence" and log=None only after the first variant's compiling.
    config = sps_config.load_config("configs/tiny.py")
    cases = [(dict(batch_size=0), ValueError, "batch_size must be at least 1, got 0."),
             (dict(batch_size=2.0), TypeError, "batch_size must be an integer, got 2.0."),
             (dict(seed="0"), TypeError, "seed must be an integer, got '0'."),
             (dict(variants=[]), ValueError,
              "variants is empty: pass at least one of standard, sps, two_x_memory, delayed_state, reverse_sps."),
             (dict(log=None), TypeError, "log must be a function of one line of text (print, say), got None.")]
    for kwargs, kind, sentence in cases:
        with pytest.raises(kind) as refusal:
            smoke.smoke(config, **{"variants": ["standard"], **kwargs})
        assert str(refusal.value) == sentence


def test_the_train_bench_refuses_its_step_counts_before_compiling():
    # steps=0 was an UnboundLocalError and 1.5 a TypeError, both after compiling; warmup=-1 was taken as 0.
    from sps_jax.bench import train as bench_train

    config = sps_config.load_config("configs/tiny.py")
    for steps, warmup, kind, sentence in ((0, 1, ValueError, "steps must be at least 1, got 0."),
                                          (1.5, 1, TypeError, "steps must be an integer, got 1.5."),
                                          (2, -1, ValueError, "warmup must be at least 0, got -1.")):
        with pytest.raises(kind) as refusal:
            bench_train.bench_variant(config, steps, warmup)
        assert str(refusal.value) == sentence


def test_overrides_that_are_no_list_of_strings_are_one_sentence(tmp_path):
    # None was "'NoneType' object is not iterable", a dict was read key by key ("override 'model.window' must look
    # like ..."), (key, value) pairs stopped in removeprefix, and a generator's overrides were read once of twice.
    from sps_jax import import_torch

    must = "overrides must be a list of 'a.b=value' strings"
    cases = [(None, f"{must}, got None: pass e.g. ['model.window=8'], or [] for none."),
             ({"model.window": 8}, f"{must}, got a dict: pass e.g. ['model.window=8'], or [] for none."),
             ([("model.window", 8)], f"{must}, got the tuple ('model.window', 8) among them: write each as one "
                                     "string, e.g. 'model.window=8'.")]
    for overrides, sentence in cases:
        for call in (lambda: sps_config.load_config("configs/tiny.py", overrides),
                     lambda: import_torch.import_checkpoint(str(tmp_path / "missing.pt"), str(tmp_path / "out"),
                                                            overrides=overrides)):
            with pytest.raises(ValueError) as refusal:
                call()
            assert str(refusal.value) == sentence
    config = sps_config.load_config("configs/tiny.py", (item for item in ["model.window=8", "name=mine"]))
    assert (config.model.window, config.name) == (8, "mine")


def test_import_checkpoint_refuses_head_counts_and_contexts_that_are_none_before_the_file(tmp_path):
    # num_heads="2" stopped in "unsupported operand type(s) for //"; 0 heads or positions were read as the file's.
    from sps_jax import import_torch

    for kwargs, kind, sentence in ((dict(num_heads="2"), TypeError, "num_heads must be an integer, got '2'."),
                                   (dict(num_heads=0), ValueError, "num_heads must be at least 1, got 0."),
                                   (dict(seq_len=0), ValueError, "seq_len must be at least 1, got 0.")):
        with pytest.raises(kind) as refusal:  # the file is missing: the arguments are checked first
            import_torch.import_checkpoint(str(tmp_path / "missing.pt"), str(tmp_path / "out"), **kwargs)
        assert str(refusal.value) == sentence
    assert sorted(tmp_path.iterdir()) == []


def test_import_checkpoint_refuses_a_variant_window_step_or_override_of_no_run_before_the_file(tmp_path):
    # Each was refused only once the whole checkpoint file was read and converted (gigabytes at the paper's scales).
    from sps_jax import import_torch

    variants = "standard, sps, two_x_memory, delayed_state, reverse_sps"
    for kwargs, kind, sentence in (
            (dict(variant="bogus"), ValueError, f"unknown attention variant 'bogus': choose one of {variants}."),
            (dict(window=-1), ValueError, "window must be an integer from 0 to 2147483647 or None (unbounded), got -1."),
            (dict(step=-1), ValueError, "step=-1 must be 0 or more: checkpoints are numbered by training step."),
            (dict(step="3"), TypeError, "step must be an integer, got '3'."),
            (dict(overrides=["model.bogus=1"]), ValueError, "override 'model.bogus=1': config.model has no field "
                                                            "'bogus': its fields are attention, ")):
        with pytest.raises(kind) as refusal:  # the file is missing: the arguments are checked first
            import_torch.import_checkpoint(str(tmp_path / "missing.pt"), str(tmp_path / "out"), **kwargs)
        assert str(refusal.value).startswith(sentence), refusal.value
    assert sorted(tmp_path.iterdir()) == []


def test_prepare_refuses_a_batch_of_no_documents_and_a_log_that_is_no_function_before_writing(tmp_path):
    # batch_documents=0 and -1 were taken (no batch ever full: the whole corpus held at once) and 2.0 too; log=None
    # failed after the folder was written.
    from sps_jax.data import prepare

    source = tmp_path / "corpus.txt"
    source.write_text("One document.\n\nAnother one.\n")
    cases = [(dict(batch_documents=0), ValueError, "batch_documents must be at least 1, got 0."),
             (dict(batch_documents=-1), ValueError, "batch_documents must be at least 1, got -1."),
             (dict(batch_documents=2.0), TypeError, "batch_documents must be an integer, got 2.0."),
             (dict(log=None), TypeError, "log must be a function of one line of text (print, say), got None.")]
    for kwargs, kind, sentence in cases:
        with pytest.raises(kind) as refusal:
            prepare.prepare(str(source), str(tmp_path / "tokens"), **kwargs)
        assert str(refusal.value) == sentence
        assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


def test_the_results_table_takes_the_rows_load_returns_and_says_so():
    # A dict, a str or a list of paths was walked key by key or character by character: "row 0 of the table's rows
    # is not a result of ...: it is not an object".
    from sps_jax.evaluation import results_table

    for rows, got in (({"variant": "sps", "step": 1}, "a dict"), ("results.json", "a str"),
                      (["a.json", "b.json"], "a list holding the str 'a.json'")):
        for table in (results_table.markdown_both, results_table.latex_both):
            with pytest.raises(TypeError) as refusal:
                table(rows)
            assert str(refusal.value) == (f"rows must be a list of results (dicts), got {got}: pass "
                                          "results_table.load(paths).")
    # Rows from any iterable are the list they hold: both tables of a generator hold its row.
    row = {"variant": "sps", "step": 1, "scale": "xs", "val_nll": 3.25}
    assert results_table.markdown_both(r for r in [row]).count("| XS | SPS |") == 2


def test_gains_over_baseline_says_it_takes_the_evaluations_read_not_their_paths():
    # Paths stopped in "'str' object has no attribute 'get'".
    from sps_jax.analysis import figures

    with pytest.raises(TypeError) as refusal:
        figures.gains_over_baseline(["eval/step_100.json"])
    assert str(refusal.value) == ("evaluations must be a list of results (dicts), got a list holding the str "
                                  "'eval/step_100.json': pass [figures.read_evaluation(path) for path in paths], or "
                                  "call figures.accuracy_gain(paths, out) for the figure.")


@pytest.mark.parametrize("eos_id", [None, "50256", 2.0])
def test_document_ids_refuse_an_eos_id_that_is_no_integer(eos_id):
    # No token equals None or "50256": every row was one document without a word.
    with pytest.raises(TypeError) as refusal:
        masks.document_ids(np.array([[5, 2, 7]]), eos_id=eos_id)
    assert str(refusal.value) == f"eos_id must be an integer (the model's model.eos_id), got {eos_id!r}."
    # A numpy or jax integer is the int it holds.
    np.testing.assert_array_equal(masks.document_ids(np.array([[5, 2, 7]]), eos_id=jnp.int32(2)), [[0, 0, 1]])


def test_a_window_of_a_numpy_or_jax_integer_is_the_int_it_holds():
    # Visibility(window=jnp.int32(4)) was refused ("window must be an integer ..."), np.int64 taken.
    for window in (jnp.int32(4), jnp.array(4), np.array(4), np.int64(4)):
        vis = masks.Visibility("sps", window, persistent_window=window)
        assert (vis.window, vis.persistent_window) == (4, 4) and type(vis.window) is int
        assert vis == masks.Visibility("sps", 4, 4) and hash(vis) == hash(masks.Visibility("sps", 4, 4))
    for window in (jnp.float32(4), jnp.array([4]), np.bool_(True)):  # still no window
        with pytest.raises(ValueError, match=r"^window must be an integer from 0 to 2147483647 or None"):
            masks.Visibility("sps", window)


def test_verify_refuses_a_vocabulary_of_no_ids_before_reading(tmp_path):
    # 0 said the folder's ids were "outside the model's vocabulary of 0", as if the folder were wrong.
    from sps_jax.data import loader
    from tests.helpers import write_token_folder

    folder = write_token_folder(tmp_path / "tokens")
    for vocab_size in (0, -1):
        with pytest.raises(ValueError) as refusal:
            loader.verify(folder, vocab_size)
        assert str(refusal.value) == f"vocab_size must be at least 1, got {vocab_size}."
