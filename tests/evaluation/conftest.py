"""Fixtures of the evaluation tests."""

import json

import pytest


@pytest.fixture(scope="module")
def local_tasks(tmp_path_factory):
    from tests.evaluation.helpers import CORPUS_DOCS, MC_DOCS, MC_YAML  # imports lm_eval, which may be absent

    root = tmp_path_factory.mktemp("tasks")
    with open(root / "mc.jsonl", "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in MC_DOCS)
    with open(root / "books.jsonl", "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in CORPUS_DOCS)
    (root / "yaml").mkdir()
    (root / "yaml" / "tiny_mc.yaml").write_text(MC_YAML.format(data=root / "mc.jsonl"))
    return root
