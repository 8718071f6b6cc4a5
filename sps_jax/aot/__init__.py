"""Deviceless (ahead-of-time) compilation: build an accelerator that is not attached from its
published description (``sps_jax.hardware``), lower and compile programs for it, and read what the
compiler knows (per-device memory, FLOPs). This is compile-time evidence: it shows that a program
lowers and fits, not how fast it runs. ``sps_jax.aot.tpu``: TPU v5e and v6e through libtpu.
"""
