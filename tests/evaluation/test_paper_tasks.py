"""The paper's task set."""

from sps_jax import vocab
from sps_jax.evaluation import paper_tasks


def test_paper_task_groups_expand_to_the_papers_nine_tasks():
    assert paper_tasks.expand(["paper"]) == ["arc_easy", "hellaswag", "piqa", "sciq", "lambada",
                                             "wikitext", "c4", "pile_books3", "govreport"]
    assert paper_tasks.expand(["zero_shot,wikitext"])[-1] == "wikitext"
    assert vocab.PAD_ID == 50303  # the adapter pads with the model's pad id, 50303 for real checkpoints
