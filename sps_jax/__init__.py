"""State-Prediction Separation (SPS) Transformers in JAX/Flax; the design is docs/design.md, the layout README.md."""
