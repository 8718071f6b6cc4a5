"""Deviceless compiles for TPU v5e and v6e (libtpu, no TPU attached): splash attention's Mosaic
kernels, the sharded train step with splash beside the dense reference, generation, the mesh of a
two-host slice, and ``bench compile`` for a TPU target. They need libtpu (the .[tpu] extra, which CI
installs) and skip without it, saying so; the refusal without libtpu is checked everywhere."""

import dataclasses
import importlib.util
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from sps_jax import attention, config as sps_config, hardware, masks, mesh as sps_mesh
from sps_jax import model as sps_model
from sps_jax.aot import programs, topology, tpu_kernels
from sps_jax.aot.gpu_kernels import Shape
from tests.helpers import REPO, SMALL_OVERRIDES, SMALL_VOCAB, env, needs_libtpu

# Deviceless compiles report what a user's compile gets: XLA fully optimizing (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("optimized_compiles")

V5E, V6E = hardware.ACCELERATORS["tpu-v5e"], hardware.ACCELERATORS["tpu-v6e"]


def small_config(attention="splash", micro_batch=2, fsdp=1, **model):
    """The tests' small model at T=128 (one 128-key splash block per stream), wide enough (d = 512,
    head dim 128) that TPU tile padding does not hide the sharding; parameters split ``fsdp`` ways."""
    overrides = [o for o in SMALL_OVERRIDES if "seq_len" not in o]
    config = sps_config.load_config("configs/tiny.py", overrides)
    fields = dict(attention=attention, seq_len=128, d_model=512, d_ff=1536, num_heads=4, **model)
    for name, value in fields.items():
        setattr(config.model, name, value)
    config.train.micro_batch = config.train.global_batch = micro_batch
    config.mesh.data, config.mesh.fsdp = 1, fsdp
    return config


@needs_libtpu
@pytest.mark.parametrize("acc", (V5E, V6E), ids=lambda a: a.name)
@pytest.mark.parametrize("head_dim", (64, 128))
def test_splash_forward_and_backward_compile_with_the_default_blocks(acc, head_dim):
    """Mosaic allocates each kernel's VMEM when it compiles, and the VMEM a block needs does not
    depend on T: the default blocks fit v5e and v6e at both head dims."""
    r = tpu_kernels.kernel_report(acc, Shape("short", 2, head_dim, seq_len=512), vis=masks.Visibility("sps", 64))
    assert r["status"] == "ok", r.get("error")
    assert r["mosaic_kernels"] == 3 and r["fits"]  # forward, dQ, dK/dV
    assert r["peak_bytes"] >= 3 * 512 * 2 * 2 * head_dim * 2  # q, k, v in bf16 at least
    # XLA does not see inside the kernels; their FLOPs come from the blocks splash computes.
    assert r["kernel_flops"] > 10 * r["xla_flops"] and r["flops"] == r["xla_flops"] + r["kernel_flops"]
    assert 0 < r["computed_over_dense_causal"] <= 1


@needs_libtpu
@pytest.mark.slow  # over 30 s on two cores; run with -m slow
def test_small_train_step_compiles_sharded_over_the_four_chips_of_a_v5e_slice():
    splash = programs.train_step(V5E, small_config(micro_batch=8, fsdp=4), num_devices=4)
    assert (splash["devices"], splash["attention"], splash["micro_batch"]) == (4, "splash", 8)
    assert splash["fits"] and splash["mosaic_kernels"] == 3 * small_config().model.num_layers
    # f32 parameters and two AdamW moments, split over the 4 chips (FSDP).
    n_params = sps_model.count_params(sps_model.Transformer(sps_model.ModelConfig.from_config(
        small_config().model)))
    assert 0.25 * 12 * n_params <= splash["argument_bytes"] < 0.3 * 12 * n_params
    assert splash["kernel_flops"] > 0 and splash["flops"] == splash["xla_flops"] + splash["kernel_flops"]
    # The dense reference's count (no Mosaic kernel, no kernel FLOPs): the bench compile test below.


# auto -> splash is test_bench_compile_for_a_tpu_target_compares_splash_with_the_dense_reference's too
@pytest.mark.slow
@needs_libtpu
def test_auto_means_splash_for_a_tpu_target_and_fits_is_judged_against_the_chip():
    tiny_chip = dataclasses.replace(V5E, name="tpu-tiny", memory_bytes=2 ** 20)
    r = programs.train_step(tiny_chip, small_config("auto", micro_batch=1))
    assert r["attention"] == "splash" and r["peak_bytes"] > 2 ** 20 and not r["fits"]


@needs_libtpu
def test_a_program_over_the_chips_hbm_is_refused_by_the_compiler_and_reported_as_not_fitting():
    x = jax.ShapeDtypeStruct((100_000,), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(
        topology.devices(V5E)[0]))
    # 40 GB out: more than a v5e chip's 16 GiB
    refused = programs._compile_and_report(V5E, lambda: jax.jit(lambda x: jnp.outer(x, x)).lower(x), program="outer")
    assert refused["program"] == "outer" and not refused["fits"]
    # No peak; the compiler's figure (its temporaries) is a lower bound of what the program needs.
    assert refused["peak_bytes"] is None and refused["required_bytes"] >= 37 * 2 ** 30
    assert refused["error"].startswith("RESOURCE_EXHAUSTED")


@needs_libtpu
def test_generation_compiles_prefill_with_splash_and_the_decode_loop():
    cfg = sps_model.ModelConfig.from_config(small_config().model)
    prefill, decode, step = programs.generation(V6E, cfg, batch=2, prompt_len=16, new_tokens=8)
    assert prefill["program"] == "prefill" and prefill["mosaic_kernels"] == cfg.num_layers  # forward only
    assert decode["program"] == "decode_loop" and decode["mosaic_kernels"] == 0  # the cache attends in XLA
    assert decode["cache_bytes"] > 0 and prefill["fits"] and decode["fits"] and step["program"] == "decode_step"


# Each shape is one where the loop copied its cache before the fix: Standard's single query row
# (head size 64, 16 rows, 1024 positions: K with the batch on the lanes, temporaries 2.6x the cache);
# SPS's two rows in the value product (one S-scale layer at 4096 positions: V with the head on the
# lanes, temporaries 1.0x the cache).
@needs_libtpu
@pytest.mark.parametrize("variant, window, sizes", [
    ("standard", None, dict(num_layers=2, num_heads=4, d_model=256, d_ff=768, seq_len=1024)),
    ("sps", 64, dict(num_layers=1, seq_len=4096)),
])
def test_the_decode_loop_on_a_v5e_holds_no_copy_of_its_cache(variant, window, sizes):
    model = dict(sps_config.paper_model_section("s", variant, window), **sizes)
    prompt_len = model["seq_len"] // 4
    (loop,) = programs.generation(V5E, sps_model.ModelConfig.from_config(model), batch=16, prompt_len=prompt_len,
                                  new_tokens=model["seq_len"] - prompt_len + 1, only=("decode_loop",))
    assert loop["temp_bytes"] < loop["cache_bytes"] / 4, loop


@needs_libtpu
def test_mesh_code_builds_the_data_fsdp_mesh_from_tpu_devices_and_the_kernel_runs_per_shard():
    devices = topology.devices(dataclasses.replace(V5E, tpu_topology="v5e:2x4"), 8)  # two hosts of four chips
    assert all(d.platform == "tpu" and len(d.coords) == 3 for d in devices)
    assert sorted({d.process_index for d in devices}) == [0, 1]
    mesh_cfg = type("MeshConfig", (), {"data": -1, "fsdp": 4})
    mesh = sps_mesh.make_mesh(mesh_cfg, list(reversed(devices)))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 4}
    # Each fsdp group (its parameter all-gathers) is one host's chips; data parallelism spans the hosts.
    assert [{d.process_index for d in row} for row in mesh.devices] == [{0}, {1}]
    batch = sps_mesh.batch_sharding(mesh)
    x = jax.ShapeDtypeStruct((8, 256, 2, 2, 64), jnp.bfloat16, sharding=batch)
    doc = jax.ShapeDtypeStruct((8, 256), jnp.int32, sharding=batch)
    with topology.lowering_context(V5E, mesh):
        assert sps_mesh.target_platform() == "tpu" and attention.resolve("auto") == "splash"
        compiled = jax.jit(lambda q, k, v, doc: attention.get_backend("auto")(q, k, v, doc, masks.Visibility("sps", 64)),
                           out_shardings=batch).lower(x, x, x, doc).compile()
    assert programs.mosaic_kernels(compiled) == 1 and "all-gather" not in compiled.as_text()


@needs_libtpu
def test_bench_compile_for_a_tpu_target_compares_splash_with_the_dense_reference(tmp_path, monkeypatch):
    # The kernels part at a short shape (its S-scale shapes take longer than a test should).
    monkeypatch.setattr(tpu_kernels, "SHAPES", (Shape("short", 2, 64, seq_len=256),))
    from sps_jax.bench import compile as bench_compile

    args = bench_compile.parse_args(["--target", "tpu-v5e", "--only", "kernels,train", "--config",
                                     "configs/tiny.py:sps,4", "--micro-batches", "1", "--remat", "off",
                                     # one layer of a small vocabulary: a quarter of the compile time, and the
                                     # same programs' kinds (splash or dense attention, standard or sps)
                                     "--config.model.num_layers=1", *SMALL_VOCAB,
                                     "--no-fit-search", "--dtypes", "bfloat16,float16"])
    assert bench_compile.attention_backends(V5E, args) == ["auto", "xla"]
    assert bench_compile.attention_backends(hardware.ACCELERATORS["h100"], args) == ["auto"]
    # An attention the config's overrides name is the one compiled (it was replaced by auto without a word).
    overridden = bench_compile.parse_args(["--target", "h100", "--config", "configs/tiny.py",
                                           "--config.model.attention=triton"])
    assert bench_compile.attention_backends(hardware.ACCELERATORS["h100"], overridden) == ["triton"]
    kernels = bench_compile.kernel_rows(V5E, args)
    assert [(r["variant"], r["dtype"], r["status"]) for r in kernels] == [("standard", "bfloat16", "ok"),
                                                                          ("sps", "bfloat16", "ok")]
    assert kernels[1]["peak_vs_standard"] > 1
    rows, largest = bench_compile.train_rows(V5E, args)
    assert [(r["attention"], r["variant"], r["micro_batch"]) for r in rows] == [
        ("splash", "standard", 1), ("splash", "sps", 1), ("xla", "standard", 1), ("xla", "sps", 1)]
    assert all(r["fits"] for r in rows) and largest == []
    for standard, sps in (rows[:2], rows[2:]):  # each variant over standard with the same backend
        assert standard["peak_vs_standard"] == 1
        assert sps["peak_vs_standard"] == pytest.approx(sps["peak_bytes"] / standard["peak_bytes"])
    # The control of the splash counts: the dense reference calls no Mosaic kernel.
    assert all(r["mosaic_kernels"] == 0 and r["kernel_flops"] == 0 for r in rows if r["attention"] == "xla")
    assert all(r["mosaic_kernels"] > 0 for r in rows if r["attention"] == "splash")
    results = {"jax_version": jax.__version__, "targets": {"tpu-v5e": {"platform": "tpu", "kernels": kernels,
                                                                       "train": rows}}}
    bench_compile.print_tables(json.loads(json.dumps(results)))


def test_without_libtpu_a_tpu_target_is_refused_in_one_sentence_naming_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a))
    with pytest.raises(topology.Unavailable) as e:
        topology.devices(V5E)
    message = str(e.value)
    assert '".[tpu]"' in message and "libtpu" in message and message.count(". ") == 0


# The command as a user without the tpu extra runs it: libtpu hidden from the import system (CI installs it).
_WITHOUT_LIBTPU = """
import importlib.util, runpy, sys
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name == "libtpu" else real(name, *a)
sys.modules["libtpu"] = None
sys.argv = ["sps_jax.bench", *sys.argv[1:]]
runpy.run_module("sps_jax.bench", run_name="__main__")
"""


def test_without_libtpu_bench_compile_stops_with_that_sentence():
    out = subprocess.run([sys.executable, "-c", _WITHOUT_LIBTPU, "compile", "--target", "tpu-v5e", "--only", "train"],
                         cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 2 and '".[tpu]"' in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
