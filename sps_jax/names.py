"""What a user likely meant by a name that is not one of the known ones (a variant, a scale, a
subcommand, a config key): the one helper behind every "did you mean" in the package's sentences.

It imports nothing from the package, so the modules that own enumerated names (``masks``'s variants, the
backends and dtypes below) use it as well as the command line (``cli``) does, without importing ``cli``. The
backends and dtypes live here, not in the modules that load jax, so that a command's parser offers them (and
refuses others) before jax loads.
"""

from __future__ import annotations

import difflib

ATTENTION_BACKENDS = ("xla", "pallas", "triton", "splash", "auto")  # model.attention (sps_jax.attention)
# What "auto" means on each platform; anything not listed gets the dense reference.
AUTO = {"tpu": "splash", "gpu": "pallas"}
DTYPES = ("bfloat16", "float16", "float32")  # model.dtype, param_dtype, residual_dtype; the kernels' dtypes


def close_name(word: str, names) -> str | None:
    """The one of ``names`` that ``word`` is likely a typo of, or None; the same name in other case
    first (difflib scores 'SPS' against 'sps' as no match)."""
    names = list(names)
    same = [name for name in names if name.lower() == word.lower()]
    found = same or difflib.get_close_matches(word, names, n=1)
    return found[0] if found else None


def check_backend(name) -> None:
    """One sentence, naming the backend ``name`` likely means, when it is none of :data:`ATTENTION_BACKENDS`."""
    if not isinstance(name, str) or name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}{did_you_mean(name, ATTENTION_BACKENDS)}: choose one of "
                         f"{', '.join(ATTENTION_BACKENDS)}.")


def did_you_mean(word, names) -> str:
    """`` (did you mean 'NAME'?)`` for the name of ``names`` that ``word`` likely means, or "" (a
    ``word`` that is no string, such as None, means none of them)."""
    close = close_name(word, names) if isinstance(word, str) else None
    return f" (did you mean {close!r}?)" if close else ""
