"""The probes command writes its JSON, CSV and PNG and rejects bad input with one sentence."""

import json
import os
import sys

import numpy as np
import pytest

from sps_jax import runs
from sps_jax.analysis import documents, probes
from tests import fuzz
from tests.analysis.helpers import make, random_docs, write_documents_folder, write_run
from tests.helpers import decoded_png
from tests.helpers import not_one_path


@pytest.fixture(scope="module")
def cli_fixture(tmp_path_factory):
    root = tmp_path_factory.mktemp("probes_cli")
    write_documents_folder(str(root / "data"), random_docs([30, 5, 40, 33, 28], seed=9))
    write_run(str(root / "std"), "standard", None, 0)
    write_run(str(root / "sps"), "sps", 4, 1)
    return root


def test_gradients_command_writes_means_and_figure(cli_fixture):
    root = cli_fixture
    out = str(root / "grad_out")
    rc = probes.main(["gradients", "--workdir", str(root / "std"), "--workdir", str(root / "sps"),
                      "--val-data", str(root / "data"), "--docs", "2", "--positions-per-doc", "2",
                      "--max-offset", "8", "--context", "16", "--out", out])
    assert rc == 0
    result = json.load(open(os.path.join(out, "gradients.json")))
    std, sps = result["runs"]
    assert set(std["mean_ratio"]) == {"x"} and set(sps["mean_ratio"]) == {"input", "predict"}
    assert std["examples"] == 4 and std["offsets"] == list(range(9))
    assert std["mean_ratio"]["x"][0] == pytest.approx(1.0)
    lines = open(os.path.join(out, "gradients.csv")).read().splitlines()
    assert len(lines) == 1 + 9 * 3
    height, width, _ = decoded_png(os.path.join(out, "gradients.png")).shape
    assert width > height  # the 8 x 4.5 inch figure


def test_window_nll_command_writes_means_and_figure(cli_fixture):
    root = cli_fixture
    out = str(root / "nll_out")
    rc = probes.main(["window-nll", "--workdir", str(root / "std"), "--workdir", str(root / "sps"),
                      "--val-data", str(root / "data"), "--docs", "4", "--omega", "6", "--out", out])
    assert rc == 0
    result = json.load(open(os.path.join(out, "window_nll_omega6.json")))
    for run in result["runs"]:
        assert run["documents"] == 4 and run["mean_delta"][:7] == [0.0] * 7
        assert run["count"][0] == 4
    height, width, _ = decoded_png(os.path.join(out, "window_nll_omega6.png")).shape
    assert width > height


def test_cli_probes_print_nothing_and_say_the_files_they_wrote_on_stderr(cli_fixture, capsys):
    # stdout holds a command's results alone (what a pipe reads); the files a command wrote are said on stderr.
    root = cli_fixture
    out = root / "said"
    for argv, base in ((["window-nll", "--omega", "6"], out / "window_nll_omega6"),
                       (["gradients", "--positions-per-doc", "2", "--max-offset", "8", "--context", "16"],
                        out / "gradients")):
        assert probes.main([*argv, "--workdir", str(root / "std"), "--val-data", str(root / "data"), "--docs", "2",
                            "--out", str(out)]) == 0
        said = capsys.readouterr()
        assert said.out == "" and f"wrote {base}.json, {base}.csv, {base}.png\n" in said.err, said


def test_a_notebook_draws_both_figures_from_the_curves_the_commands_write(cli_fixture, tmp_path):
    # The curves were built inside the commands (cmd_*), from an argparse Namespace: a notebook had only the
    # per-example arrays. Here the same curves come from importable calls and are drawn by the same plots.
    root = cli_fixture
    net, params, _ = runs.load_model(str(root / "sps"))
    docs = documents.read_documents(str(root / "data"), 4, 2)
    curve = probes.window_nll_curve(net, params, docs, 6, log=lambda *a: None)
    out = str(tmp_path / "nll")
    assert probes.main(["window-nll", "--workdir", str(root / "sps"), "--val-data", str(root / "data"), "--docs", "4",
                        "--omega", "6", "--out", out]) == 0
    (written,) = json.load(open(os.path.join(out, "window_nll_omega6.json")))["runs"]
    assert {k: written[k] for k in curve} == curve and curve["documents"] == 4 and curve["mean_delta"][:7] == [0.0] * 7
    gdocs = documents.read_documents(str(root / "data"), 2, 11)
    gcurve = probes.gradient_curve(net, params, gdocs, np.arange(9), 2, context=16, log=lambda *a: None)
    assert gcurve["offsets"] == list(range(9)) and gcurve["examples"] == 4
    assert set(gcurve["mean_ratio"]) == {"input", "predict"} and gcurve["mean_ratio"]["input"][0] == pytest.approx(1.0)
    probes.plot_window_nll([{"label": "sps", **curve}], str(tmp_path / "b.png"))
    probes.plot_gradient_ratios([{"label": "sps", "window": 4, **gcurve}], str(tmp_path / "a.png"))
    assert decoded_png(str(tmp_path / "a.png")).shape[1] > 0 and decoded_png(str(tmp_path / "b.png")).shape[1] > 0


def test_a_position_is_averaged_over_the_documents_that_reach_it():
    # Documents shorter than a position hold NaN there: they neither add to its mean nor count.
    mean, count = probes.nan_mean_and_count(np.array([[1.0, np.nan], [3.0, np.nan], [np.nan, 4.0]]))
    assert mean.tolist() == [2.0, 4.0] and count.tolist() == [2, 1]
    mean, count = probes.nan_mean_and_count(np.array([[np.nan], [np.nan]]))
    assert np.isnan(mean).all() and count.tolist() == [0]


def test_window_nll_positions_are_the_papers_from_1(cli_fixture, monkeypatch):
    """Section 5 measures delta l_i for document positions i in {1, ..., 2048}, l_i predicting x_{i+1} from
    x_1..x_i. With omega = 6 a query at position i sees the persistent slots i-6..i (docs/probes.md), so
    positions 1..7 lose nothing and position 8 is the first to lose x_1. Before, the CSV and the figure
    counted positions from 0."""
    root = cli_fixture
    out = str(root / "nll_positions")
    drawn, draw = [], probes._raw_and_trend

    def recording(ax, x, *args, **kwargs):
        drawn.append(list(x))
        draw(ax, x, *args, **kwargs)
    monkeypatch.setattr(probes, "_raw_and_trend", recording)
    assert probes.main(["window-nll", "--workdir", str(root / "sps"), "--val-data", str(root / "data"),
                        "--docs", "4", "--omega", "6", "--context", "16", "--out", out]) == 0
    rows = [line.split(",") for line in (root / "nll_positions" / "window_nll_omega6.csv").read_text().splitlines()[1:]]
    assert [int(r[4]) for r in rows] == list(range(1, 17))
    assert all(float(r[5]) == 0.0 for r in rows[:7]) and float(rows[7][5]) != 0.0
    assert drawn == [list(range(1, 17))]


def test_fewer_documents_than_docs_asks_for_are_named(cli_fixture, capsys):
    """--docs is an upper bound: a split with fewer documents long enough is used whole, and the progress
    line says so instead of reporting the smaller count without a word (the tiny run's split holds 8)."""
    root = cli_fixture
    common = ["--workdir", str(root / "std"), "--val-data", str(root / "data"), "--docs", "50"]
    assert probes.main(["window-nll", *common, "--omega", "6", "--out", str(root / "few_nll")]) == 0
    out = capsys.readouterr().err  # a progress line: stdout holds what the command wrote
    assert "5 documents (fewer than --docs 50: the val split of" in out and "holds no more of at least 2 tokens)" in out
    assert probes.main(["gradients", *common, "--positions-per-doc", "2", "--max-offset", "8", "--context", "16",
                        "--out", str(root / "few_grad")]) == 0
    out = capsys.readouterr().err
    assert "4 documents (fewer than --docs 50: " in out and "holds no more of at least 11 tokens)" in out
    assert probes.main(["window-nll", "--workdir", str(root / "std"), "--val-data", str(root / "data"), "--docs", "5",
                        "--omega", "6", "--out", str(root / "all_nll")]) == 0
    assert "5 documents, omega 6" in capsys.readouterr().err


def test_bad_input_stops_with_one_sentence(cli_fixture, capsys):
    root = cli_fixture
    # The whole of stderr: what is wrong and what to pass instead, on one line.
    assert probes.main(["window-nll", "--workdir", str(root / "nope"), "--val-data", str(root / "data")]) == 2
    assert capsys.readouterr().err == (f"error: '{root / 'nope'}' does not exist: pass a run folder (the one holding "
                                       "config.json) or one of its checkpoints/<step> folders.\n")
    assert probes.main(["gradients", "--workdir", str(root / "std"), "--val-data", str(root)]) == 2
    assert capsys.readouterr().err == (f"error: '{root}' is not a prepared token folder (it has no manifest.json): "
                                       "pass the folder that `python -m sps_jax.data prepare --source ... --out DIR` "
                                       "wrote.\n")


@pytest.mark.parametrize("flag", ["--dtype", "--attention"])
def test_an_empty_override_is_refused_not_ignored(cli_fixture, monkeypatch, flag):
    # --dtype "" (an unset shell variable, say) ran with the run's own dtype without a word.
    root = cli_fixture
    monkeypatch.setattr(runs, "load_model", lambda *a, **k: pytest.fail("weights loaded before the check"))
    outcome = fuzz.call(probes.main, ["window-nll", "--workdir", str(root / "sps"), "--val-data", str(root / "data"),
                                      "--out", str(root / "empty_flag"), flag, ""])
    sentence = f"argument {flag}: invalid choice ''"  # --attention's had come after jax loaded
    assert outcome.status == 2 and outcome.problem() is None and sentence in outcome.stderr, outcome.stderr


def test_settings_no_context_or_document_can_meet_stop_before_any_weights_load(cli_fixture, monkeypatch):
    root = cli_fixture
    monkeypatch.setattr(runs, "load_model", lambda *a, **k: pytest.fail("weights loaded before the check"))
    common = ["--workdir", str(root / "sps"), "--val-data", str(root / "data"), "--out", str(root / "refused")]
    for argv, needle in (
            (["gradients", *common, "--context", "16", "--max-offset", "8", "--positions-per-doc", "9"],
             "--min-offset 0 + --max-offset 8 + --positions-per-doc 9 exceed the context of 16 positions"),
            # before: "lower them", with no word of what fits
            (["gradients", *common, "--context", "16", "--max-offset", "12", "--positions-per-doc", "8"],
             "lower them to a sum of at most 16 (--max-offset 8 with the others as given)."),
            (["gradients", *common, "--context", "16", "--max-offset", "1", "--positions-per-doc", "17"],
             "lower them to a sum of at most 16."),
            (["window-nll", *common, "--min-tokens", "41"], "no document of at least 41 tokens: lower --min-tokens"),
            # before: cut to the run's context without a word, while the settings recorded 100000
            (["window-nll", *common, "--context", "100000"], "--context 100000 is beyond the context of")):
        outcome = fuzz.call(probes.main, argv)
        assert outcome.status == 2 and outcome.problem() is None and needle in outcome.stderr, outcome.stderr
    assert not (root / "refused").exists()


@pytest.mark.parametrize("package", ["matplotlib", "scipy"])
def test_a_missing_plotting_package_names_its_extra_before_any_weights_load(cli_fixture, monkeypatch, package):
    # Before: the probe ran to its end, then plotting's import escaped as ModuleNotFoundError.
    root = cli_fixture
    monkeypatch.setattr(runs, "load_model", lambda *a, **k: pytest.fail("weights loaded before the check"))
    monkeypatch.setitem(sys.modules, package, None)  # what an install without the analysis extra imports
    outcome = fuzz.call(probes.main, ["window-nll", "--workdir", str(root / "sps"), "--val-data", str(root / "data"),
                                      "--out", str(root / "refused_plot")])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert f"needs the {package} package: pip install -e '.[analysis]'" in outcome.stderr
    assert not (root / "refused_plot").exists()


def test_an_omega_beyond_int32_is_refused_before_any_weights_load(cli_fixture, monkeypatch):
    root = cli_fixture
    monkeypatch.setattr(runs, "load_model", lambda *a, **k: pytest.fail("weights loaded before the check"))
    outcome = fuzz.call(probes.main, ["window-nll", "--workdir", str(root / "sps"), "--val-data", str(root / "data"),
                                      "--omega", "2147483648", "--out", str(root / "refused_omega")])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "--omega: 2147483648 must be from 0 to 2147483647" in outcome.stderr


def test_an_omega_at_or_beyond_the_context_is_warned_about(cli_fixture):
    root = cli_fixture
    outcome = fuzz.call(probes.main, ["window-nll", "--workdir", str(root / "sps"), "--val-data", str(root / "data"),
                                      "--docs", "2", "--omega", "16", "--context", "16",
                                      "--out", str(root / "omega_out")])
    assert outcome.status == 0, outcome.stderr
    warnings = [line for line in outcome.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "omega 16 reaches the farthest key of the context of 16 positions" in warnings[0]
    result = json.load(open(root / "omega_out" / "window_nll_omega16.json"))
    deltas = [d for d in result["runs"][0]["mean_delta"] if d == d]  # positions no document reaches are NaN
    assert deltas and all(d == 0.0 for d in deltas)  # zero by construction, as warned


def test_an_interrupt_before_the_figure_leaves_none_of_the_three_files(cli_fixture, monkeypatch):
    """Before, the .json and .csv were renamed into place one by one, so a Ctrl-C while the figure was drawn left
    them without the .png, and the rerun was refused for the files it had left."""
    root = cli_fixture

    def interrupted(results, path):
        raise KeyboardInterrupt
    monkeypatch.setattr(probes, "plot_window_nll", interrupted)
    argv = ["window-nll", "--workdir", str(root / "std"), "--val-data", str(root / "data"), "--docs", "2",
            "--omega", "6", "--out", str(root / "interrupted")]
    assert probes.main(argv) == 130
    assert list((root / "interrupted").iterdir()) == []


def test_the_defaults_are_the_papers_probe_settings_where_they_are_cheap():
    """Section 5 (Analysis): r(p, k) from 8 source positions per document, and the persistent state restricted to
    omega = 64. The paper's 1,000 / 8,000 documents, k <= 512 and positions 1..2048 are flags (docs/probes.md
    gives the command lines), since they cost hours on a trained model."""
    parser = probes.build_parser()
    gradients = parser.parse_args(["gradients", "--workdir", "run"])
    window = parser.parse_args(["window-nll", "--workdir", "run"])
    assert gradients.positions_per_doc == 8 and gradients.min_offset == 0
    assert window.omega == 64


@pytest.mark.parametrize("data_dir, kind", [(["data1", "data2"], "list"), (None, "NoneType")])
def test_a_documents_folder_that_is_not_one_path_is_one_sentence(data_dir, kind):
    # Before: Python's "expected str, bytes or os.PathLike object, not list" from os.fspath in read_documents.
    with pytest.raises(TypeError, match=not_one_path('data_dir', kind)):
        documents.read_documents(data_dir, 1, 1)


def test_an_out_named_as_a_file_one_checkpoint_twice_and_a_run_configs_missing_data_are_one_sentence(
        cli_fixture, tmp_path, monkeypatch):
    # --out x.png became a folder named x.png; a run and its latest checkpoint drew one curve twice under one label;
    # a data.dir from the run's config.json that is gone was said as a folder to prepare, with no word of --val-data.
    import shutil

    root = cli_fixture
    monkeypatch.setattr(runs, "load_model", lambda *a, **k: pytest.fail("weights loaded before the check"))
    run = str(root / "sps")
    (step,) = os.listdir(os.path.join(run, "checkpoints"))
    moved = tmp_path / "moved"
    shutil.copytree(run, moved)
    config = json.loads((moved / "config.json").read_text())
    config["data"] = {"dir": str(tmp_path / "gone")}
    (moved / "config.json").write_text(json.dumps(config))
    for argv, sentence in (
            (["--workdir", run, "--val-data", str(root / "data"), "--out", str(tmp_path / "nll.png")],
             f"error: --out {tmp_path / 'nll.png'} names a .png file, and probes write a folder of results (their "
             ".json, .csv and .png): pass a folder, such as probes_out."),
            (["--workdir", run, "--workdir", os.path.join(run, "checkpoints", step), "--val-data", str(root / "data"),
              "--out", str(tmp_path / "o")],
             f"error: --workdir {run} and --workdir {run}/checkpoints/{step} are one checkpoint (step {step} of {run}): "
             "pass each once."),
            (["--workdir", str(moved), "--out", str(tmp_path / "o")],
             f"error: the token folder named in {moved}'s config.json (data.dir={tmp_path / 'gone'}) cannot be read")):
        outcome = fuzz.call(probes.main, ["window-nll", *argv])
        assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
        assert outcome.stderr.startswith(sentence) and outcome.stderr.endswith(": pass --val-data DIR.\n"
                                                                               if "gone" in sentence else "\n")
    assert sorted(os.listdir(tmp_path)) == ["moved"]


def test_cli_probes_take_step_as_evaluate_does(cli_fixture, tmp_path, monkeypatch):
    # generate, evaluate, export_torch and import_torch take --step; the probes read only the latest checkpoint.
    root = cli_fixture
    run = str(tmp_path / "run")
    write_run(run, "standard", None, 0)  # step 7: the weights of root/std
    runs.save_run(run, runs.read_config(run), make("standard", None, seed=5)[1], step=9)
    data = ["--val-data", str(root / "data"), "--docs", "2"]

    def probe(workdir, *flags):
        out = str(tmp_path / f"out{len(os.listdir(tmp_path))}")
        outcome = fuzz.call(probes.main, ["window-nll", "--workdir", workdir, *data, "--omega", "6", "--out", out,
                                          *flags])
        assert outcome.status == 0 and outcome.problem() is None, outcome.stderr
        return json.loads(open(os.path.join(out, "window_nll_omega6.json")).read())

    only_7 = probe(str(root / "std"))["runs"][0]
    latest, at_7 = probe(run), probe(run, "--step", "7")
    assert latest["runs"][0]["step"] == 9 and latest["runs"][0]["mean_nll"] != only_7["mean_nll"]  # told apart
    assert at_7["runs"][0]["step"] == 7 and at_7["settings"]["step"] == 7
    assert at_7["runs"][0]["mean_nll"] == only_7["mean_nll"]
    # A step the run does not hold, or another than the checkpoint given holds: one sentence before any weights load.
    monkeypatch.setattr(runs, "load_model", lambda *a, **k: pytest.fail("weights loaded before the check"))
    for argv, sentence in (
            (["--workdir", run, "--step", "8"],
             f"error: run folder {run!r} has no checkpoint at step 8; it has [7, 9]: pass one of those.\n"),
            (["--workdir", os.path.join(run, "checkpoints", "7"), "--step", "9"],
             f"error: {run}/checkpoints/7 is the checkpoint of step 7, but step 9 was asked for (--step): pass the run "
             "folder with --step, or the checkpoint alone.\n")):
        for command in (["window-nll"], ["gradients", "--max-offset", "2", "--context", "16"]):
            outcome = fuzz.call(probes.main, [*command, *argv, *data, "--out", str(tmp_path / "refused")])
            assert outcome.status == 2 and outcome.stderr == sentence, outcome.stderr
    beyond = fuzz.call(probes.main, ["window-nll", "--workdir", run, "--step", str(2 ** 31), *data])
    assert beyond.status == 2 and f"{2 ** 31} must be from 0 to {2 ** 31 - 1}" in beyond.stderr, beyond.stderr
    assert not os.path.exists(tmp_path / "refused")


def test_read_documents_refuses_a_count_that_reads_nothing_or_everything(cli_fixture):
    # 0 and -1 returned every document of the split.
    from sps_jax.analysis.documents import read_documents
    for num_docs in (0, -1):
        with pytest.raises(ValueError, match=rf"^num_docs must be at least 1, got {num_docs}\.$"):
            read_documents(str(cli_fixture / "data"), num_docs, 2)
    with pytest.raises(ValueError, match=r"val\.bin holds token id \d+, outside the model's vocabulary of 8: the data "
                                         r"was tokenised for another vocabulary\.$"):
        read_documents(str(cli_fixture / "data"), 2, 2, vocab_size=8)  # the model's vocabulary, as the CLI passes it


def test_a_split_with_no_document_says_so_not_to_lower_min_tokens(tmp_path):
    # An empty val split said "lower --min-tokens", and --min-tokens 1 said it again.
    write_documents_folder(tmp_path / "data", random_docs([3, 5]))
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    manifest["splits"]["val"].update(tokens=0, documents=0)
    (tmp_path / "data" / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "data" / "val.bin").write_bytes(b"")
    with pytest.raises(ValueError) as refusal:
        documents.read_documents(str(tmp_path / "data"), 5, 1)
    assert str(refusal.value) == (f"{str(tmp_path / 'data')!r} (val) holds no document: pass a token folder whose val "
                                  "split has some (data prepare --val-fraction), or another split.")
    assert len(documents.read_documents(str(tmp_path / "data"), 5, 1, split="train")) == 2


def test_a_document_of_exactly_min_tokens_is_read(tmp_path):
    # Guards against ``>= min_tokens`` becoming ``>``: a document of exactly min_tokens (its EOS counted) was dropped.
    docs = random_docs([3, 5, 2])
    write_documents_folder(tmp_path / "data", docs)
    read = documents.read_documents(str(tmp_path / "data"), 5, 3)
    assert [len(d) for d in read] == [3, 5]
    np.testing.assert_array_equal(read[0], docs[0])


def test_a_context_one_past_the_models_is_refused_and_the_models_own_is_not():
    # Guards against an off-by-one in the context check: seq_len + 1 positions passed, past the model's own.
    from tests.analysis.helpers import make
    model, params = make("sps", 2)  # seq_len 32
    docs = random_docs([5])
    assert documents.check_probe(model, params, docs, 32, batch=1) == 32
    with pytest.raises(ValueError, match=r"^context 33 is beyond the model's 32 positions: pass at most that\.$"):
        documents.check_probe(model, params, docs, 33, batch=1)


def test_cli_a_second_run_probed_without_out_writes_beside_the_first(cli_fixture, tmp_path, monkeypatch, capsys):
    # The default --out was probes_out for every run, with the same file names: the second run's probe was refused.
    monkeypatch.chdir(tmp_path)
    data = ["--val-data", str(cli_fixture / "data"), "--docs", "2", "--omega", "6"]
    for workdirs in (["std"], ["sps"], ["std", "sps"]):
        argv = [word for name in workdirs for word in ("--workdir", str(cli_fixture / name))]
        assert probes.main(["window-nll", *argv, *data]) == 0, capsys.readouterr().err
    written = {folder: sorted(os.listdir(tmp_path / "probes_out" / folder))
               for folder in os.listdir(tmp_path / "probes_out")}
    assert written == {folder: ["window_nll_omega6.csv", "window_nll_omega6.json", "window_nll_omega6.png"]
                       for folder in ("std", "sps", "std+sps")}
    (run,) = json.loads((tmp_path / "probes_out" / "sps" / "window_nll_omega6.json").read_text())["runs"]
    assert run["run"] == str(cli_fixture / "sps")


def test_cli_a_probe_whose_results_the_default_out_holds_says_to_pass_another_out_folder(cli_fixture, tmp_path,
                                                                                        monkeypatch, capsys):
    # The user gave no --out: "or choose another name" asked for a name that --out, a folder, does not take.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "probes_out" / "std").mkdir(parents=True)
    (tmp_path / "probes_out" / "std" / "window_nll_omega6.json").write_text("{}")
    assert probes.main(["window-nll", "--omega", "6", "--workdir", str(cli_fixture / "std"),
                        "--val-data", str(cli_fixture / "data")]) == 2
    assert capsys.readouterr().err == (f"error: --out {os.path.join('probes_out', 'std', 'window_nll_omega6.json')} "
                                       "already exists: pass --force to replace it, or pass another --out folder.\n")


def test_cli_an_out_given_that_holds_another_runs_results_is_refused_unless_forced(cli_fixture, tmp_path, capsys):
    out = str(tmp_path / "mine")
    data = ["--val-data", str(cli_fixture / "data"), "--docs", "2", "--omega", "6", "--out", out]
    assert probes.main(["window-nll", "--workdir", str(cli_fixture / "std"), *data]) == 0
    assert probes.main(["window-nll", "--workdir", str(cli_fixture / "sps"), *data]) == 2
    assert capsys.readouterr().err.endswith(f"error: --out {os.path.join(out, 'window_nll_omega6.json')} already "
                                            "exists: pass --force to replace it, or pass another --out folder.\n")
    assert probes.main(["window-nll", "--workdir", str(cli_fixture / "sps"), *data, "--force"]) == 0
    (run,) = json.loads(open(os.path.join(out, "window_nll_omega6.json")).read())["runs"]
    assert run["run"] == str(cli_fixture / "sps")


def test_cli_a_reverse_sps_run_writes_its_input_curve_and_says_its_predict_stream_has_no_ratio(cli_fixture, capsys):
    """reverse_sps reads position i's logits from x_i, which does not see rho_i: l_i has no gradient at rho_i, so
    r(rho_i, k) divides by 0. Its ratios were inf, and the trend's fit stopped the command after every probe ran."""
    root = cli_fixture
    write_run(str(root / "reverse"), "reverse_sps", 4, 2)
    out = str(root / "reverse_out")
    assert probes.main(["gradients", "--workdir", str(root / "reverse"), "--val-data", str(root / "data"),
                        "--docs", "2", "--positions-per-doc", "2", "--max-offset", "8", "--context", "16",
                        "--out", out]) == 0
    (run,) = json.load(open(os.path.join(out, "gradients.json")))["runs"]
    assert run["count"]["predict"] == [0] * 9 and run["mean_ratio"]["predict"] == [None] * 9
    assert run["count"]["input"] == [4] * 9 and run["mean_ratio"]["input"][0] == pytest.approx(1.0)
    assert ("note: tiny-reverse_sps's predict stream has no ratio: the loss at a position never depends on its "
            "predict slot (no gradient there to divide by), so its curve is left out.\n") in capsys.readouterr().err


def test_cli_a_run_of_another_folders_same_name_is_told_to_pass_out_not_to_force_over_the_first(cli_fixture, tmp_path,
                                                                                                monkeypatch, capsys):
    # runs/sps/seed0 and runs/std/seed0 share the default probes_out/seed0: the second probe was told to pass --force,
    # which replaced the first run's results with its own.
    import shutil

    monkeypatch.chdir(tmp_path)
    for parent, name in (("a", "std"), ("b", "sps")):
        shutil.copytree(cli_fixture / name, tmp_path / parent / "seed0")
    data = ["--val-data", str(cli_fixture / "data"), "--docs", "2", "--omega", "6"]
    assert probes.main(["window-nll", "--workdir", str(tmp_path / "a" / "seed0"), *data]) == 0
    capsys.readouterr()
    assert probes.main(["window-nll", "--workdir", str(tmp_path / "b" / "seed0"), *data]) == 2
    results = os.path.join("probes_out", "seed0", "window_nll_omega6.json")
    assert capsys.readouterr().err == (f"error: {results} holds the probe of {tmp_path / 'a' / 'seed0'}, not of "
                                       f"{tmp_path / 'b' / 'seed0'}, whose folder names give the same default --out: "
                                       "pass --out FOLDER for this probe.\n")
    (run,) = json.loads((tmp_path / results).read_text())["runs"]
    assert run["run"] == str(tmp_path / "a" / "seed0")


def test_cli_a_default_out_longer_than_a_file_name_asks_for_out(cli_fixture, tmp_path, monkeypatch, capsys):
    # The runs' names joined by '+' passed 255 bytes: the sentence told to choose a shorter name for an --out the user
    # never gave.
    import shutil

    monkeypatch.chdir(tmp_path)
    argv = []
    for n in range(3):
        shutil.copytree(cli_fixture / "std", tmp_path / (f"sps-124m-omega128-seed{n}-" + "x" * 80))
        argv += ["--workdir", str(tmp_path / (f"sps-124m-omega128-seed{n}-" + "x" * 80))]
    assert probes.main(["window-nll", *argv, "--val-data", str(cli_fixture / "data"), "--omega", "6"]) == 2
    assert capsys.readouterr().err == ("error: the default --out, probes_out/ and the 3 runs' folder names joined by "
                                       "'+', is a name of 314 bytes, more than the 255 a file system allows: pass "
                                       "--out FOLDER.\n")
    assert not (tmp_path / "probes_out").exists()


def test_cli_a_probe_rerun_through_a_checkpoint_path_is_offered_force_as_a_rerun_of_its_run(cli_fixture, tmp_path,
                                                                                           monkeypatch, capsys):
    # The results record the path as given (RUN/checkpoints/STEP), and the rerun was told they were another run's.
    monkeypatch.chdir(tmp_path)
    steps = sorted(n for n in os.listdir(cli_fixture / "std" / "checkpoints") if n.isdecimal())
    args = ["window-nll", "--workdir", str(cli_fixture / "std" / "checkpoints" / steps[-1]), "--omega", "6",
            "--docs", "2", "--val-data", str(cli_fixture / "data")]
    assert probes.main(args) == 0
    capsys.readouterr()
    assert probes.main(args) == 2
    assert capsys.readouterr().err == (f"error: --out {os.path.join('probes_out', 'std', 'window_nll_omega6.json')} "
                                       "already exists: pass --force to replace it, or pass another --out folder.\n")
