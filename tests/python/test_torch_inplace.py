"""The "accord" backend on CPU tensors runs all_to_all_single (even and uneven splits, empty
blocks, a rank with nothing to send), the all_to_all list form, all_gather_into_tensor and
reduce_scatter_tensor in place, and the all_gather / reduce_scatter list forms on views of one
tensor: every case matches Gloo in the same job, and the contiguous
ones copy nothing (no torch copy by the backend, and the binding used the registration cache
rather than staging). Synchronous calls run on the caller's thread with the GIL released, in
order with the async ops before them. Skipped where torch is not installed."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

import accord  # noqa: E402
import torch_inplace_roles  # noqa: E402

pytestmark = pytest.mark.timeout(180)

# Cases whose tensors are contiguous (the list form: views of one tensor): no copy at all, both
# tensors registered in place (two registration lookups).
IN_PLACE = [
    "a2a_even",
    "a2a_uneven",
    "a2a_list_views",
    "a2a_list_reversed_gaps",
    "a2a_list_empty_blocks",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_gather_list_views",
    "reduce_scatter_list_views",
]


@pytest.mark.parametrize("world_size", [2, 3])
def test_in_place_ops_match_gloo_and_copy_nothing(world_size: int) -> None:
    seen = accord.run(torch_inplace_roles.in_place_ops, world_size, timeout=150)
    for rank, cases in enumerate(seen):
        for name in IN_PLACE:
            copies, lookups = cases[name]
            assert (copies, lookups) == (0, 2), (rank, name, cases[name])
        # Separate tensors are gathered: the input concatenated (one copy), the output copied
        # out block by block.
        copies, _ = cases["a2a_list_loose"]
        assert copies == 1 + world_size, (rank, cases["a2a_list_loose"])
        # all_gather into separate tensors: gathered into one, copied out to each.
        assert cases["all_gather_list_loose"][0] == world_size, (rank, cases["all_gather_list_loose"])
        # Strided tensors go through a contiguous copy (and back, for an output).
        for name in ("a2a_even_strided", "all_gather_into_tensor_strided", "reduce_scatter_tensor_strided"):
            assert cases[name][0] >= 1, (rank, name, cases[name])
        assert "a2a_one_rank_idle" in cases and "a2a_list_strided_in" in cases


def test_sync_and_async_ops_keep_call_order() -> None:
    got = accord.run(torch_inplace_roles.sync_and_async_in_order, 3, timeout=90)
    # Ranks 0..2 start from their rank: the first all_reduce gives 3, each of the five after it
    # multiplies by 3.
    assert got == [[3.0 * 3**5]] * 3


def test_a_sync_op_releases_the_gil_while_it_waits() -> None:
    assert accord.run(torch_inplace_roles.gil_released_during_a_sync_op, 2, timeout=90) == [True, True]


def test_overlapping_list_outputs_are_not_used_in_place() -> None:
    """An all_to_all output list naming one block twice goes through the copy-out path (the
    in-place path would hand the collective overlapping receive blocks, which it refuses)."""
    from accord.torch import _disjoint

    assert _disjoint([0, 4, 8], [4, 4, 4])
    assert _disjoint([8, 0, 4], [4, 4, 4])  # any order
    assert _disjoint([0, 0, 4], [0, 4, 4])  # an empty block overlaps nothing
    assert not _disjoint([0, 0], [4, 4])  # the same view twice
    assert not _disjoint([0, 2], [4, 4])
