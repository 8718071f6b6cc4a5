"""Inference: the KV cache, generation (``python -m sps_jax.inference.generate``, ``sps-generate``)
and batched scoring of token sequences."""
