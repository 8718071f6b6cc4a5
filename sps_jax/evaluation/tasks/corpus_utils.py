"""lm-eval hooks for the corpus-NLL tasks shipped with sps_jax.

Words are counted on the raw document as lm-eval's wikitext and c4 tasks do
(``len(re.split(r"\\s+", text))``), so ln(word_perplexity) is the document
log-likelihood summed over the corpus divided by its word count: nats per word.
"""

import re


def _results(text, results):
    (loglikelihood,) = results
    n_bytes = len(text.encode("utf-8"))
    return {
        "word_perplexity": (loglikelihood, len(re.split(r"\s+", text))),
        "byte_perplexity": (loglikelihood, n_bytes),
        "bits_per_byte": (loglikelihood, n_bytes),
    }


def text_results(doc, results):
    return _results(doc["text"], results)


def report_results(doc, results):
    return _results(doc["report"], results)
