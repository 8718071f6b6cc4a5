"""One quick question to the Hugging Face hub before a command waits on `datasets`.

Offline, `datasets` retries an unreachable hub five times (about 24 s, a warning line each) before it fails;
the hub answers in well under a second when it can be reached. So `data prepare --source hf:NAME` and
`evaluate --tasks` ask it once, within :data:`PROBE_SECONDS`, and say in one sentence what cannot work, while
anything else (an answer of any kind, offline mode, a local dataset folder, a dataset already in the local
cache) is left to `datasets`.
"""

from __future__ import annotations

import glob
import os

PROBE_SECONDS = 5.0
UNKNOWN = "unknown"  # probe's answer for a dataset the hub does not have, or not for this machine


def probe(name: str) -> str | None:
    """None when the hub answered about dataset ``name`` or need not be asked (offline mode: HF_HUB_OFFLINE or
    HF_DATASETS_OFFLINE; a local folder of that name); :data:`UNKNOWN` when it has no such dataset this machine
    may read; else why no answer came within :data:`PROBE_SECONDS` (offline, a closed endpoint)."""
    import huggingface_hub
    from huggingface_hub import utils

    if offline_variable() or os.path.exists(name):
        return None
    try:
        huggingface_hub.HfApi().dataset_info(name, timeout=PROBE_SECONDS)
    except utils.GatedRepoError:
        return None
    except utils.RepositoryNotFoundError:
        return UNKNOWN
    except utils.HfHubHTTPError:  # a rate limit, a server error: `datasets` says it
        return None
    except Exception as e:  # the HTTP client's transport errors (httpx's or requests', by version): no answer at all
        return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return None


def offline_variable() -> str | None:
    """The environment variable that puts `datasets` or the hub's client in offline mode (HF_HUB_OFFLINE,
    HF_DATASETS_OFFLINE or TRANSFORMERS_OFFLINE), or None when neither is: offline, they read the local caches
    only."""
    import datasets
    import huggingface_hub

    if not (huggingface_hub.constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE):
        return None
    return next((name for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
                 if os.environ.get(name)), "HF_HUB_OFFLINE")


def cached(name: str) -> bool:
    """Whether hub dataset ``name`` has files in the local caches, which `datasets` may read without the hub:
    a prepared copy (``HF_DATASETS_CACHE/<namespace>___<name>/<config>/<version>/<hash>``, as `datasets` looks
    for one) or downloaded files (``HF_HUB_CACHE/datasets--<namespace>--<name>``)."""
    import datasets
    import huggingface_hub

    parts = name.split("/")
    parts[-1] = datasets.naming.camelcase_to_snakecase(parts[-1])
    prepared = os.path.join(os.path.expanduser(str(datasets.config.HF_DATASETS_CACHE)), "___".join(parts))
    downloaded = os.path.join(huggingface_hub.constants.HF_HUB_CACHE, "datasets--" + name.replace("/", "--"))
    return os.path.isdir(downloaded) or any(os.path.isdir(p) for p in glob.glob(os.path.join(prepared, "*", "*", "*")))
