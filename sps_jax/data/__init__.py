"""Token folders: the GPT-2 tokenizer, document sources, preparation and the input pipeline.

``python -m sps_jax.data`` (``sps-data``) prepares and verifies token folders and provisions
the tokenizer; see :mod:`sps_jax.data.__main__`.
"""
