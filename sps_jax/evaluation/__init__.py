"""Evaluation: validation NLL, the paper's tasks through lm-eval, and the results table
(``python -m sps_jax.evaluation.evaluate``, ``sps-evaluate``)."""
