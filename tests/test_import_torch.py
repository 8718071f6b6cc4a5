"""The authors' PyTorch checkpoint layout imports to a run folder that computes the same logits as an
independent numpy forward of their state dict, in the paper's interleaved x0 rho0 x1 rho1 ... order."""

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sps_jax import import_torch, runs  # noqa: E402
from tests.helpers import run_module  # noqa: E402
from tests.torch_reference import numpy_forward  # noqa: E402

V, D, H, L, T = 64, 32, 2, 2, 12
EOS, PREDICT, PAD = 60, 61, 63
OVERRIDES = [f"--config.model.eos_id={EOS}", f"--config.model.predict_id={PREDICT}",
             f"--config.model.pad_id={PAD}", "--config.model.attention=xla", "--config.model.dtype=float32"]


def synthetic_state_dict(seed=0, compiled=True):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=0.3):
        return torch.randn(*shape, generator=g) * scale

    p = "_orig_mod." if compiled else ""
    sd = {p + "transformer.wte.weight": rnd(V, D, scale=1.0), p + "transformer.output_norm.weight": 1 + rnd(D)}
    for i in range(L):
        h = f"{p}transformer.h.{i}."
        sd.update({h + "attention_norm.weight": 1 + rnd(D), h + "attn.c_attn.weight": rnd(3 * D, D),
                   h + "attn.c_proj.weight": rnd(D, D), h + "mlp_norm.weight": 1 + rnd(D),
                   h + "mlp.gate_proj.weight": rnd(3 * D, D), h + "mlp.up_proj.weight": rnd(3 * D, D),
                   h + "mlp.down_proj.weight": rnd(D, 3 * D)})
    sd[p + "lm_head.weight"] = sd[p + "transformer.wte.weight"]
    return {k: v.contiguous() for k, v in sd.items()}


@pytest.mark.parametrize("variant,window", [("sps", 2), ("standard", None), ("reverse_sps", 1)])
def test_imported_checkpoint_gives_the_logits_of_the_original(tmp_path, variant, window):
    sd = synthetic_state_dict()
    path = tmp_path / "ckpt.pt"
    torch.save({"model": sd, "model_args": {"n_head": H, "n_layer": L, "n_embd": D, "block_size": T},
                "config": {"dataset": "fineweb-edu"}, "iter_num": 3}, path)
    rc = import_torch.main([str(path), "--variant", variant, "--window", str(window),
                            "--out", str(tmp_path / "run"), *OVERRIDES])
    assert rc == 0
    net, params, step = runs.load_model(str(tmp_path / "run"))
    assert step == 3 and net.cfg.num_heads == H and net.cfg.seq_len == T and net.cfg.variant == variant
    tokens = [5, 17, 3, 44, EOS, 9, 9, 12, 30, 2, 1, 58]
    ours = np.asarray(net.apply({"params": params}, jnp.asarray([tokens], jnp.int32))[0])
    theirs = numpy_forward({k.replace("_orig_mod.", ""): v.numpy() for k, v in sd.items()}, tokens, variant, window,
                           H, PREDICT, EOS, PAD)
    np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=2e-4)


def test_untrusted_pickles_are_refused_unless_the_user_opts_in(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save({"model": synthetic_state_dict(), "config": {"odd": np.dtype("float32").type}}, path)
    with pytest.raises(ValueError, match="--trust-pickle"):
        import_torch.load_torch_checkpoint(str(path))
    assert "model" in import_torch.load_torch_checkpoint(str(path), trust_pickle=True)


def test_cli_reports_a_file_that_is_not_a_checkpoint(tmp_path):
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    proc = run_module("sps_jax.import_torch", tmp_path / "other.pt", "--variant", "sps", "--out", tmp_path / "run")
    assert proc.returncode == 2 and "not an SPS PyTorch checkpoint" in proc.stderr
