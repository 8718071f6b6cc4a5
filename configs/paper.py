"""The paper's models and training recipe: ``configs/paper.py:SCALE,VARIANT[,WINDOW]``.

Scales xs, s, m, l, xl; variants standard, sps, two_x_memory, delayed_state,
reverse_sps; window defaults to 64 (ignored by standard and two_x_memory).
Example: ``--config configs/paper.py:s,sps,64``.
"""

from sps_jax import config as sps_config


def get_config(arg="s,sps,64"):
    scale, variant, window = sps_config.parse_arg(arg, ("s", "sps", "64"))
    return sps_config.paper_config(scale.lower(), variant, sps_config.parse_window(window))
