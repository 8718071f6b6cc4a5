"""Analysis: the paper's probes (``python -m sps_jax.analysis.probes``, ``sps-probes``) and result
figures (``python -m sps_jax.analysis.figures``, ``sps-figures``)."""

# The probes' defaults, here for the functions and the command alike (the command reads them without loading jax).
GRADIENT_BATCH = 1  # documents per forward pass of the gradient probe
GRADIENT_CHUNK = 8  # loss terms per batched reverse pass of the gradient probe
WINDOW_NLL_BATCH = 4  # documents per forward pass of the window ablation
PAPER_OMEGA = 64  # Figure 5b's persistent window omega: the paper's, distinct from the prediction window w (also 64)
