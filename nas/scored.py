"""A scored candidate — a trial, a Table 1 reference shape or a finalist: one record type, so the
three stages store the same facts under the same names."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .schema import LatencyRecord


@dataclass(frozen=True)
class Scored:
    """A shape after its latency was measured and its distillation scored on the held-out rows."""

    arch: str
    params: int
    latency: LatencyRecord  # the judged graph's
    loss: float  # what the reward uses (nas.proxy.proxy_loss): 1 − fidelity ρ, or normalized L_HS
    loss_se: float
    fidelity: float | None  # the proxy's embedding fidelity ρ (None with the hs proxy)
    l_hs_norm: float  # held-out L_HS, measured whichever the proxy
    l_hs_raw: float
    l_hs_se: float
    reward: float
    within_budget: bool

    @property
    def latency_ms(self) -> float:
        return float(self.latency.median_ms)

    def record(self) -> dict[str, Any]:
        """The JSON facts, as the study, summary.json and the pages read them."""
        return {**asdict(self), "latency": self.latency.to_attrs(), "latency_ms": self.latency_ms}
