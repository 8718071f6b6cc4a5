"""The embedded corpus works offline."""

from sps_jax.data import corpus


def test_builtin_corpus_is_english_prose_shipped_with_python():
    docs = corpus.builtin_documents()
    first = [next(docs) for _ in range(3)]
    assert all(len(d) > 100 for d in first)
    assert sum(1 for _ in docs) > 300
