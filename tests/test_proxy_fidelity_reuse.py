"""benchmarks/proxy_fidelity.py --reuse takes only the runs made with today's settings."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from proxy_fidelity import _earlier_rows  # noqa: E402


def _result(tmp_path: Path) -> Path:
    hs = {"60": {"loss": 0.43, "l_hs_norm": 0.43}}
    rows = [
        # recorded before rates and terms were: 3e-4 and per-feature token states
        {"arch": "3x12x384x1536", "proxies": {"fidelity": {"30": {"loss": 0.28}}, "hs": hs},
         "final": {"steps": 300, "spearman": 0.863}},
        {"arch": "2x12x384x512", "proxies": {"fidelity": {"30": {"loss": 0.40, "terms": "mse+cos+rel"}}, "hs": hs},
         "final": {"steps": 300, "lr": 1e-3, "terms": "mse+cos+rel", "spearman": 0.75}},
    ]
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps({"rows": rows}))
    return path


def test_reuse_drops_runs_of_other_terms_or_rate(tmp_path):
    rows = _earlier_rows(_result(tmp_path), 300, 1e-3, "mse+cos+rel")
    old, new = rows["3x12x384x1536"], rows["2x12x384x512"]
    assert old["final"] is None and old["proxies"]["fidelity"] == {}
    assert old["proxies"]["hs"]["60"]["loss"] == 0.43  # hs trains no embed terms: still valid
    assert new["final"]["spearman"] == 0.75 and new["proxies"]["fidelity"]["30"]["loss"] == 0.40


def test_reuse_keeps_unrecorded_runs_at_their_defaults(tmp_path):
    rows = _earlier_rows(_result(tmp_path), 300, 3e-4, "tok+cos+rel")
    assert rows["3x12x384x1536"]["final"]["spearman"] == 0.863
    assert rows["3x12x384x1536"]["proxies"]["fidelity"]["30"]["loss"] == 0.28
    assert rows["2x12x384x512"]["final"] is None and rows["2x12x384x512"]["proxies"]["fidelity"] == {}
