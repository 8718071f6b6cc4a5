"""The paper's schedule and the weight-decay mask."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from sps_jax import config as sps_config, optim


S = dict(peak_lr=6e-4, final_lr=6e-5, warmup_tokens=1000, total_tokens=100_000, decay_fraction=0.1)


@pytest.mark.parametrize("tokens, expected", [
    (0, 0.0), (500, 3e-4), (999, 6e-4 * 0.999),   # linear warmup
    (1000, 6e-4), (50_000, 6e-4), (90_000, 6e-4),  # constant until the final 10% of tokens
    (95_000, (6e-4 + 6e-5) / 2), (100_000, 6e-5), (120_000, 6e-5),  # linear decay, then the floor
])
def test_schedule_boundaries(tokens, expected):
    assert float(optim.learning_rate(tokens, **S)) == pytest.approx(expected, rel=1e-5, abs=1e-12)


def test_optax_schedule_counts_tokens_per_update():
    t = ml_collections.ConfigDict(dict(sps_config.train_config()))
    t.update(S)
    lr = optim.schedule(t, tokens_per_step=250)
    assert float(lr(2)) == pytest.approx(3e-4) and float(lr(4)) == pytest.approx(6e-4)


def test_the_paper_schedule_holds_its_rate_past_two_billion_tokens():
    # The paper's run: 20B tokens, 96 x 4096 per update. Update 5462 passes 2**31 tokens, where an int32 product of
    # the update count and the tokens per update wrapped to a negative rate (-0.0066 at update 6000).
    t = sps_config.train_config("s")
    lr = jax.jit(optim.schedule(t, tokens_per_step=96 * 4096))  # as AdamW reads it: an int32 count, traced
    rates = [float(lr(jnp.asarray(k, jnp.int32))) for k in (5461, 5462, 6000, 46_000, 50_000)]
    decayed = lambda k: 6e-4 + (6e-5 - 6e-4) * (k * 96 * 4096 - 18e9) / 2e9  # noqa: E731  the final 10%: 18B to 20B
    assert rates == pytest.approx([6e-4, 6e-4, 6e-4, decayed(46_000), decayed(50_000)], rel=1e-5)


def test_the_first_update_moves_the_weights_at_the_second_updates_rate():
    # As in the authors' trainer, update 0 takes the rate after one update's tokens (6e-4 * 250 / 1000 = 1.5e-4),
    # not 0. Adam's first step is lr * g / (|g| + eps), so a gradient of 2 moves a weight by -1.5e-4.
    t = sps_config.train_config()
    t.update(S)
    t.weight_decay, t.grad_clip = 0.0, None
    opt = optim.optimizer(t, tokens_per_step=250)
    assert float(optim.schedule(t, tokens_per_step=250)(0)) == pytest.approx(1.5e-4)
    params = {"w": jnp.ones((2, 2))}
    updates, _ = opt.update({"w": jnp.full((2, 2), 2.0)}, opt.init(params), params)
    np.testing.assert_allclose(updates["w"], -1.5e-4, rtol=1e-5)


def test_update_count_is_the_number_of_updates_applied():
    t = sps_config.train_config()
    opt = optim.optimizer(t, tokens_per_step=1)
    params = {"w": jnp.ones((2, 2)), "scale": jnp.ones(2)}
    state = opt.init(params)
    assert int(optim.update_count(state)) == 0
    for _ in range(2):
        _, state = opt.update(jax.tree_util.tree_map(jnp.ones_like, params), state, params)
    assert int(optim.update_count(state)) == 2


def test_weight_decay_applies_to_matrices_only(make_model):

    model, params = make_model()
    mask = optim.decay_mask(params)
    assert mask["embed"] and mask["block_0"]["attn"]["qkv"] and mask["block_1"]["mlp"]["down"]
    assert not mask["final_norm"]["scale"] and not mask["block_0"]["attn_norm"]["scale"]
    # With zero gradients only decay moves parameters: matrices shrink, norm scales stay.
    t = sps_config.train_config()
    t.warmup_tokens = 0
    opt = optim.optimizer(t, tokens_per_step=1)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    updates, _ = jax.jit(opt.update)(zeros, opt.init(params), params)  # one compile, not one per eager op
    new = jax.tree_util.tree_map(lambda p, u: p + u, params, updates)
    assert np.all(np.abs(new["embed"]) < np.abs(params["embed"]) + 1e-12)
    assert not np.allclose(new["embed"], params["embed"])
    np.testing.assert_array_equal(new["final_norm"]["scale"], params["final_norm"]["scale"])


def test_the_papers_weight_decay_shrinks_a_matrix_by_lr_times_0_1_per_update_and_leaves_norm_scales():
    """Section 4 (Training): AdamW with weight decay 0.1 at the peak rate 6e-4. Decoupled from the gradient, one
    update with a zero gradient (Adam's own step is then 0) multiplies a decayed weight by 1 - 6e-4 x 0.1 =
    0.99994, worked out by hand; the paper config's optimizer, with its warmup taken out, is the one run."""
    t = sps_config.load_config("configs/paper.py:s,sps").train
    t.warmup_tokens = 0
    opt = optim.optimizer(t, tokens_per_step=96 * 4096)
    params = {"w": jnp.full((2, 3), 2.0), "scale": jnp.full((3,), 2.0)}
    updates, _ = opt.update(jax.tree_util.tree_map(jnp.zeros_like, params), opt.init(params), params)
    np.testing.assert_allclose(params["w"] + updates["w"], 2.0 * 0.99994, rtol=1e-7)
    np.testing.assert_array_equal(params["scale"] + updates["scale"], 2.0)


def updates_of(grad_clip, gradients):
    """The updates of ``optim.optimizer`` at a constant learning rate (no warmup, no decay)."""
    t = sps_config.train_config()
    t.warmup_tokens, t.weight_decay, t.grad_clip = 0, 0.0, grad_clip
    opt = optim.optimizer(t, tokens_per_step=1)
    params = {"w": jnp.ones((2, 2))}
    state, out = opt.init(params), []
    for g in gradients:
        updates, state = opt.update({"w": jnp.full((2, 2), g)}, state, params)
        out.append(updates["w"])
    return out


def test_grad_clip_none_turns_clipping_off_and_a_number_clips():
    # A large gradient, then a small one against it: clipping shrinks the first one's share of Adam's moments.
    gradients = [100.0, -0.1]
    adamw = optax.adamw(6e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0)
    params = {"w": jnp.ones((2, 2))}
    state, plain = adamw.init(params), []
    for g in gradients:
        updates, state = adamw.update({"w": jnp.full((2, 2), g)}, state, params)
        plain.append(updates["w"])
    for ours, theirs in zip(updates_of(None, gradients), plain):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    assert not np.allclose(updates_of(1.0, gradients)[1], plain[1], rtol=1e-3)


def test_the_papers_clipping_at_1_0_scales_the_whole_gradient_by_its_global_norm_before_adamw():
    """Section 4 (Training): AdamW (0.9, 0.95) with "gradient clipping at 1.0", nanoGPT's clip of the global norm:
    a gradient of norm 5 over two weights (3 and 4) enters Adam as 0.6 and 0.8, one factor for the whole
    gradient, where clipping each weight or each entry on its own gives 1 and 1. The second update (a gradient of
    norm 0.5, left as it is) is written out from Adam's moments by hand; its first update is +-lr whatever the
    scale, so only the second shows the clip. Parameters at 0 take no decay."""
    t = sps_config.load_config("configs/paper.py:s,sps").train
    t.warmup_tokens = 0
    opt = optim.optimizer(t, tokens_per_step=96 * 4096)
    params = {"a": jnp.zeros((1, 1)), "b": jnp.zeros((1, 1))}
    state = opt.init(params)
    for g in ({"a": 3.0, "b": 4.0}, {"a": 0.3, "b": -0.4}):
        updates, state = opt.update({k: jnp.full((1, 1), v) for k, v in g.items()}, state, params)

    def adam_second_update(g1, g2, lr=6e-4, b1=0.9, b2=0.95, eps=1e-8):
        m = b1 * (1 - b1) * g1 + (1 - b1) * g2
        v = b2 * (1 - b2) * g1 ** 2 + (1 - b2) * g2 ** 2
        return -lr * (m / (1 - b1 ** 2)) / (np.sqrt(v / (1 - b2 ** 2)) + eps)

    for name, clipped, second in (("a", 0.6, 0.3), ("b", 0.8, -0.4)):
        np.testing.assert_allclose(updates[name], adam_second_update(clipped, second), rtol=1e-5, err_msg=name)


def test_grad_clip_zero_is_refused_naming_the_way_to_turn_clipping_off():
    config = sps_config.load_config("configs/tiny.py", ["--config.train.grad_clip=0"])
    with pytest.raises(ValueError, match=r"^train\.grad_clip=0 would zero every update: set it above 0 .* or to None "
                                         r"to turn clipping off\.$"):
        sps_config.check_run_config(config)
    sps_config.check_run_config(sps_config.load_config("configs/tiny.py", ["--config.train.grad_clip=None"]))


def test_the_pre_decay_part_ends_where_the_rate_leaves_its_peak():
    # Figure 1's pre-decay budget: 18B of the paper's 20B tokens; here the final 10% of 100,000 tokens.
    assert optim.decay_start_tokens(20_000_000_000, 0.1) == pytest.approx(18e9)
    # Section 5: the 40B-token Standard runs double that pre-decay budget, "from 18B to 36B tokens".
    assert optim.decay_start_tokens(40_000_000_000, 0.1) == pytest.approx(36e9)
    start = optim.decay_start_tokens(S["total_tokens"], S["decay_fraction"])
    assert start == pytest.approx(90_000)
    assert float(optim.learning_rate(start, **S)) == pytest.approx(6e-4)
    assert float(optim.learning_rate(start + 100, **S)) < 6e-4


def test_adamw_takes_the_configs_eps():
    # Guards against AdamW left at optax's own eps (1e-8): train.eps was silently ignored. With eps 1 the first
    # update of a gradient of 2 is -lr * m / (sqrt(v) + eps) with bias-corrected m = 2, v = 4: -lr * 2 / 3.
    t = sps_config.train_config()
    t.update(peak_lr=1e-3, final_lr=1e-3, warmup_tokens=0, total_tokens=10 ** 9, decay_fraction=0.1)
    t.weight_decay, t.grad_clip, t.eps = 0.0, None, 1.0
    opt = optim.optimizer(t, tokens_per_step=1)
    params = {"w": jnp.ones((2, 2))}
    updates, _ = opt.update({"w": jnp.full((2, 2), 2.0)}, opt.init(params), params)
    np.testing.assert_allclose(updates["w"], -1e-3 * 2 / 3, rtol=1e-6)


def test_adamw_with_eps_0_updates_a_weight_whose_gradient_is_0_to_nan():
    # Why sps_jax.config refuses train.eps=0: optax's update mu / (sqrt(nu) + eps) is then 0 / 0 wherever the
    # gradient and its moments are 0, with no guard of its own. Should optax guard it, the refusal can go.
    t = sps_config.train_config()
    t.update(peak_lr=1e-3, final_lr=1e-3, warmup_tokens=0, total_tokens=10 ** 9, decay_fraction=0.1)
    t.weight_decay, t.grad_clip, t.eps = 0.0, None, 0.0
    opt = optim.optimizer(t, tokens_per_step=1)
    params = {"w": jnp.ones((2,))}
    updates, _ = opt.update({"w": jnp.array([0.0, 2.0])}, opt.init(params), params)
    assert np.isnan(updates["w"][0]) and np.isfinite(updates["w"][1])
