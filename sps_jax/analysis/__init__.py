"""Analysis: the paper's probes (``python -m sps_jax.analysis.probes``, ``sps-probes``) and result
figures (``python -m sps_jax.analysis.figures``, ``sps-figures``)."""
