"""lm-eval's own command line with the ``sps_jax`` model registered.

  python -m sps_jax.evaluation.lm_eval_cli --model sps_jax --model_args workdir=RUN --tasks arc_easy,wikitext \\
      --include_path sps_jax/evaluation/tasks --batch_size 16

The plain ``lm_eval`` command never imports sps_jax, so it cannot know the model;
this wrapper imports the adapter (which registers it) and hands over to lm-eval.
"""

from __future__ import annotations

import os
import subprocess
import sys

from sps_jax import arguments, cli
from sps_jax.evaluation import lm_eval_adapter  # noqa: F401  (registers "sps_jax")


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
    from lm_eval import evaluator
    from lm_eval.__main__ import cli_evaluate

    if hasattr(evaluator, "get_git_commit_hash"):  # another lm-eval may not ask
        evaluator.get_git_commit_hash = _quiet_git_hash
    sys.argv = ["lm_eval"] + argv
    with arguments.help_write_errors():  # its --help into a full disk or a closed pipe exited 0
        cli_evaluate()


if __name__ == "__main__":
    sys.exit(main())
