"""A tiny model for CPU runs and tests: ``configs/tiny.py[:VARIANT[,WINDOW]]``.

The paper's backbone and GPT-2 vocabulary, shrunk so that a few hundred steps
run in minutes on two CPU cores.
"""

from sps_jax import config as sps_config


def get_config(arg="sps,8"):
    variant, window = sps_config.parse_arg(arg, ("sps", "8"), "VARIANT[,WINDOW]")
    config = sps_config.paper_config("xs", variant, sps_config.parse_window(window))
    config.name = sps_config.run_name("tiny", config.model)
    m = config.model
    m.num_layers, m.d_model, m.num_heads, m.d_ff = 2, 64, 2, 192
    m.seq_len = 128
    m.attention = "xla"
    m.dtype = "float32"
    t = config.train
    t.global_batch = t.micro_batch = 8
    t.total_tokens = 300 * 8 * 128
    t.warmup_tokens = 20 * 8 * 128
    t.peak_lr, t.final_lr = 3e-3, 3e-4
    t.log_every, t.eval_every = 20, 100
    t.checkpoint_every, t.milestone_every = 100, 0
    config.data.dir = "data/builtin"  # prepared on first use, no download
    config.data.val_windows = 64
    return config
