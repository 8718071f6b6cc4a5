"""Accelerator facts: device kinds map to the right card, and GPU descriptions carry what XLA requires."""

import re

import pytest

from sps_jax import hardware


@pytest.mark.parametrize("device_kind, name", [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100-pcie"),    # the longer prefix wins: a PCIe card is not an SXM one
    ("NVIDIA H200", "h200"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("TPU v5 lite", "tpu-v5e"),
    ("TPU v6 lite", "tpu-v6e"),
])
def test_device_kinds_name_their_card(device_kind, name):
    assert hardware.find(device_kind).name == name


@pytest.mark.parametrize("device_kind", ["cpu", "NVIDIA GeForce RTX 4090", ""])
def test_unknown_devices_have_no_peak(device_kind):
    assert hardware.find(device_kind) is None
    assert hardware.peak_flops_per_s(device_kind) is None


def test_published_peaks_and_memory():
    acc = hardware.ACCELERATORS
    assert acc["h100"].peak_flops_per_s == 989e12 and acc["h100"].memory_bytes == 80 * 2 ** 30
    assert acc["b200"].compute_capability == (10, 0) and acc["b200"].sm_arch == "sm_100a"
    assert acc["tpu-v5e"].memory_bytes == 16 * 2 ** 30 and acc["tpu-v6e"].memory_bytes == 32 * 2 ** 30


@pytest.mark.parametrize("name", ["h100", "b200"])
def test_gpu_target_config_has_the_fields_xla_requires(name):
    text = hardware.gpu_target_config(hardware.ACCELERATORS[name])
    acc = hardware.ACCELERATORS[name]
    major, minor = acc.compute_capability
    assert f"cuda_compute_capability {{ major: {major} minor: {minor} }}" in text
    for field in ("threads_per_warp: 32", "block_dim_limit_x:", "shared_memory_per_block_optin: 232448"):
        assert field in text
    assert re.search(r'device_description_str: "NVIDIA (H100|B200)"', text)


def test_a_tpu_has_no_gpu_description():
    with pytest.raises(ValueError, match="not a GPU"):
        hardware.gpu_target_config(hardware.ACCELERATORS["tpu-v5e"])


def test_a_cpu_device_holds_the_hosts_physical_memory():
    import jax

    with open("/proc/meminfo") as f:  # the kernel's own count, not the sysconf call the code makes
        total_kib = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    # MemTotal leaves out the kernel's reserved pages, so it is a little below the physical total.
    assert 0.9 * total_kib * 1024 <= hardware.device_memory_bytes(jax.devices("cpu")[0]) <= 1.1 * total_kib * 1024


# Vendor datasheets: dense bf16 peak FLOP/s (no sparsity) and memory per device. NVIDIA's H100/A100 "80GB" are
# 80 GiB; its H200 "141GB" and B200 "180GB" are decimal gigabytes; Cloud TPU pages give v5e 16 GiB, v6e 32 GiB.
PUBLISHED = {
    "h100": (989e12, 85_899_345_920),
    "h100-pcie": (756e12, 85_899_345_920),
    "h200": (989e12, 141_000_000_000),
    "b200": (2.25e15, 180_000_000_000),
    "a100": (312e12, 85_899_345_920),
    "tpu-v5e": (197e12, 17_179_869_184),
    "tpu-v6e": (918e12, 34_359_738_368),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_accelerators_peak_and_memory_are_its_published_figures(name):
    # Guards against a mistyped figure in the table (a wrong peak skews every MFU; wrong memory every fit check).
    acc = hardware.ACCELERATORS[name]
    assert (acc.peak_flops_per_s, acc.memory_bytes) == PUBLISHED[name]
    assert hardware.peak_flops_per_s(acc.device_kind) == PUBLISHED[name][0]


def test_the_h100s_gpu_description_gives_xla_its_80_gib_of_memory():
    # Guards against device_memory_size carrying another field (or figure) than the card's HBM in bytes.
    text = hardware.gpu_target_config(hardware.ACCELERATORS["h100"])
    assert "  device_memory_size: 85899345920\n" in text


class _FakeDevice:
    def __init__(self, stats):
        self.stats = stats

    def memory_stats(self):
        return self.stats


def test_a_devices_memory_is_its_allocators_limit_not_what_is_in_use():
    # Guards against reading bytes_in_use (what is taken now) for what the device can hold.
    assert hardware.device_memory_bytes(_FakeDevice({"bytes_limit": 7, "bytes_in_use": 3})) == 7
