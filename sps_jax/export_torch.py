"""Export a run's weights in the authors' PyTorch checkpoint layout (the reverse of ``import_torch``).

  python -m sps_jax.export_torch --workdir RUN [--step N] --out FILE.pt|FILE.safetensors [--dtype float32|bfloat16]
      [--force]

RUN may also be given as a word of its own (``export_torch RUN --out FILE``), as scripts written before
``--workdir`` give it; not both.

``FILE.pt`` is a ``torch.save``d dict as their code writes it: ``model`` (the state dict, their key
names and shapes, ``lm_head.weight`` tied to ``transformer.wte.weight``), ``model_args`` and
``iter_num`` (the step), plus ``sps_jax_config`` (this run's config as JSON, which their code ignores
and ``import_torch`` starts from). ``FILE.safetensors`` holds the same tensors under the same names,
and the other entries as JSON strings in its metadata; writing it needs only the ``safetensors``
package, not torch. Parameters are written as float32 (exact) or rounded to bfloat16. An existing
FILE is replaced only with ``--force``. ``sps_jax.torch_layout`` holds the mapping both ways.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import ml_dtypes
import numpy as np

from sps_jax import arguments, cli, cli_process, config_checks, files, path_checks, run_files, torch_layout
from sps_jax.cli import MissingPackage, UserError
from sps_jax.names import did_you_mean

# sps_jax.runs and sps_jax.model load jax, which --help and a refused argument need not wait for: the functions
# that read a run import them.

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}  # ml_dtypes' is numpy's bfloat16, as jax's is
DEFAULT_DTYPE = "float32"  # the weights as training holds them (model.param_dtype)
FORMATS = {".pt": "torch", ".safetensors": "safetensors"}  # file suffix -> the package that writes it


def _suffix(out: str) -> str | None:
    """``out``'s suffix among FORMATS as written, in any case (MODEL.PT is a .pt file, as import_torch reads it): read
    from its end, as splitext reads o/.pt as a hidden file with no suffix (check_stem names its missing name)."""
    return next((out[-len(s):] for s in FORMATS if out.lower().endswith(s)), None)


def _format(out: str) -> str | None:
    """The package that writes ``out``, by :func:`_suffix`."""
    suffix = _suffix(out)
    return None if suffix is None else FORMATS[suffix.lower()]


def check_output(out: str, force: bool = False) -> str:
    """The writer package of ``out`` (``torch`` or ``safetensors``), after the checks that need no
    loading: a known suffix, no existing file unless ``force``, the package installed (else one sentence)."""
    arguments.true_or_false(force, "force")
    suffix = _suffix(out)
    if suffix is not None:
        path_checks.check_stem(out.removesuffix(suffix), out, suffix,
                               os.path.join(os.path.dirname(out), "model" + suffix))
    fmt, flag = _format(out), cli.named("out", "--out")
    if fmt is None:
        raise UserError(f"{flag} {out!r} must end in .pt (torch) or .safetensors.")
    if os.path.isdir(out):
        raise UserError(f"{flag} {out} is a folder: pass a file ending in .pt or .safetensors.")
    run_files.output_file(out, flag, force)  # an existing file, a parent this user cannot write in, a long name
    if importlib.util.find_spec(fmt) is None:  # asked without importing it: torch's import takes seconds
        raise MissingPackage(f"writing {os.path.splitext(out)[1]} files needs the {fmt} package: "
                          f"pip install -e '.[{fmt}]'.")
    return fmt


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise UserError(f"{cli.named('dtype', '--dtype')} {dtype!r}{did_you_mean(dtype, DTYPES)} must be one of "
                        f"{', '.join(DTYPES)}.")


def checkpoint_dict(config, params, step: int, dtype: str = DEFAULT_DTYPE,
                    mismatch: tuple[str, str] | None = None) -> dict:
    """The authors' checkpoint dict of a run's config and parameters, tensors as numpy arrays. Params of another
    model than ``config.model`` are refused (a deeper model's extra layers were dropped without a word), in
    ``mismatch``'s words (default ``runs.OTHER_CONFIG``: a caller's config and params)."""
    from sps_jax import model as sps_model, runs

    _check_dtype(dtype)
    step = runs.saved_step(step)
    if mismatch is None:  # a caller's config and params; a run's own were checked as it loaded (runs.RUN_CHECKPOINT)
        cfg = runs.check_stored_params(config, params)
    else:
        cfg = sps_model.ModelConfig.from_config(config.model)
        runs.check_params(sps_model.Transformer(cfg), params, mismatch)
    return {torch_layout.MODEL: torch_layout.to_state_dict(params, DTYPES[dtype]),
            torch_layout.MODEL_ARGS: torch_layout.model_args(cfg),
            torch_layout.STEP: int(step),
            torch_layout.CONFIG: config.to_json_best_effort(sort_keys=True)}


def _torch_tensors(sd: dict[str, np.ndarray]) -> dict:
    import torch

    out, seen = {}, {}
    for key, array in sd.items():
        if id(array) not in seen:  # a tied array stays one tensor, stored once, as in their state dict
            if array.dtype == DTYPES["bfloat16"]:  # torch has no numpy bfloat16: reinterpret the bits
                seen[id(array)] = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
            else:
                seen[id(array)] = torch.from_numpy(array)
        out[key] = seen[id(array)]
    return out


def write(ckpt: dict, out: str, force: bool = False) -> None:
    """Write a checkpoint dict as ``.pt`` or ``.safetensors`` (by suffix), atomically; an existing ``out`` is
    replaced only with ``force``, and a run's own files never (:func:`check_output`)."""
    out = path_checks.path_text(out, "out")
    check_output(out, force)
    fmt = _format(out)
    with files.atomic_path(out) as partial:
        if fmt == "torch":
            import torch

            torch.save({**ckpt, torch_layout.MODEL: _torch_tensors(ckpt[torch_layout.MODEL])}, partial)
        else:
            from safetensors.numpy import save_file

            save_file(ckpt[torch_layout.MODEL], partial, metadata=torch_layout.safetensors_metadata(ckpt))
            # safetensors writes through a private temporary file (mode 0600): give the file the mode that every
            # other output gets under this umask, so others may read it where they may read a .pt file.
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(partial, 0o666 & ~umask)


def export_run(run: str, out: str, step: int | None = None, dtype: str = DEFAULT_DTYPE, force: bool = False) -> dict:
    """Export a run folder's latest (or given) checkpoint to ``out``; returns the checkpoint dict written."""
    from sps_jax import runs

    run, out = path_checks.path_text(run, "run"), path_checks.path_text(out, "out")
    check_output(out, force)
    _check_dtype(dtype)  # before the weights load, as the command's --dtype choices refuse it
    config, params, step = runs.load_run(run, step)  # a bad config.json stops before any weights load
    ckpt = checkpoint_dict(config, params, step, dtype, runs.RUN_CHECKPOINT)
    with files.results(force):
        write(ckpt, out, force)
    return ckpt


def _run_argument(parser, args) -> str:
    """The run of ``--workdir``, or of the word of its own that scripts give: one of them, else one sentence."""
    if args.workdir is not None and args.run is not None:
        parser.error(f"the run is given twice, as {args.run} and as --workdir {args.workdir}: pass --workdir alone")
    if args.workdir is None and args.run is None:
        parser.error("no run is given: pass --workdir RUN")
    return args.run if args.workdir is None else args.workdir


@cli.main
def main(argv=None) -> int:
    p = arguments.ArgumentParser(prog="python -m sps_jax.export_torch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=arguments.run_path, default=None,
                   help=arguments.RUN_HELP)
    p.add_argument("run", nargs="?", type=arguments.run_path, default=None,
                   help="the same as --workdir RUN, for scripts that give the run as a word of its own")
    p.add_argument("--step", type=config_checks.step_argument, default=None,
                   help=arguments.STEP_HELP.format("to export"))
    p.add_argument("--out", type=arguments.output_path, required=True,
                   help="FILE.pt (needs torch) or FILE.safetensors (needs safetensors); an existing file is refused "
                        "unless --force")
    p.add_argument("--dtype", default=DEFAULT_DTYPE, choices=sorted(DTYPES),
                   help="the dtype the parameters are written in: float32 (exact) or bfloat16 (rounded)")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    args = p.parse_args(argv)
    run = _run_argument(p, args)
    check_output(args.out, args.force)  # before jax loads, as is the run path
    run_files.checkpoint_step(run, args.step)
    cli_process.load("sps_jax.runs")  # the run's weights
    ckpt = export_run(run, args.out, args.step, args.dtype, args.force)
    args_ = ckpt[torch_layout.MODEL_ARGS]
    cli.note(f"wrote {args.out}: step {ckpt[torch_layout.STEP]}, {len(ckpt[torch_layout.MODEL])} tensors "
          f"({args.dtype}), {args_['n_layer']} layers, d={args_['hidden_size']}, {args_['n_head']} heads, "
          f"vocab {args_['vocab_size']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
