"""A reduced run of benchmarks/fault_test.py: hostile requests all get 4xx with a message, never 5xx."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from test_server_helpers import API_KEY, running_server, sine_config

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "fault_test.py"


def _fault_module():
    spec = importlib.util.spec_from_file_location("fault_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fault_test", module)  # dataclasses look their module up here
    spec.loader.exec_module(sys.modules["fault_test"])
    return sys.modules["fault_test"]


def test_hostile_requests_get_4xx_and_the_server_keeps_serving(tmp_path):
    faults = _fault_module()
    assert len(faults.all_cases("sine", has_key=True)) >= 200  # the full script's size
    with running_server(sine_config(tmp_path, api_keys=(API_KEY,))) as (url, _):
        result = faults.run_faults(url, API_KEY, "sine", every=3)
    assert result["failures"] == [] and result["n_5xx"] == 0
    assert result["n_requests"] >= 60 and result["still_serving"]


def test_fault_script_refuses_non_loopback_targets():
    faults = _fault_module()
    try:
        faults.run_faults("http://example.com", None, "sine")
    except SystemExit as exc:
        assert "loopback addresses only" in str(exc)
    else:
        raise AssertionError("a non-loopback URL was accepted")
