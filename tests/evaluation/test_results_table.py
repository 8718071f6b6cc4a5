"""The paper's main table follows its input JSONs: values, deltas to Standard, the best in bold."""

import json
import os

import numpy as np
import pytest

from sps_jax.evaluation import evaluate, paper_tasks, results_table


def fixture_rows():
    rng = np.random.default_rng(1)
    rows = []
    for scale in ("s", "xs"):
        for variant, window in (("sps", 64), ("standard", None), ("delayed_state", 64)):
            corpus = {k: float(rng.uniform(3, 5)) for k in paper_tasks.CORPORA}
            tasks = {k: float(rng.uniform(0.2, 0.8)) for k in paper_tasks.ZERO_SHOT}
            rows.append({"run": f"{scale}-{variant}", "variant": variant, "window": window, "scale": scale,
                         "step": 100, "tokens_seen": 1000, "val_nll": float(rng.uniform(2.5, 3.2)),
                         "corpus_nll": corpus, "corpus_nll_avg": float(np.mean(list(corpus.values()))),
                         "tasks": tasks, "task_accuracy_avg": float(np.mean(list(tasks.values())))})
    return rows


def test_results_table_has_values_deltas_to_standard_and_the_best_in_bold(tmp_path):
    rows = fixture_rows()
    paths = []
    for i, row in enumerate(rows):
        paths.append(str(tmp_path / f"r{i}.json"))
        evaluate.write_json(paths[-1], row)
    assert evaluate.main(["table", *paths, "--out", str(tmp_path / "table")]) == 0
    md = (tmp_path / "table.md").read_text()
    tex = (tmp_path / "table.tex").read_text()
    at_s = [r for r in rows if r["scale"] == "s"]
    std = next(r for r in at_s if r["variant"] == "standard")
    sps = next(r for r in at_s if r["variant"] == "sps")

    def shown(value, text, best):
        return f"**{text}**" if value == best else text

    d_val = sps["val_nll"] - std["val_nll"]
    d_acc = 100 * (sps["task_accuracy_avg"] - std["task_accuracy_avg"])
    best_val = min(r["val_nll"] for r in at_s)
    best_acc = max(r["task_accuracy_avg"] for r in at_s)
    line = next(l for l in md.splitlines() if l.startswith("| S | SPS (w=64) |"))
    val_text = f"{sps['val_nll']:.3f}"
    assert f"{shown(sps['val_nll'], val_text, best_val)} ({d_val:+.3f})" in line
    acc_text = f"{100 * sps['task_accuracy_avg']:.1f}"
    assert f"{shown(sps['task_accuracy_avg'], acc_text, best_acc)} ({d_acc:+.1f})" in line
    d_c4 = sps["corpus_nll"]["c4"] - std["corpus_nll"]["c4"]
    c4_text = f"{sps['corpus_nll']['c4']:.3f}"
    if sps["corpus_nll"]["c4"] == min(r["corpus_nll"]["c4"] for r in at_s):
        c4_text = f"\\textbf{{{c4_text}}}"
    assert f"{c4_text}\\,{{\\scriptsize ({d_c4:+.3f})}}" in tex
    # Scales in the paper's order, Standard first within a scale and without a delta to itself.
    order = [l.split("|")[1:4] for l in md.splitlines()[2:8]]
    assert [o[0].strip() for o in order] == ["XS"] * 3 + ["S"] * 3 and order[0][1].strip() == "Standard"
    assert "(" not in order[0][2]
    assert md.count("**") == 2 * 2 * (3 + 9)  # one best per column (3 main, 9 full) and scale (2)


def test_cli_table_prints_the_table_alone_and_says_the_files_it_wrote_on_stderr(tmp_path, capsys):
    # stdout holds a command's results alone (what a pipe reads); the files a command wrote are said on stderr.
    rows = fixture_rows()
    paths = [str(tmp_path / f"r{i}.json") for i in range(len(rows))]
    for path, row in zip(paths, rows):
        evaluate.write_json(path, row)
    assert evaluate.main(["table", *paths, "--out", str(tmp_path / "table")]) == 0
    said = capsys.readouterr()
    assert said.out.startswith("| Size | Method |") and "wrote" not in said.out, said
    assert f"wrote {tmp_path / 'table'}.md and {tmp_path / 'table'}.tex\n" in said.err, said


def test_rows_of_one_method_and_scale_are_told_apart_by_run_and_step(tmp_path):
    # Before: evaluate --all-steps (or two runs of one method) printed rows that looked the same.
    base = {"variant": "sps", "window": 64, "scale": "s", "val_nll": 3.0}
    rows = [dict(base, run="a", step=100), dict(base, run="a", step=200), dict(base, run="b", step=200),
            dict(base, variant="standard", window=None, run="c", step=200)]
    paths = []
    for i, row in enumerate(rows):
        paths.append(str(tmp_path / f"r{i}.json"))
        evaluate.write_json(paths[-1], row)
    names = [l.split("|")[2].strip() for l in results_table.markdown(results_table.load(paths)).splitlines()[2:]]
    assert names == ["Standard", "SPS (w=64), run a, step 100", "SPS (w=64), run a, step 200",
                     "SPS (w=64), run b, step 200"]


def test_deltas_are_to_standard_at_the_same_tokens_and_a_lone_value_is_not_best():
    # evaluate --all-steps of both runs: SPS at step 1000 was compared with Standard at step 2000 (+0.05 where it is
    # 0.05 below Standard at its own step).
    base = {"scale": "s"}
    rows = [dict(base, run="std", variant="standard", window=None, step=1000, tokens_seen=10_000, val_nll=3.0),
            dict(base, run="std", variant="standard", window=None, step=2000, tokens_seen=20_000, val_nll=2.9),
            dict(base, run="sps", variant="sps", window=64, step=1000, tokens_seen=10_000, val_nll=2.95),
            dict(base, run="sps", variant="sps", window=64, step=2000, tokens_seen=20_000, val_nll=2.8),
            dict(base, run="sps", variant="sps", window=64, step=3000, tokens_seen=30_000, val_nll=2.7)]
    sps = [texts[0][:2] for _, name, texts in results_table.cells(rows) if name.startswith("SPS")]
    assert sps == [("2.950", "-0.050"), ("2.800", "-0.100"), ("2.700", None)]  # no Standard at 30,000 tokens
    (_, _, texts), = results_table.cells([rows[3]])
    assert texts[0] == ("2.800", None, False)  # one value in its column: nothing to be best among


def test_with_several_standard_runs_the_deltas_are_to_their_mean_whatever_the_order_and_the_table_says_so():
    # Two seeds of Standard: the delta was to whichever came first among the files given.
    base = {"scale": "s", "step": 100, "tokens_seen": 1000}
    rows = [dict(base, run="std", workdir="/r/std", variant="standard", window=None, val_nll=3.0),
            dict(base, run="std", workdir="/r/std-s1", variant="standard", window=None, val_nll=2.9),
            dict(base, run="sps", workdir="/r/sps", variant="sps", window=64, val_nll=2.8)]
    for order in (rows, rows[::-1]):
        sps = next(texts for _, name, texts in results_table.cells(order) if name.startswith("SPS"))
        assert sps[0][:2] == ("2.800", "-0.150")  # 2.8 - (3.0 + 2.9) / 2
        # Each Standard run is the baseline, not a delta to the others' mean.
        standard = sorted(texts[0] for _, name, texts in results_table.cells(order) if name.startswith("Standard"))
        assert standard == [("2.900", None, False), ("3.000", None, False)]
        assert results_table.markdown(order).endswith(
            "\n\nDeltas at S are to the mean of 2 Standard runs at the same tokens seen.")


@pytest.mark.parametrize("field, first, second, what", [
    ("val_tokens", 11003, 256, "validation tokens: 11,003 against 256"),
    ("val_sha256", "ab12", "cd34", "validation split (sha256): ab12 against cd34"),
    ("limit", None, 1, "--limit of documents per lm-eval task: none against 1"),
])
def test_results_of_one_scale_measured_on_different_data_are_refused_naming_both_files(tmp_path, field, first, second,
                                                                                      what):
    # The table printed the delta between an NLL over 256 tokens and one over 11,003 without a word.
    base = {"scale": "s", "step": 100, "val_nll": 3.0, "tasks": {"arc_easy": 0.5}, "task_accuracy_avg": 0.5}
    rows = [dict(base, run="a", variant="standard", window=None), dict(base, run="b", variant="sps", window=64),
            dict(base, run="c", variant="sps", window=64, scale="xs", **{field: second})]
    for row, value in zip(rows[:2], (first, second)):
        if value is not None:
            row[field] = value
    paths = [str(tmp_path / f"{row['run']}.json") for row in rows]
    for path, row in zip(paths, rows):
        evaluate.write_json(path, row)
    results_table.load([paths[0], paths[2]])  # another scale is not compared with it
    with pytest.raises(ValueError) as refusal:
        results_table.load(paths)
    assert str(refusal.value) == (f"{paths[0]} and {paths[1]} were measured on different data ({what}), and the table "
                                  "compares results of one scale: evaluate them alike.")


def test_one_checkpoint_evaluated_twice_is_refused_naming_both_files(tmp_path):
    row = {"run": "a", "variant": "sps", "window": 64, "scale": "s", "step": 100, "val_nll": 3.0}
    paths = [str(tmp_path / "first.json"), str(tmp_path / "again.json")]
    for path in paths:
        evaluate.write_json(path, row)
    with pytest.raises(ValueError, match="first.json and .*again.json both hold SPS \\(w=64\\) of run a at step 100: "
                                         "pass one of them."):
        results_table.load(paths)


def test_two_runs_that_share_a_name_are_two_rows_told_apart_by_their_folders(tmp_path):
    # Two seeds of one config share the run name: they were refused as "one checkpoint evaluated twice".
    base = {"run": "tiny-sps-w8", "variant": "sps", "window": 8, "scale": "s", "step": 2, "val_nll": 3.0}
    paths = []
    for seed, nll in (("seedA", 3.0), ("seed1", 3.5)):
        paths.append(str(tmp_path / f"{seed}.json"))
        evaluate.write_json(paths[-1], dict(base, workdir=f"/runs/sweep/{seed}", val_nll=nll))
    table = results_table.markdown(results_table.load(paths)).splitlines()[2:]
    assert [(l.split("|")[2].strip(), l.split("|")[3].strip()) for l in table] == [
        ("SPS (w=8), run seedA", "**3.000**"), ("SPS (w=8), run seed1", "3.500")]
    # The same folder's checkpoint twice is still one row too many, named with its folder.
    evaluate.write_json(str(tmp_path / "again.json"), dict(base, workdir="/runs/sweep/seedA"))
    with pytest.raises(ValueError, match=r"seedA.json and .*again.json both hold SPS \(w=8\) of run tiny-sps-w8 "
                                         r"\(/runs/sweep/seedA\) at step 2: pass one of them\.$"):
        results_table.load(paths + [str(tmp_path / "again.json")])


@pytest.mark.parametrize("change, sentence", [
    ({"variant": "foo"}, "unknown attention variant 'foo': choose one of standard,"),
    ({"window": "8"}, "window must be an integer from 0 to 2147483647 or None (unbounded), got '8'."),
    ({"step": "4"}, "its step '4' is not a step (an integer from 0 to 2147483647)."),
    # Hand-edited or foreign numbers the table printed as nan, inf, a negative count or a step no run reaches.
    ({"step": -4}, "its step -4 is not a step (an integer from 0 to 2147483647)."),
    ({"step": 2 ** 31}, "its step 2147483648 is not a step (an integer from 0 to 2147483647)."),
    ({"val_nll": float("nan")}, "its val_nll nan is not a finite number."),
    ({"tasks": {"arc_easy": float("inf")}}, "its tasks is not an object of finite numbers."),
    ({"tokens_seen": -5}, "its tokens_seen -5 is not a count."),
    # Out of range: the table printed an accuracy of 1.7 as 170.0.
    ({"tasks": {"arc_easy": 1.7}}, "its tasks holds 1.7, outside an accuracy's range (0 to 1)."),
    ({"task_accuracy_avg": -0.1}, "its task_accuracy_avg holds -0.1, outside an accuracy's range (0 to 1)."),
    ({"val_nll": -3.0}, "its val_nll holds -3.0, outside an NLL's range (0 and up)."),
    ({"corpus_nll": {"wikitext": -1.0}}, "its corpus_nll holds -1.0, outside an NLL's range (0 and up)."),
])
def test_a_results_json_with_a_bad_field_is_one_sentence_naming_the_file(tmp_path, change, sentence):
    # A bad variant or window was the model's sentence alone: which of the files it was went unsaid.
    paths = []
    for i, row in enumerate(fixture_rows()[:2]):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps({**row, **(change if i else {})}))
    with pytest.raises(ValueError) as refusal:
        results_table.load(paths)
    prefix = f"{paths[1]} is not a results JSON: "
    assert str(refusal.value).startswith(prefix) and sentence.rstrip(".") in str(refusal.value), refusal.value
    # and what to do, which it did not say
    assert str(refusal.value).endswith("; pass results JSONs written by python -m sps_jax.evaluation.evaluate "
                                       "(RUN/eval/step_<N>.json), or evaluate that checkpoint again (evaluate --force "
                                       "replaces it)."), refusal.value


@pytest.mark.parametrize("out", ["tables/", "tables/.", "tables/.."])
def test_a_table_out_with_no_file_name_is_one_sentence(tmp_path, capsys, out):
    # Before: status 0, with the table written to the hidden files tables/.md, tables/..md or tables/...md.
    (tmp_path / "tables").mkdir()
    evaluate.write_json(str(tmp_path / "r.json"), fixture_rows()[0])
    assert evaluate.main(["table", str(tmp_path / "r.json"), "--out", f"{tmp_path}/{out}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {tmp_path}/{out} has no file name before .md and .tex: add one, for "
                          "example ") and err.count("\n") == 1, err
    assert sorted(os.listdir(tmp_path / "tables")) == [] and sorted(os.listdir(tmp_path)) == ["r.json", "tables"]


@pytest.mark.parametrize("out", ["main", "main.md", "main.tex", "main.MD"])
def test_a_table_out_names_the_pair_with_or_without_a_suffix(tmp_path, out):
    # --out main.md wrote main.md.md and main.md.tex.
    evaluate.write_json(str(tmp_path / "r.json"), fixture_rows()[0])
    assert evaluate.main(["table", str(tmp_path / "r.json"), "--out", str(tmp_path / out)]) == 0
    assert sorted(os.listdir(tmp_path)) == ["main.md", "main.tex", "r.json"]
    assert "| " in (tmp_path / "main.md").read_text() and "\\begin{tabular}" in (tmp_path / "main.tex").read_text()


@pytest.mark.parametrize("out, folder", [("tables.md", "tables.md"), ("main", "main.tex")])
def test_cli_a_table_file_that_is_a_folder_is_offered_a_stem_in_it(tmp_path, capsys, out, folder):
    # The example was results.json, which the command refuses as a .json file.
    path = str(tmp_path / "r.json")
    evaluate.write_json(path, fixture_rows()[0])
    (tmp_path / folder).mkdir()
    assert evaluate.main(["table", path, "--out", str(tmp_path / out)]) == 2
    assert capsys.readouterr().err == (f"error: --out {tmp_path / folder} is a folder: pass a file name, for example "
                                       f"{tmp_path / folder / 'table'}.\n")


def test_a_table_out_of_another_files_suffix_is_told_the_stem(tmp_path, capsys):
    # --out ev.json wrote ev.json.md and ev.json.tex without a word.
    evaluate.write_json(str(tmp_path / "r.json"), fixture_rows()[0])
    assert evaluate.main(["table", str(tmp_path / "r.json"), "--out", f"{tmp_path}/ev.json"]) == 2
    assert capsys.readouterr().err.endswith(f"--out {tmp_path}/ev.json names a .json file, but the table is written "
                                            f"as a .md and a .tex file of one stem: pass --out {tmp_path}/ev (see "
                                            "--help).\n")
    assert sorted(os.listdir(tmp_path)) == ["r.json"]
    assert evaluate.main(["table", str(tmp_path / "r.json"), "--out", f"{tmp_path}/ev.v2"]) == 0  # a dot of its own
    assert evaluate.main(["table", str(tmp_path / "r.json"), "--out", f"{tmp_path}/ev.json.md"]) == 0  # asked for
    assert sorted(os.listdir(tmp_path)) == ["ev.json.md", "ev.json.tex", "ev.v2.md", "ev.v2.tex", "r.json"]


def test_a_table_out_of_a_suffix_alone_is_one_sentence(tmp_path, capsys):
    evaluate.write_json(str(tmp_path / "r.json"), fixture_rows()[0])
    assert evaluate.main(["table", str(tmp_path / "r.json"), "--out", f"{tmp_path}/.md"]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out {tmp_path}/.md has no file name before .md and .tex")
    assert sorted(os.listdir(tmp_path)) == ["r.json"]


def test_a_results_json_cut_short_says_what_to_do(tmp_path, capsys):
    evaluate.write_json(str(tmp_path / "r.json"), fixture_rows()[0])
    text = (tmp_path / "r.json").read_text()
    (tmp_path / "r.json").write_text(text[:len(text) // 2])  # a copy interrupted, a disk that filled
    assert evaluate.main(["table", str(tmp_path / "r.json"), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'r.json'} is not JSON at line ") and err.endswith(
        ": pass results JSONs written by python -m sps_jax.evaluation.evaluate (RUN/eval/step_<N>.json), or evaluate "
        "that checkpoint again (evaluate --force replaces it).\n"), err


def test_cli_a_run_s_metrics_jsonl_given_as_a_result_is_told_which_files_are(tmp_path, capsys):
    # It was told to evaluate that checkpoint again: a metrics.jsonl is no checkpoint's result.
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n')
    assert evaluate.main(["table", str(tmp_path / "metrics.jsonl"), "--out", str(tmp_path / "t")]) == 2
    assert capsys.readouterr().err.endswith(": pass results JSONs written by python -m sps_jax.evaluation.evaluate "
                                            "(RUN/eval/step_<N>.json).\n")


@pytest.mark.parametrize("name, content, bad", [
    ("config.json", {"name": "tiny-sps-w8", "model": {}, "train": {}, "data": {}}, "it has no 'variant'"),
    ("gradients.json", {"settings": {}, "theta_p": [], "runs": []}, "it has no 'variant'"),
    ("seeds.json", {"figure": "seeds.png", "methods": {}, "tost": {}}, "it has no 'variant'"),
    ("empty.json", {}, "it has no 'variant'"),
    ("list.json", [], "it is not an object"),
])
def test_another_commands_json_given_as_a_result_is_not_told_to_evaluate_again(tmp_path, name, content, bad):
    # Evaluating a checkpoint again mends a damaged result, not a run's config.json or a probe's or figure's data.
    (tmp_path / name).write_text(json.dumps(content))
    with pytest.raises(ValueError) as refusal:
        results_table.load([str(tmp_path / name)])
    assert str(refusal.value) == (f"{tmp_path / name} is not a results JSON: {bad}; pass results JSONs written by "
                                  "python -m sps_jax.evaluation.evaluate (RUN/eval/step_<N>.json).")


def test_one_results_file_given_where_the_list_belongs_is_one_sentence(tmp_path):
    """It was read one character at a time: "results file 'r' does not exist"."""
    with pytest.raises(TypeError, match=r"^paths must be a list of paths, not the one path 'results.json'"):
        results_table.load("results.json")


@pytest.mark.parametrize("change, sentence", [
    ({"variant": None}, "row 1 of the table's rows is not a result of python -m sps_jax.evaluation.evaluate: "
                        "it has no 'variant'."),
    ({"window": -3}, "row 1 of the table's rows is not a result of python -m sps_jax.evaluation.evaluate: window "),
])
def test_rows_given_to_the_table_in_python_are_checked_as_files_are(change, sentence):
    # A notebook builds the table from dicts; one without a variant stopped on a KeyError.
    rows = fixture_rows()[:2]
    rows[1] = {k: v for k, v in {**rows[1], **change}.items() if v is not None}
    for table in (results_table.markdown, results_table.latex):
        with pytest.raises(ValueError) as refusal:
            table(rows)
        assert str(refusal.value).startswith(sentence), refusal.value


class _ReaderGone:
    """A stdout whose reader has stopped (``| head -1`` with PYTHONUNBUFFERED=1): every write fails."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass


def test_cli_a_table_written_to_out_is_kept_when_the_printed_copy_cannot_be(tmp_path, monkeypatch):
    # The Markdown was printed before OUT.md and OUT.tex were written: `table ... --out main | head -1`, unbuffered,
    # lost the files to the broken pipe.
    evaluate.write_json(str(tmp_path / "r.json"), fixture_rows()[0])
    monkeypatch.setattr("sys.stdout", _ReaderGone())
    evaluate.main(["table", str(tmp_path / "r.json"), "--out", str(tmp_path / "main")])
    assert sorted(os.listdir(tmp_path)) == ["main.md", "main.tex", "r.json"]


# The paper's main results table at XS (validation NLL, corpus NLL) and XL (validation NLL), as printed, with the
# deltas to Standard it prints beside them and its best in bold (SPS in each column). Rows where the paper's deltas
# come from unrounded values (S's 2x Memory: 2.829 printed -0.030) are left out: from the printed values they differ
# in the last digit.
PAPER_MAIN = {  # (scale, variant): (validation NLL, corpus NLL), each as (value, printed delta)
    ("xs", "standard"): (("3.107", None), ("4.335", None)),
    ("xs", "two_x_memory"): (("3.073", "-0.034"), ("4.311", "-0.024")),
    ("xs", "delayed_state"): (("3.086", "-0.021"), ("4.312", "-0.023")),
    ("xs", "sps"): (("3.065", "-0.042"), ("4.243", "-0.092")),
    ("xl", "standard"): (("2.458", None), None),
    ("xl", "two_x_memory"): (("2.411", "-0.047"), None),
    ("xl", "delayed_state"): (("2.410", "-0.048"), None),
    ("xl", "sps"): (("2.390", "-0.068"), None),
}


def test_the_papers_main_table_rows_give_its_printed_values_deltas_order_and_bold():
    rows = []
    for (scale, variant), (val, corpus) in PAPER_MAIN.items():
        row = dict(run=f"{scale}-{variant}", variant=variant, window=None if variant in ("standard", "two_x_memory")
                   else 64, scale=scale, step=1000, tokens_seen=20_000_000_000, val_nll=float(val[0]))
        if corpus:
            row["corpus_nll_avg"] = float(corpus[0])
        rows.append(row)
    got = [(scale, name, texts[:2]) for scale, name, texts in results_table.cells(rows[::-1])]
    expected = []
    for (scale, variant), columns in PAPER_MAIN.items():  # the paper's order: Standard, 2x Memory, Delayed State, SPS
        name = {"standard": "Standard", "two_x_memory": "2x Memory", "delayed_state": "Delayed State (w=64)",
                "sps": "SPS (w=64)"}[variant]
        expected.append((scale.upper(), name, [(None, None, False) if c is None else (c[0], c[1], variant == "sps")
                                               for c in columns]))
    assert got == expected
