"""The accounting property of ``tests/engines/test_property_accounting.py`` on the Ray engine (a real
two-node cluster, ``conftest.py``'s ``cluster``): every generated source's rows kept, truncated or
dropped once, and the same counts, kept ids and reject reasons as the local engine."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import lengthscan
from tests.engines.test_property_accounting import cases, clean_checked

pytest.importorskip("ray", reason='the Ray engine tests need Ray: pip install "lengthscan[ray]"')
pytestmark = pytest.mark.ray


@given(cases(max_rows=30))
@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_ray_accounts_for_every_row_as_local_does(cluster, bpe_dir, case):
    from lengthscan import clean_ray

    with tempfile.TemporaryDirectory() as folder:
        local = clean_checked(lengthscan.clean, case, bpe_dir, Path(folder) / "local", cache=False)
        distributed = clean_checked(clean_ray, case, bpe_dir, Path(folder) / "ray", num_blocks=3)
    assert distributed == local  # counts, kept ids in order, rejected ids with their reasons
