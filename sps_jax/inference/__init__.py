"""Inference: the KV cache, generation (``decoding``; its command ``python -m sps_jax.inference.generate``,
``sps-generate``) and batched scoring of token sequences."""
