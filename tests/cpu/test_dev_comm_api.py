"""DevCommRequirements and the GIN enums (no GPU needed)."""

from __future__ import annotations

import pytest

from torch_nccl_core import DevCommRequirements, GinConnectionType, GinType


def test_gin_enums_match_nccl():
    assert [(t.name, int(t)) for t in GinType] == [
        ("NONE", 0),
        ("PROXY", 2),
        ("GDAKI", 3),
        ("GPI", 4),
    ]
    assert [(t.name, int(t)) for t in GinConnectionType] == [("NONE", 0), ("FULL", 1), ("RAIL", 2)]


def test_requirements_pass_only_the_fields_set():
    assert DevCommRequirements()._nccl_fields() == {}
    fields = DevCommRequirements(
        lsa_barrier_count=2, lsa_multimem=False, gin_connection_type=GinConnectionType.RAIL
    )._nccl_fields()
    assert fields == {"lsa_barrier_count": 2, "lsa_multimem": 0, "gin_connection_type": 2}


def test_requirements_refuse_bad_values():
    with pytest.raises(ValueError, match="lsa_barrier_count"):
        DevCommRequirements(lsa_barrier_count=-1)._nccl_fields()
    with pytest.raises(TypeError, match="barrier_count"):
        DevCommRequirements(barrier_count="2")._nccl_fields()
    with pytest.raises(ValueError, match="GinConnectionType"):
        DevCommRequirements(gin_connection_type=7)._nccl_fields()
