"""Deviceless (ahead-of-time) compilation: build an accelerator that is not attached from its
published description (``sps_jax.hardware``), lower and compile programs for it, and read what
the compiler knows: binaries, registers and spills, shared memory, per-device memory and FLOPs.

This is compile-time evidence. It shows that a program lowers and fits; it does not show how fast
it runs (``python -m sps_jax.bench compile`` is the command; docs/pallas.md has the GPU figures,
docs/tpu.md the TPU ones). ``gpu_kernels``: the Pallas kernels as GPU binaries; ``tpu_kernels``:
splash attention's Mosaic kernels for TPU.
"""
