"""State-Prediction Separation (SPS) Transformers in JAX/Flax; the design is docs/design.md, the layout README.md."""

import os as _os

# With the CUDA plugin installed (the aot-gpu or test extra) on a machine with no NVIDIA driver, jax
# prints a traceback from the plugin's library check before falling back to the CPU. The check only
# diagnoses GPU set-ups, so skip it where there is no driver to check; deviceless GPU compiles need
# the plugin loaded this way anyway.
if not _os.path.exists("/proc/driver/nvidia/version"):
    _os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

from sps_jax import cli_process as _cli_process  # standard library only: it must not slow the import down

_cli_process.refuse_library_module()
_cli_process.quiet_interrupt_while_starting()
