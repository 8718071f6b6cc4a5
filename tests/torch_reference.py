"""The authors' model written out directly in numpy (float64), with no sps-jax code: the reference that
imported and exported checkpoints are checked against. Slots are interleaved x0 rho0 x1 rho1 ...,
Linear weights are [out, in], RoPE rotates interleaved pairs (2k, 2k+1), and the visibility rule is
docs/design.md section 1 written out slot by slot."""

import numpy as np

# variant -> (streams, persistent streams, the stream logits are read from); stream 0 is x, 1 is rho.
VARIANTS = {
    "standard": (1, {0}, 0),
    "sps": (2, {0}, 1),
    "two_x_memory": (2, {0, 1}, 1),
    "delayed_state": (2, {1}, 1),
    "reverse_sps": (2, {1}, 0),
}


def allowed(tokens, variant, window, eos_id, pad_id):
    """[N, N] visibility of the interleaved slots of one sequence."""
    S, persistent, _ = VARIANTS[variant]
    doc, next_doc = [], 0
    for t in tokens:  # an EOS belongs to the document it ends; a pad is a document of its own
        if t == pad_id:
            doc.append(("pad", len(doc)))
            continue
        doc.append(next_doc)
        next_doc += t == eos_id
    slots = [(i, s) for i in range(len(tokens)) for s in range(S)]

    def sees(i, s, j, t):
        in_window = t in persistent or window is None or i - j <= window
        return 2 * j + t <= 2 * i + s and doc[j] == doc[i] and in_window

    return np.array([[sees(i, s, j, t) for j, t in slots] for i, s in slots])


def random_state_dict(rng, num_layers, d_model, vocab_size, scale):
    """A float32 state dict in their key names: N(0, 1) embeddings, norm scales 1 + N(0, scale^2), matrices
    N(0, scale^2), lm_head tied to the embedding."""
    D = d_model
    normal = lambda *shape: (scale * rng.normal(size=shape)).astype(np.float32)  # noqa: E731
    sd = {"transformer.wte.weight": rng.normal(size=(vocab_size, D)).astype(np.float32),
          "transformer.output_norm.weight": 1 + normal(D)}
    for i in range(num_layers):
        h = f"transformer.h.{i}."
        sd.update({h + "attention_norm.weight": 1 + normal(D), h + "mlp_norm.weight": 1 + normal(D),
                   h + "attn.c_attn.weight": normal(3 * D, D), h + "attn.c_proj.weight": normal(D, D),
                   h + "mlp.gate_proj.weight": normal(3 * D, D), h + "mlp.up_proj.weight": normal(3 * D, D),
                   h + "mlp.down_proj.weight": normal(D, 3 * D)})
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    return sd


def numpy_forward(sd, tokens, variant, window, num_heads, predict_id, eos_id, pad_id, rope_theta=10000.0):
    """Next-token logits [T, V] of a state dict (their key names, numpy arrays, no ``_orig_mod.`` prefix); RoPE of
    base ``rope_theta``."""
    sd = {k: np.asarray(v, np.float64) for k, v in sd.items()}
    S, _, logits_stream = VARIANTS[variant]
    wte = sd["transformer.wte.weight"]
    D = wte.shape[1]
    H, K = num_heads, D // num_heads
    L = len({k.split(".")[2] for k in sd if k.startswith("transformer.h.")})
    x = np.stack([wte[t] if s == 0 else wte[predict_id] for t in tokens for s in range(S)])  # [N, D]
    pos = np.repeat(np.arange(len(tokens)), S)
    mask = allowed(tokens, variant, window, eos_id, pad_id)

    def rms(v, w):
        return v / np.sqrt(np.mean(v * v, -1, keepdims=True) + 1e-6) * w

    def rope(v):  # [N, H, K]
        ang = pos[:, None, None] * rope_theta ** (-np.arange(0, K, 2) / K)
        a, b = v[..., 0::2], v[..., 1::2]
        out = np.empty_like(v)
        out[..., 0::2] = a * np.cos(ang) - b * np.sin(ang)
        out[..., 1::2] = a * np.sin(ang) + b * np.cos(ang)
        return out

    for i in range(L):
        p = f"transformer.h.{i}."
        h = rms(x, sd[p + "attention_norm.weight"])
        qkv = h @ sd[p + "attn.c_attn.weight"].T
        q, k, v = (qkv[:, j * D:(j + 1) * D].reshape(-1, H, K) for j in range(3))
        q, k = rope(q), rope(k)
        scores = np.where(mask[None], np.einsum("qhk,shk->hqs", q, k) / np.sqrt(K), -np.inf)
        w = np.exp(scores - scores.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        x = x + np.einsum("hqs,shk->qhk", w, v).reshape(-1, D) @ sd[p + "attn.c_proj.weight"].T
        h = rms(x, sd[p + "mlp_norm.weight"])
        gate = h @ sd[p + "mlp.gate_proj.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ sd[p + "mlp.up_proj.weight"].T)) @ sd[p + "mlp.down_proj.weight"].T
    x = rms(x, sd["transformer.output_norm.weight"])
    return x[logits_stream::S] @ sd["lm_head.weight"].T
