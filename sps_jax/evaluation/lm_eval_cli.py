"""lm-eval's own command line with the ``sps_jax`` model registered.

  python -m sps_jax.evaluation.lm_eval_cli --model sps_jax --model_args workdir=RUN --tasks arc_easy,wikitext \\
      --include_path sps_jax/evaluation/tasks --batch_size 16

The plain ``lm_eval`` command never imports sps_jax, so it cannot know the model;
this wrapper imports the adapter (which registers it) and hands over to lm-eval.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys

from sps_jax import arguments, cli
from sps_jax.evaluation import lm_eval_tasks


def _quiet_git_hash():
    """lm-eval's git_hash of its results, the working directory's commit, asked of `git describe` without git's
    stderr: lm-eval's own call prints "fatal: not a git repository" outside a checkout, in a run that succeeds."""
    from lm_eval.loggers import utils

    try:
        return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
    except (subprocess.CalledProcessError, FileNotFoundError):  # no checkout here, or no git installed
        return utils.get_commit_from_path(os.getcwd())


@cli.main  # our own errors (a missing run folder, ...) are one sentence; lm-eval's parser keeps its usage text
def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--version"]:  # lm-eval's parser has no --version; a bug report needs both packages'
        print(f"{arguments.version()}; lm-eval {arguments.distribution_version('lm_eval')}")
        return
    lm_eval_tasks.adapter()  # registers "sps_jax" with lm-eval, or names the extra that installs it
    from lm_eval import evaluator
    from lm_eval.__main__ import cli_evaluate

    if hasattr(evaluator, "get_git_commit_hash"):  # another lm-eval may not ask
        evaluator.get_git_commit_hash = _quiet_git_hash
    sys.argv = ["lm_eval"] + argv
    # help_write_errors: its --help into a full disk exited 0
    with arguments.help_write_errors(), _model_args_checked_first(), _logs_to_stderr_now():
        cli_evaluate()


class _StderrNow(logging.StreamHandler):
    """A log handler that writes each record to ``sys.stderr`` as it is when the record is made."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _):  # StreamHandler's __init__ and setStream set it: the stream is always the one of the moment
        pass


@contextlib.contextmanager
def _logs_to_stderr_now():
    """lm-eval's command line adds its log handler once per process, bound to ``sys.stderr`` as it was then: a stream
    a notebook cell or a test held, closed since, where the records of every later lm-eval run in the process failed
    as "--- Logging error ---" tracebacks. Each handler to that stream added while this runs is replaced by one that
    writes to ``sys.stderr`` as it is at each record, with the same level and format."""
    logger = logging.getLogger("lm_eval")
    before = list(logger.handlers)
    try:
        yield
    finally:
        for handler in [h for h in logger.handlers if h not in before]:
            if type(handler) is logging.StreamHandler and handler.stream is sys.stderr:
                now = _StderrNow()
                now.setLevel(handler.level)
                now.setFormatter(handler.formatter)
                logger.removeHandler(handler)
                logger.addHandler(now)


@contextlib.contextmanager
def _model_args_checked_first():
    """lm-eval's reading of its arguments followed by the sps_jax model's checks of --model_args
    (:func:`lm_eval_adapter.check_model_args`): lm-eval indexes its tasks, about 20 s, before it builds the model,
    which only then said a missing run folder or a bad step. Another lm-eval, without that reader, checks them when
    it builds the model, as before."""
    try:
        from lm_eval.config.evaluate_config import EvaluatorConfig
    except ImportError:
        yield
        return
    from_cli = EvaluatorConfig.__dict__.get("from_cli")
    if not isinstance(from_cli, classmethod):
        yield
        return

    lm_eval_adapter = lm_eval_tasks.adapter()

    def checked(cls, namespace):
        config = from_cli.__func__(cls, namespace)
        if config.model == "sps_jax":  # the keys lm-eval hands the model beside them, as simple_evaluate does
            lm_eval_adapter.check_model_args(config.model_args or {}, {
                "batch_size": config.batch_size, "max_batch_size": config.max_batch_size, "device": config.device})
        return config

    EvaluatorConfig.from_cli = classmethod(checked)
    try:
        yield
    finally:
        EvaluatorConfig.from_cli = from_cli


if __name__ == "__main__":
    sys.exit(main())
