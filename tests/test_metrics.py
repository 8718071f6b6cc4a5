"""metrics.jsonl records, TensorBoard mirroring, and dropping records a killed run wrote after its checkpoint."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # the test extra installs it

from sps_jax import metrics
from sps_jax.analysis import figures
from sps_jax.cli import UserError
from tests.helpers import not_one_path


def test_jsonl_tensorboard_and_truncate(tmp_path):
    writer = metrics.Writer(str(tmp_path), tensorboard=True)
    for step in range(1, 6):
        writer.write({"step": step, "tokens_seen": 10 * step, "loss": 1.0 / step})
    writer.close()
    assert [r["step"] for r in metrics.read(str(tmp_path))] == [1, 2, 3, 4, 5]
    metrics.truncate(str(tmp_path), 3)
    assert [r["loss"] for r in metrics.read(str(tmp_path))] == [1.0, 0.5, 1.0 / 3]
    assert metrics.plot(str(tmp_path)) == str(tmp_path / "loss.png")
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [1, 2, 3, 4, 5]
    assert events.Scalars("loss")[1].value == pytest.approx(0.5)


def test_plot_curves_draws_the_records_of_each_run(tmp_path):
    writer = metrics.Writer(str(tmp_path), tensorboard=False)
    for step in range(1, 5):
        writer.write({"step": step, "tokens_seen": 10 * step, "loss": 5.0 - step})
    writer.write({"step": 4, "tokens_seen": 40, "val_loss": 1.5})
    writer.close()
    fig = figures.training_curves({"run": str(tmp_path)})
    train_ax, val_ax = fig.axes
    (train_line,), (val_line,) = train_ax.lines, val_ax.lines
    assert train_line.get_xdata().tolist() == [10, 20, 30, 40] and train_line.get_ydata().tolist() == [4, 3, 2, 1]
    assert val_line.get_xdata().tolist() == [40] and val_line.get_ydata().tolist() == [1.5]
    assert train_line.get_label() == "run"


def test_drawing_a_figure_leaves_pyplot_and_its_backend_as_they_were(tmp_path):
    # The figures switched pyplot to Agg: in a notebook, training (its loss.png) or any figure turned inline plotting
    # off for the rest of the session, and pyplot kept every figure drawn.
    import matplotlib
    import matplotlib.pyplot as plt

    from sps_jax.analysis import probes

    before = matplotlib.get_backend()
    matplotlib.use("pdf")  # any backend but Agg, as a notebook's inline one
    try:
        writer = metrics.Writer(str(tmp_path), tensorboard=False)
        writer.write({"step": 1, "tokens_seen": 10, "loss": 5.0})
        writer.close()
        metrics.plot(str(tmp_path))
        fig = figures.training_curves({"run": str(tmp_path)}, str(tmp_path / "curves.png"))
        probes.plot_window_nll([{"label": "a", "omega": 2, "mean_delta": [0.1, 0.2, 0.3]}], str(tmp_path / "w.png"))
        assert matplotlib.get_backend() == "pdf" and plt.get_fignums() == []
        assert fig.axes[0].lines and (tmp_path / "loss.png").stat().st_size and (tmp_path / "w.png").stat().st_size
    finally:
        matplotlib.use(before)


def test_a_run_with_a_long_name_plots_without_a_warning(tmp_path):
    # A run folder name of 200 characters ended training with matplotlib's "Tight layout not applied" and a source line.
    import warnings

    run = tmp_path / ("r" * 200)
    run.mkdir()
    writer = metrics.Writer(str(run), tensorboard=False)
    writer.write({"step": 1, "tokens_seen": 10, "loss": 3.0})
    writer.write({"step": 1, "tokens_seen": 10, "val_loss": 3.0})
    writer.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert metrics.plot(str(run)) == str(run / "loss.png")


def test_a_metrics_file_that_is_not_records_is_one_sentence_naming_the_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"loss": 3.0}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl line 2 is not a metrics record"):
        metrics.read(str(tmp_path))


@pytest.mark.parametrize("line, says", [("this is not json", "is not JSON at line 2, column 1"),
                                        ('{"loss": 3.0}', "line 2 is not a metrics record"),
                                        ("\udcff", "line 2 is not UTF-8 text")])
def test_a_bad_line_in_the_middle_of_the_metrics_says_what_to_do(tmp_path, line, says):
    # Training, evaluate and figures all read metrics.jsonl; the sentence named the line but not what to do with it.
    with open(tmp_path / "metrics.jsonl", "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(f'{{"step": 1, "loss": 2.0}}\n{line}\n{{"step": 3}}\n')
    with pytest.raises(ValueError) as refusal:
        metrics.read(str(tmp_path))
    message = str(refusal.value)
    assert says in message and message.endswith("; fix or delete that line (training writes one JSON record per "
                                                 'line, each with "step").'), message
    assert message.count(".;") == 0 and "\n" not in message


@pytest.mark.parametrize("name, sentence", [("config.json", "must name a .png file"), ("loss.png", "own files"),
                                            ("metrics.jsonl", "must name a .png file")])
def test_plot_curves_never_writes_over_a_runs_own_files(tmp_path, name, sentence):
    writer = metrics.Writer(str(tmp_path), tensorboard=False)
    writer.write({"step": 1, "tokens_seen": 10, "loss": 4.0})
    writer.close()
    (tmp_path / "config.json").write_text("{}")
    before = (tmp_path / name).read_bytes() if (tmp_path / name).exists() else None
    with pytest.raises((UserError, ValueError), match=sentence):
        figures.training_curves({"run": str(tmp_path)}, str(tmp_path / name))
    assert ((tmp_path / name).read_bytes() if (tmp_path / name).exists() else None) == before


def test_the_curves_of_no_run_or_into_a_file_that_is_no_png_are_one_sentence(tmp_path):
    # {} drew an empty figure; out_png="curves.txt" wrote a PNG under that name (the command refuses both).
    with pytest.raises(ValueError, match="runs is empty: pass at least one"):
        figures.training_curves({})
    with pytest.raises(ValueError, match="out_png must name a .png file"):
        figures.training_curves({"run": str(tmp_path / "run")}, str(tmp_path / "curves.txt"))
    assert not (tmp_path / "curves.txt").exists()


def test_plot_against_a_field_the_records_lack_is_one_sentence(tmp_path):
    writer = metrics.Writer(str(tmp_path), tensorboard=False)
    writer.write({"step": 1, "tokens_seen": 10, "loss": 4.0})
    writer.close()
    with pytest.raises(UserError, match="have no 'wall_s' at step 1"):
        figures.training_curves({"run": str(tmp_path)}, x="wall_s")
    assert figures.training_curves({"run": str(tmp_path)}, x="step").axes[0].lines[0].get_xdata().tolist() == [1]


def test_a_loss_below_zero_is_named_not_plotted(tmp_path):
    # A hand-edited val_loss of -3.0 was drawn as it was: no cross-entropy is below 0.
    writer = metrics.Writer(str(tmp_path), tensorboard=False)
    writer.write({"step": 1, "tokens_seen": 10, "loss": 4.0})
    writer.write({"step": 2, "tokens_seen": 20, "val_loss": -3.0})
    writer.close()
    with pytest.raises(UserError, match=r"the record of step 2 has val_loss=-3\.0, below 0, which no loss is; fix or "
                                        r"delete that line \(training writes one JSON record per line, each with "
                                        r'"step"\)\.$'):
        figures.training_curves({"run": str(tmp_path)})


def test_a_loss_that_is_no_number_is_named_with_what_to_do(tmp_path):
    # "the record of step 2 has val_loss='x', not a number." said what was wrong but not what to do, as the sentence
    # about a NaN does.
    writer = metrics.Writer(str(tmp_path), tensorboard=False)
    writer.write({"step": 2, "tokens_seen": 20, "val_loss": "x"})
    writer.close()
    with pytest.raises(UserError) as refusal:
        metrics.curves(str(tmp_path))
    assert str(refusal.value) == (f"{tmp_path / 'metrics.jsonl'}: the record of step 2 has val_loss='x', not a number; "
                                  'fix or delete that line (training writes one JSON record per line, each with '
                                  '"step").')


@pytest.mark.parametrize("call, name, kind", [
    (lambda tmp: metrics.read([str(tmp), str(tmp)]), "workdir", "list"),
    (lambda tmp: figures.training_curves({"run": str(tmp)}, [str(tmp / "a.png"), str(tmp / "b.png")]), "out_png", "list"),
    (lambda tmp: figures.training_curves({"run": str(tmp)}, 5), "out_png", "int"),
    # The run's own entry is named, not a "workdir" argument the caller never passed.
    (lambda tmp: figures.training_curves({"run": None}, str(tmp / "c.png")), "runs['run']", "NoneType"),
])
def test_a_path_argument_that_is_not_one_path_is_one_sentence(tmp_path, call, name, kind):
    # Before: Python's "expected str, bytes or os.PathLike object, not list" from os.fspath.
    with pytest.raises(TypeError, match=not_one_path(name, kind)):
        call(tmp_path)
    assert not list(tmp_path.glob("*.png"))


def test_plot_curves_writes_its_figure_to_a_pathlib_path(tmp_path):
    (tmp_path / "run").mkdir()
    writer = metrics.Writer(str(tmp_path / "run"), tensorboard=False)
    writer.write({"step": 1, "tokens_seen": 10, "loss": 4.0})
    writer.close()
    figures.training_curves({"run": tmp_path / "run"}, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_metrics_of_a_checkpoint_folder_point_to_its_run(tmp_path):
    # figures curves RUN/checkpoints/40 said the checkpoint "is not a training run folder".
    (tmp_path / "run" / "checkpoints" / "40").mkdir(parents=True)
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    with pytest.raises(FileNotFoundError) as refusal:
        metrics.read(str(tmp_path / "run" / "checkpoints" / "40"), required=True)
    assert str(refusal.value) == (f"'{tmp_path}/run/checkpoints/40' is a checkpoint of the run {tmp_path}/run, whose "
                                  "metrics.jsonl holds the curves: pass the run folder.")


def test_a_metrics_line_cut_by_a_kill_is_dropped_when_read(tmp_path):
    # Guards against reading without drop_partial_last: a run killed mid-write left its metrics unreadable.
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    assert [r["step"] for r in metrics.read(str(tmp_path))] == [1, 2]


@pytest.mark.parametrize("lines, says", [
    # A file joined to itself: every point was plotted twice, and a run of steps 1-2 read as one of steps 1-2-1-2.
    (['{"step": 1, "tokens_seen": 10, "loss": 3.0}', '{"step": 2, "tokens_seen": 20, "loss": 2.0}'] * 2,
     "line 3 has step 1 after step 2, where training writes steps in order (two files joined?)"),
    (['{"step": -16, "loss": 3.0}'], 'line 1 is not a metrics record: it needs a "step" of 0 or more'),
    (['{"step": 1, "tokens_seen": 1.5, "loss": 3.0}'], "line 1 has tokens_seen=1.5, not a count of tokens"),
    (['{"step": 1, "tokens_seen": "x", "loss": 3.0}'], "line 1 has tokens_seen='x', not a count of tokens"),
    (['{"step": 1, "tokens_seen": -5, "loss": 3.0}'], "line 1 has tokens_seen=-5, not a count of tokens")])
def test_a_metrics_file_training_could_not_have_written_is_one_sentence_naming_the_line(tmp_path, lines, says):
    # evaluate read tokens_seen "x" as Python's "invalid literal for int()", -5 into its results, 1.5 as 1.
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as refusal:
        metrics.read(str(tmp_path))
    assert str(refusal.value) == f"{tmp_path / 'metrics.jsonl'} {says}; fix or delete that line (training writes one " \
        'JSON record per line, each with "step").'
    # Validation records share their update's step, after it: in order.
    (tmp_path / "metrics.jsonl").write_text('{"step": 2, "loss": 2.0}\n{"step": 2, "val_loss": 2.5}\n'
                                            '{"step": 3, "loss": 1.0}\n')
    assert [r["step"] for r in metrics.read(str(tmp_path))] == [2, 2, 3]


def test_tensorboard_gets_no_step_scalar_since_every_event_carries_its_step(tmp_path):
    # Guards against mirroring "step" itself as a scalar (a spurious "step" curve in TensorBoard).
    writer = metrics.Writer(str(tmp_path), tensorboard=True)
    writer.write({"step": 1, "tokens_seen": 10, "loss": 2.0})
    writer.write({"step": 2, "tokens_seen": 20, "loss": 1.0})
    writer.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["loss", "tokens_seen"]
    assert [e.step for e in events.Scalars("tokens_seen")] == [1, 2]


def test_a_step_recorded_twice_by_a_resumed_leg_is_drawn_once_with_its_last_record(tmp_path):
    # A leg resumed at step 4 evaluates (and could log the step) again: the curves drew both records as two points.
    writer = metrics.Writer(str(tmp_path), tensorboard=False)
    for step in range(1, 5):
        writer.write({"step": step, "tokens_seen": 10 * step, "loss": 5.0 - step})
    writer.write({"step": 4, "tokens_seen": 40, "val_loss": 1.5})
    writer.write({"step": 4, "tokens_seen": 40, "loss": 0.5})
    writer.write({"step": 4, "tokens_seen": 40, "val_loss": 1.25})
    writer.write({"step": 5, "tokens_seen": 50, "loss": 0.25})
    writer.close()
    train_ax, val_ax = figures.training_curves({"run": str(tmp_path)}).axes
    (train_line,), (val_line,) = train_ax.lines, val_ax.lines
    assert train_line.get_xdata().tolist() == [10, 20, 30, 40, 50]
    assert train_line.get_ydata().tolist() == [4, 3, 2, 0.5, 0.25]
    assert val_line.get_xdata().tolist() == [40] and val_line.get_ydata().tolist() == [1.25]


def test_a_run_of_checkpoints_without_metrics_is_not_said_to_have_not_logged_yet(tmp_path):
    """An imported run (weights alone) never logs: figures curves is told what it lacks, not to wait for training."""
    (tmp_path / "run" / "checkpoints" / "20").mkdir(parents=True)
    (tmp_path / "run" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError) as refusal:
        metrics.check_present(str(tmp_path / "run"))
    assert str(refusal.value) == (f"'{tmp_path}/run' has checkpoints but no metrics.jsonl (an imported run, or its file "
                                  "moved away), so no training records to draw: pass runs trained here, or put the "
                                  "file back.")
