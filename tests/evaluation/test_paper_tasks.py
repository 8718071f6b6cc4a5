"""The paper's task set."""

import math

import pytest

from sps_jax import cli, vocab
from sps_jax.evaluation import paper_tasks


def test_paper_task_groups_expand_to_the_papers_nine_tasks():
    assert paper_tasks.expand(["paper"]) == ["arc_easy", "hellaswag", "piqa", "sciq", "lambada",
                                             "wikitext", "c4", "pile_books3", "govreport"]
    assert paper_tasks.expand(["zero_shot,wikitext"])[-1] == "wikitext"
    assert vocab.PAD_ID == 50303  # the adapter pads with the model's pad id, 50303 for real checkpoints


# Two rows of Appendix B's per-corpus NLL and per-benchmark accuracy (%) table, and the averages the main results
# table reports for them: "Task accuracy averages 5 zero-shot benchmarks; Corpus NLL averages 4 corpora".
PAPER_ROWS = {
    # (WT, C4, Books3, GR), (ARC-E, HS, PIQA, SciQ, LAMB), (Corpus NLL, Task Accuracy) of the main table
    "S Standard": ((3.466, 4.340, 4.908, 3.357), (50.3, 34.8, 64.0, 71.5, 27.0), (4.018, 49.5)),
    "XL SPS": ((2.831, 3.718, 4.061, 2.740), (66.3, 56.3, 71.9, 87.5, 49.5), (3.338, 66.3)),
}


def test_the_averages_are_the_plain_means_the_papers_tables_report():
    for row, (corpora, accuracies, (corpus_avg, task_avg)) in PAPER_ROWS.items():
        # lm-eval's results in the metrics the package reads (the paper names none): acc_norm, acc for LAMBADA,
        # and the corpora's word perplexity, whose log is the corpus NLL.
        metric = {"arc_easy": "acc_norm", "hellaswag": "acc_norm", "piqa": "acc_norm", "sciq": "acc_norm",
                  "lambada_openai": "acc"}
        results = {task: {f"{m},none": a / 100} for (task, m), a in zip(metric.items(), accuracies)}
        results.update({task: {"word_perplexity,none": math.exp(nll)}
                        for task, nll in zip(("wikitext", "c4", "sps_pile_books3", "sps_govreport"), corpora)})
        summary = paper_tasks.summarize(results, paper_tasks.expand(["paper"]), {})
        # The appendix's entries are rounded (3 decimals, 0.1 points): their mean meets the main table's to that.
        assert summary["corpus_nll_avg"] == pytest.approx(corpus_avg, abs=1e-3), row
        assert 100 * summary["task_accuracy_avg"] == pytest.approx(task_avg, abs=0.1), row
        assert summary["corpus_nll"]["pile_books3"] == pytest.approx(corpora[2], abs=1e-12)


def test_an_unknown_task_is_named_with_the_task_it_likely_means():
    known = ["arc_easy", "arc_challenge", "hellaswag", "piqa", "sciq", "lambada_openai", "wikitext", "c4",
             "sps_pile_books3", "sps_govreport", "mmlu"]
    with pytest.raises(ValueError) as e:
        paper_tasks.check_known(["ARC_EASY", "hellaswg", "zzzz", "piqa"], known)
    message = str(e.value)
    assert message.startswith("unknown task(s) ARC_EASY (did you mean 'arc_easy'?), "
                               "hellaswg (did you mean 'hellaswag'?), zzzz: "), message
    paper_tasks.check_known(paper_tasks.expand(["paper", "mmlu"]), known)  # all known: no error


def test_a_task_named_twice_or_in_two_groups_is_run_once_in_its_first_place():
    assert paper_tasks.expand(["zero_shot", "piqa,arc_easy", "corpus,wikitext"]) == [
        "arc_easy", "hellaswag", "piqa", "sciq", "lambada", "wikitext", "c4", "pile_books3", "govreport"]


def test_local_task_data_is_read_by_its_suffix_in_any_case(tmp_path):
    import yaml

    for name, data_format in (("ARC.JSONL", "json"), ("arc.Json.GZ", "json"), ("ARC.PARQUET", "parquet")):
        path = tmp_path / name
        path.write_text("{}\n")
        spec = paper_tasks.write_local_override("arc_easy", "arc_easy.yaml", str(path), str(tmp_path))
        with open(spec) as f:
            assert yaml.safe_load(f)["dataset_path"] == data_format, name


def test_a_metric_lm_eval_reports_as_na_counts_as_absent():
    results = {"arc_easy": {"acc_norm,none": "N/A", "acc,none": 0.5}, "wikitext": {"word_perplexity,none": "N/A"}}
    assert paper_tasks.task_result(results, "arc_easy", "acc_norm") is None
    summary = paper_tasks.summarize(results, ["arc_easy", "wikitext"], {})
    assert (summary["tasks"], summary["corpus_nll"]) == ({}, {})


def test_another_tasks_metrics_leave_out_their_standard_errors_and_text():
    results = {"mmlu": {"alias": "mmlu", "acc,none": 0.31, "acc_stderr,none": 0.004, "acc_norm,none": 0.33,
                        "acc_norm_stderr,none": 0.005}}
    assert paper_tasks.summarize(results, ["mmlu"], {})["other_tasks"] == {"mmlu": {"acc": 0.31, "acc_norm": 0.33}}


def test_task_data_for_a_task_not_run_offers_the_one_it_likely_means(monkeypatch):
    # ARC_EASY=... for arc_easy was said without the task it meant; "=arc.jsonl" was "given for ''".
    for name in ("task_data", "--task-data"):  # from Python, then inside a command
        with pytest.raises(ValueError) as refusal:
            paper_tasks.check_task_data({"ARC_EASY": "arc.jsonl"}, ["arc_easy", "piqa"])
        assert str(refusal.value) == (f"{name} given for 'ARC_EASY' (did you mean 'arc_easy'?), which is not among "
                                      "the tasks being run (arc_easy, piqa).")
        monkeypatch.setattr(cli, "_nesting", 1)  # as while a command's main runs
    from sps_jax.evaluation import evaluate

    with pytest.raises(ValueError, match=r"^--task-data '=arc\.jsonl' must look like TASK=PATH"):
        evaluate._task_data(["=arc.jsonl"])


def test_task_data_for_a_paper_task_run_in_another_case_says_to_fix_the_tasks_name(monkeypatch):
    # --tasks ARC_EASY --task-data arc_easy=... was told "did you mean 'ARC_EASY'?", and --task-data ARC_EASY=...
    # was then refused as an unknown task (did you mean 'arc_easy'?): each sentence sent the user to the other.
    for tasks, task_data in (("keys", "task_data"), ("--tasks", "--task-data")):  # from Python, then in a command
        with pytest.raises(ValueError) as refusal:
            paper_tasks.check_task_data({"arc_easy": "arc.jsonl"}, ["ARC_EASY"])
        assert str(refusal.value) == (f"{tasks} names 'ARC_EASY', which is {task_data}'s 'arc_easy' in another case, "
                                      f"and task names are case-sensitive: write arc_easy in {tasks}.")
        monkeypatch.setattr(cli, "_nesting", 1)  # as while a command's main runs
