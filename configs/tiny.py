"""A tiny model for CPU runs and tests: ``configs/tiny.py[:VARIANT[,WINDOW]]``.

The paper's backbone and GPT-2 vocabulary, shrunk so that a few hundred steps
run in minutes on two CPU cores.
"""

from sps_jax import config as sps_config, masks

WINDOW = 8  # the tiny context's window, where the paper's 64 would span half of its 128 positions


def get_config(arg=""):
    usage = "VARIANT[,WINDOW]"
    variant, window = sps_config.parse_arg(arg, (masks.DEFAULT_VARIANT, str(WINDOW)), usage)
    config = sps_config.paper_config("xs", variant, sps_config.parse_window(window, usage))
    config.model = sps_config.model_section(config.model.variant, config.model.window)  # ModelConfig's defaults
    config.name = sps_config.run_name("tiny", config.model)
    t = config.train
    t.seed = 0  # the curve the README and the tests measured
    t.global_batch = t.micro_batch = 8
    t.total_tokens = 300 * t.global_batch * config.model.seq_len  # 300 updates
    t.warmup_tokens = 20 * t.global_batch * config.model.seq_len
    t.peak_lr, t.final_lr = 3e-3, 3e-4
    t.log_every, t.eval_every = 20, 100
    t.checkpoint_every, t.milestone_every = 100, 0
    config.data.dir = "data/builtin"  # prepared on first use, no download
    config.data.val_windows = 64
    return config
