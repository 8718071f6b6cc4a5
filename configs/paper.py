"""The paper's models and training recipe: ``configs/paper.py:SCALE,VARIANT[,WINDOW]``.

Scales xs, s, m, l, xl; variants standard, sps, two_x_memory, delayed_state,
reverse_sps; the defaults are ``s,sps`` and the window ``masks.DEFAULT_WINDOW`` (64; standard and
two_x_memory have none). Example: ``--config configs/paper.py:s,sps,64``.
"""

from sps_jax import config as sps_config, masks


def get_config(arg=""):
    usage = "SCALE,VARIANT[,WINDOW]"
    scale, variant, window = sps_config.parse_arg(
        arg, (sps_config.DEFAULT_SCALE, masks.DEFAULT_VARIANT, str(masks.DEFAULT_WINDOW)), usage)
    return sps_config.paper_config(scale, variant, sps_config.parse_window(window, usage))
