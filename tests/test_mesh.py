"""The (data, fsdp) mesh: -1 takes the devices the other axis leaves, and each parameter is split along the rule
mesh.param_spec documents (its largest dimension divisible by fsdp; ties: the first)."""

import ml_collections
import pytest
from jax.sharding import PartitionSpec as P

from sps_jax import mesh


@pytest.mark.parametrize("data, fsdp, sizes", [(2, -1, (2, 4)), (-1, 2, (4, 2)), (-1, 8, (1, 8)), (8, -1, (8, 1))])
def test_minus_one_takes_the_devices_the_other_axis_leaves(data, fsdp, sizes):
    # Guards against -1 taking all the devices (8 // 1 instead of 8 // data), which then fails as "not exact".
    assert mesh.resolve_axes(ml_collections.ConfigDict({"data": data, "fsdp": fsdp}), 8) == sizes


@pytest.mark.parametrize("shape, fsdp, spec", [
    ((64, 64), 4, P("fsdp", None)),            # a tie: the first dimension
    ((16, 16, 8), 2, P("fsdp", None, None)),   # a tie between the two largest: the first of them
    ((6, 8), 2, P(None, "fsdp")),              # the largest divisible one
    ((12, 10), 4, P("fsdp", None)),            # 10 is not divisible by 4
    ((6, 10), 4, P()),                         # none divisible: replicated
    ((64, 64), 1, P()),                        # no fsdp axis to split over
])
def test_a_parameter_is_split_along_its_largest_divisible_dimension_the_first_on_a_tie(shape, fsdp, spec):
    # Guards against the tie-break taking the last of equal dimensions (against the documented rule).
    assert mesh.param_spec(shape, fsdp) == spec
