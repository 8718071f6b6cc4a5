"""Every ```python block of README.md and docs/*.md runs as written, in a fresh namespace and a folder of its own.

A name a block uses without defining it (the q, k, v it attends over) comes from STAND_INS, the smallest value
that fits; a relative path it reads ("runs/tiny") from PATH_STAND_INS, made in the folder it runs in. Kernels
that need their own accelerator (the Pallas GPU kernels, splash's TPU kernels) run elsewhere in the Pallas
interpreter: ``attention`` gets ``interpret=True`` unless a call says otherwise, as the docs say a direct call
off that accelerator needs.
"""

import builtins
import functools
import pathlib
import re
import symtable

import jax
import numpy as np
import pytest

from sps_jax import config as sps_config, model as sps_model, pallas_attention, runs, splash_attention
from tests.helpers import REPO

DOCS = ["README.md"] + sorted(str(p.relative_to(REPO)) for p in pathlib.Path(REPO, "docs").glob("*.md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
# {text a block holds: why that block runs only under -m slow}
SLOW = {'"configs/paper.py:xs': "the paper's XS model: about 10 s of init and compile on two CPU cores"}
# The accelerator each kernel module's ``attention`` runs on without the interpreter.
KERNELS = {pallas_attention: "gpu", splash_attention: "tpu"}


def blocks():
    for doc in DOCS:
        text = pathlib.Path(REPO, doc).read_text()
        for match in BLOCK.finditer(text):
            source = match.group(1)
            where = f"{doc}:{text.count(chr(10), 0, match.start()) + 1}"
            slow = [why for key, why in SLOW.items() if key in source]
            yield pytest.param(where, source, id=where, marks=[pytest.mark.slow] if slow else [])


def attention_inputs():
    """q, k, v [B, T, S, H, K] of an SPS model (two streams) and two documents' ids, one tile of any kernel."""
    rng = np.random.default_rng(0)
    q, k, v = (jax.numpy.asarray(rng.normal(size=(1, 16, 2, 2, 8)), "float32") for _ in range(3))
    return {"q_BTSHK": q, "k_BTSHK": k, "v_BTSHK": v, "doc_ids_BT": np.repeat(np.int32([[0, 1]]), 8, axis=1)}


# {name: a function returning values by name, that one among them}
STAND_INS = dict.fromkeys(("q_BTSHK", "k_BTSHK", "v_BTSHK", "doc_ids_BT"), attention_inputs)


def tiny_run(path):
    """A loadable run of the tiny SPS model shrunk further, with random weights: GPT-2 ids are in its vocabulary."""
    config = sps_config.load_config("configs/tiny.py:sps,4")
    config.model.num_layers, config.model.d_model, config.model.d_ff, config.model.seq_len = 1, 32, 96, 64
    runs.save_run(str(path), config, sps_model.init_params(sps_model.Transformer(config.model),
                                                           jax.random.PRNGKey(0)), step=1)


PATH_STAND_INS = {"runs/tiny": tiny_run}


def undefined_names(source: str, where: str) -> set[str]:
    """Names the block reads at its top level without assigning or importing them, builtins aside."""
    table = symtable.symtable(source, where, "exec")
    return {s.get_name() for s in table.get_symbols()
            if s.is_referenced() and not (s.is_assigned() or s.is_imported()) and not hasattr(builtins, s.get_name())}


def test_the_blocks_found_include_those_of_readme_generate_pallas_and_tpu():
    found = {param.values[0].split(":")[0] for param in blocks()}
    assert {"README.md", "docs/generate.md", "docs/pallas.md", "docs/tpu.md"} <= found, found


@pytest.mark.parametrize("where, source", list(blocks()))
def test_python_block_of_the_docs_runs_as_written(where, source, tmp_path, monkeypatch):
    missing = sorted(undefined_names(source, where) - STAND_INS.keys())
    assert not missing, (f"{where} uses {', '.join(missing)} without defining it: add a stand-in to STAND_INS in "
                         "tests/test_docs_python.py")
    for module, platform in KERNELS.items():
        if jax.default_backend() != platform:
            monkeypatch.setattr(module, "attention", functools.partial(module.attention, interpret=True))
    monkeypatch.chdir(tmp_path)  # configs/ resolves to the shipped configs from any folder
    for path, make in PATH_STAND_INS.items():
        if path in source:
            make(tmp_path / path)
    namespace = {name: STAND_INS[name]()[name] for name in undefined_names(source, where)}
    exec(compile(source, where, "exec"), namespace)
