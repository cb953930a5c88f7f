"""Choosing a precision plan: measure what keeping each group fp32 gives back, then grow a plan along that
order to the best fidelity within a latency budget, or to the fastest plan that holds a fidelity target.

The planner is told how to score a graph (its embedding fidelity against a reference: the model's own fp32
graph, or the teacher) and how to time one (the caller's latency reading); every plan it looks at is
built (`plan_graph`), scored and timed at most once.

The sensitivity pass quantizes everything but one group, for each group: its *gain* is the fidelity that
graph has over the all-INT8 one. Groups are then ordered by gain per unit of cost — the multiply-adds per
token of their weights, what an fp32 group adds to the INT8 graph's time — the groups with no gain last.
Plan k keeps the first k fp32. Fidelity rises with k and latency with it, so a budget is met by the
largest k that fits — then the smallest k whose fidelity ties it (within FIDELITY_TIE), the fastest of plans no
measurement tells apart — and a target by the smallest k that holds it, each found by bisection (about
log2(groups) readings).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kdnas.core.errors import InputError

from ._graph import quantize_int8
from ._precision import Group, Plan, plan_graph, weight_groups


# How many plans, from the one bisection found down, a fresh reading may set aside (`Planner._confirmed`).
CONFIRM_STEPS = 2
# An all-INT8 reading over the budget by at most this share is read again, fresh (a third time where the second
# fits), and the median stands (`Planner.within_budget`): that one reading decides whether the graph has a plan within the budget at all.
# Why: the demo's teacher, all-INT8, read 0.541 of itself against a 0.505 limit once (tight quartiles) and 0.466 at
# the end of the same run; another run 0.626 against 0.520, then 0.491. A student shipped in its place (rho 0.960
# and 0.933 against the teacher's graph's 0.991). A graph further over is over however the host drifts.
RECHECK_OVER = 0.25
# Plans whose fidelity lies within this of the best plan that fits are told apart by no measurement, so the fastest
# of them ships (`Planner.within_budget`). Why: the held-out rho's standard error on 1,000 sentences is about 0.0005
# (this is twice it), and the plan grown to the last group that fits sits at the budget's edge, where the next
# reading decides: one demo's teacher shipped a plan one group longer than the other runs' (rho 0.99317 against
# 0.99299), chosen at 7.628 ms against a 7.624 ms budget (within its 1 % tolerance) and read at 7.879 as shipped.
FIDELITY_TIE = 0.001


@dataclass(frozen=True)
class Effect:
    """One group's measured effect: the fidelity of the all-INT8 graph with this group fp32, and its gain."""

    group: str
    fidelity: float
    gain: float
    cost: int  # multiply-adds per token of the group's weights (0 for a table lookup)

    def to_dict(self) -> dict:
        return {"group": self.group, "fidelity": round(self.fidelity, 5), "gain": round(self.gain, 5),
                "cost": self.cost}


@dataclass(frozen=True)
class PlanPoint:
    """A plan measured: the first `kept` groups of the order fp32, its fidelity and latency where read."""

    kept: int
    plan: Plan
    label: str
    fidelity: float | None = None
    latency_ms: float | None = None

    def to_dict(self) -> dict:
        return {"kept": self.kept, "label": self.label, **self.plan.to_dict(),
                "fidelity": None if self.fidelity is None else round(self.fidelity, 5),
                "latency_ms": None if self.latency_ms is None else round(self.latency_ms, 4)}


class _OutOfTime(Exception):
    """A planner's `until` passed mid-growth (caught in `Planner.within_budget`)."""


@dataclass
class Planner:
    """The plans of one fp32 graph. `score(graph)`: its fidelity; `latency(graph)`: its milliseconds as the
    caller's budget judges them; `workdir`: where plan graphs are written (the caller's to remove); `int8`:
    the graph's all-INT8 twin in the plans' weight range (`full_range`), quantized here when None."""

    fp32: Path
    workdir: Path
    score: Callable[[Path], float]
    latency: Callable[[Path], float]
    full_range: bool = False
    int8: Path | None = None
    groups: list[Group] = field(default_factory=list)
    order: list[Effect] | None = None  # the groups' effects measured before (`effects`), where known
    sensitivity_s: float | None = None  # what this planner's sensitivity pass took (None: it did not run one)
    tie: float = FIDELITY_TIE  # fidelities within this of each other are one: the faster plan is chosen
    _graphs: dict[tuple[str, ...], Path] = field(default_factory=dict)
    _fidelity: dict[tuple[str, ...], float] = field(default_factory=dict)
    _latency: dict[tuple[str, ...], float] = field(default_factory=dict)
    int8_readings: list[float] = field(default_factory=list)  # the last `fastest_fits`'s readings, where read again
    # A `time.monotonic()` value past which `within_budget` builds, scores and reads nothing more: the all-INT8 graph
    # (read within the budget first) stands and `cut_short` says so. A --timeout sets it: a student's plan forecast
    # at 85 s took 146 s on a slow 2-core host and ran the least --timeout 191 s past its limit.
    until: float | None = None
    cut_short: bool = False

    def __post_init__(self) -> None:
        self.fp32, self.workdir = Path(self.fp32), Path(self.workdir)
        self.groups = self.groups or weight_groups(self.fp32)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.int8 is None:
            self.int8 = self.workdir / "all-int8.onnx"
            quantize_int8(self.fp32, self.int8, full_range=self.full_range)
        self._graphs[()] = Path(self.int8)

    # -- one plan -------------------------------------------------------------------------------

    def plan(self, fp32_groups: tuple[str, ...]) -> Plan:
        return Plan(tuple(fp32_groups), self.full_range)

    @staticmethod
    def _key(plan: Plan) -> tuple[str, ...]:
        return tuple(sorted(plan.fp32))

    def known_fidelity(self, plan: Plan) -> float | None:
        """The plan's fidelity where it was scored, else None (nothing is built or scored)."""
        return self._fidelity.get(self._key(plan))

    def known_latency(self, plan: Plan) -> float | None:
        """The plan's latency where it was timed, else None (nothing is built or timed)."""
        return self._latency.get(self._key(plan))

    def graph(self, plan: Plan) -> Path:
        """The plan's graph: the all-INT8 file, the fp32 file itself when every group is kept, else built."""
        key = self._key(plan)
        if key not in self._graphs:
            if len(key) == len(self.groups):
                self._graphs[key] = self.fp32
            else:
                self._graphs[key] = plan_graph(self.fp32, self._graphs[()], self.graph_path(plan), plan, self.groups)
        return self._graphs[key]

    def graph_path(self, plan: Plan) -> Path:
        """Where the plan's graph is (or was, or will be) written: named by its fp32 groups."""
        key = self._key(plan)
        if not key:
            return self._graphs[()]
        if len(key) == len(self.groups):
            return self.fp32
        name = hashlib.sha256("\n".join(key).encode()).hexdigest()[:12]
        return self.workdir / f"plan-{name}.onnx"

    def _in_time(self) -> None:
        if self.until is not None and time.monotonic() > self.until:
            raise _OutOfTime

    def fidelity(self, plan: Plan) -> float:
        key = self._key(plan)
        if key not in self._fidelity:
            self._in_time()
            self._fidelity[key] = float(self.score(self.graph(plan)))
        return self._fidelity[key]

    def _scored_once(self, plan: Plan) -> float:
        """The fidelity of a plan the sensitivity pass builds once: its graph (as large as the model) is
        removed once scored, so a pass over 49 groups does not hold 49 copies on disk."""
        key = self._key(plan)
        built = key not in self._graphs
        fidelity = self.fidelity(plan)
        if built and self._graphs[key] not in (self.fp32, self._graphs[()]):
            self._graphs.pop(key).unlink(missing_ok=True)
        return fidelity

    def latency_ms(self, plan: Plan) -> float:
        key = self._key(plan)
        if key not in self._latency:
            self._in_time()
            self._latency[key] = float(self.latency(self.graph(plan)))
        return self._latency[key]

    def point(self, kept: int, *, fidelity: bool = False, latency: bool = False) -> PlanPoint:
        plan = self.along(kept)
        return PlanPoint(kept, plan, plan.label(len(self.groups)),
                         self.fidelity(plan) if fidelity else self.known_fidelity(plan),
                         self.latency_ms(plan) if latency else self.known_latency(plan))

    # -- the order ------------------------------------------------------------------------------

    def effects(self) -> list[Effect]:
        """Every group's effect, in the order plans grow (best gain per cost first; no gain last)."""
        if self.order is None:
            started = time.perf_counter()
            base = self.fidelity(self.plan(()))
            costs = group_costs(self.fp32, self.groups)
            measured = [Effect(g.name, f, f - base, costs[g.name])
                        for g in self.groups for f in [self._scored_once(self.plan((g.name,)))]]
            self.order = growth_order(measured)
            self.sensitivity_s = time.perf_counter() - started
        return self.order

    def along(self, kept: int) -> Plan:
        """The plan keeping the first `kept` groups of the order fp32 (none or all: no order needed)."""
        if kept == 0:
            return self.plan(())
        if kept >= len(self.groups):
            return self.plan(tuple(g.name for g in self.groups))
        return self.plan(tuple(e.group for e in self.effects()[:kept]))

    # -- growing --------------------------------------------------------------------------------

    def within_budget(self, budget_ms: float) -> PlanPoint | None:
        """The fastest plan of best fidelity whose latency is within `budget_ms`: of the most groups fp32 along
        the order that fit, the fewest whose fidelity is within `tie` of theirs (`_fastest_tied`); None when even
        the all-INT8 graph does not fit (read again near the budget: `fastest_fits`). Where the fp32 graph itself
        fits, it stands: no order is measured (a sensitivity pass) for a budget every plan fits."""
        until, self.until = self.until, None  # whether the all-INT8 graph fits is read whatever the time
        if not self.fastest_fits(budget_ms):
            return None
        self.until = until
        try:
            return self._grown_within(budget_ms)
        except _OutOfTime:  # past `until`: the all-INT8 graph, read within the budget above, stands
            self.until, self.cut_short = None, True
            return self.point(0, fidelity=True, latency=True)

    def _grown_within(self, budget_ms: float) -> PlanPoint:
        n = len(self.groups)
        if self.latency_ms(self.along(n)) <= budget_ms:
            return self.point(n, fidelity=True, latency=True)
        low, high = 0, n  # latency(low) fits, latency(high) does not
        while high - low > 1:
            mid = (low + high) // 2
            if self.latency_ms(self.along(mid)) <= budget_ms:
                low = mid
            else:
                high = mid
        return self.point(self._fastest_tied(self._confirmed(low, budget_ms), budget_ms), fidelity=True, latency=True)

    def _fastest_tied(self, kept: int, budget_ms: float) -> int:
        """The fewest groups fp32 along the order, at most `kept`, whose plan's fidelity is within `tie` of plan
        `kept`'s, found by bisection as fidelity grows along the order; `kept` where that plan reads over the budget
        (a plan shorter than one that fits reads over only on a drifting host: the confirmed one stands)."""
        if kept == 0 or self.tie <= 0:
            return kept
        target = self.fidelity(self.along(kept)) - self.tie
        fewest = self._fewest_holding(target, 0, kept)
        if fewest < kept and self.latency_ms(self.along(fewest)) > budget_ms:
            return kept
        return fewest

    def _fewest_holding(self, target: float, low: int, high: int) -> int:
        """The fewest groups fp32 along the order, between `low` and `high` (whose plan holds `target`), whose plan's
        fidelity holds `target`, by bisection."""
        if self.fidelity(self.along(low)) >= target:
            return low
        while high - low > 1:  # fidelity(low) misses, fidelity(high) holds
            mid = (low + high) // 2
            if self.fidelity(self.along(mid)) >= target:
                high = mid
            else:
                low = mid
        return high

    def fastest_fits(self, budget_ms: float) -> bool:
        """Whether the all-INT8 graph fits `budget_ms`: a reading over it by at most RECHECK_OVER is read again
        (a third time where the second fits) and the median stands (as its latency; the readings in `int8_readings`)."""
        first, self.int8_readings = self.latency_ms(self.plan(())), []
        if first <= budget_ms or first > (1 + RECHECK_OVER) * budget_ms:
            return first <= budget_ms
        readings = [first, float(self.latency(self._graphs[()]))]
        if readings[1] <= budget_ms:  # one over, one within: a third decides (over on two is over on three)
            readings.append(float(self.latency(self._graphs[()])))
        self.int8_readings = readings
        self._latency[()] = sorted(readings)[(len(readings) - 1) // 2]
        return self._latency[()] <= budget_ms

    def _confirmed(self, kept: int, budget_ms: float) -> int:
        """`kept`, or fewer: the plan bisection found sits closest under the budget, where one lucky reading
        decides, so it is read once more, fresh; over on that reading, the plan one group shorter stands
        (read again too), down to CONFIRM_STEPS steps. The mean of a plan's readings is its latency."""
        for _ in range(CONFIRM_STEPS):
            if kept == 0:
                return 0
            key = self._key(self.along(kept))
            again = float(self.latency(self.graph(self.along(kept))))
            self._latency[key] = (self._latency[key] + again) / 2 if key in self._latency else again
            if self._latency[key] <= budget_ms:
                return kept
            kept -= 1
        return kept

    def to_target(self, target: float) -> PlanPoint | None:
        """The fastest plan along the order whose fidelity holds `target`: the fewest groups fp32 that do;
        None when not even every group fp32 does (a reference other than the graph's own fp32 one)."""
        n = len(self.groups)
        if self.fidelity(self.plan(())) < target and self.fidelity(self.along(n)) < target:
            return None
        return self.point(self._fewest_holding(target, 0, n), fidelity=True, latency=True)

    def measured(self) -> list[PlanPoint]:
        """Every plan along the order that growing scored or timed, fewest fp32 groups first."""
        points = {}
        for key in (*self._fidelity, *self._latency):
            kept = len(key)
            if kept in (0, len(self.groups)) or (self.order is not None and key == self._key(self.along(kept))):
                points[kept] = PlanPoint(kept, self.plan(key), self.plan(key).label(len(self.groups)),
                                         self._fidelity.get(key), self._latency.get(key))
        return [points[k] for k in sorted(points)]


def growth_order(effects: list[Effect]) -> list[Effect]:
    """Groups with a gain first, most gain per multiply-add first (a lookup table costs none: by gain, ahead);
    then those without, by gain."""
    gaining = [e for e in effects if e.gain > 0]
    rest = [e for e in effects if e.gain <= 0]
    gaining.sort(key=lambda e: (e.cost > 0, -e.gain / max(e.cost, 1), e.group))
    rest.sort(key=lambda e: (-e.gain, e.group))
    return gaining + rest


def group_costs(graph: str | os.PathLike, groups: list[Group]) -> dict[str, int]:
    """Multiply-adds per token of each group's weights: the product of each weight matrix's dims (the
    fused Attention's Q/K/V matrix included); 0 for the embedding tables, which are read, not multiplied."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    dims = {i.name: list(i.dims) for i in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    costs = {}
    for g in groups:
        total = 0
        for name in g.nodes:
            node = nodes[name]
            if node.op_type in ("MatMul", "Attention"):
                total += sum(_product(dims[i]) for i in node.input[1:2] if i in dims and len(dims[i]) == 2)
        costs[g.name] = total
    return costs


def _product(dims: list[int]) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out


def check_goal(target_fidelity: float | None, budget_ms: float | None) -> None:
    """One goal for an automatic plan, each in its range; one line naming the value otherwise."""
    if target_fidelity is not None and (isinstance(target_fidelity, bool) or not 0 < target_fidelity <= 1):
        raise InputError(f"--target-fidelity {target_fidelity!r} is not a fidelity: give Spearman's rho "
                         "above 0 and at most 1 (e.g. 0.97)")
    if budget_ms is not None and (isinstance(budget_ms, bool) or not budget_ms > 0):
        raise InputError(f"--budget-ms {budget_ms!r} must be a positive number of milliseconds")
    if target_fidelity is None and budget_ms is None:
        raise InputError("--int8 auto chooses a precision plan for a goal: add --target-fidelity F (the fastest "
                         "plan that keeps rho F to the fp32 graph) or --budget-ms M (the closest plan within M ms)")
    if target_fidelity is not None and budget_ms is not None:
        raise InputError("--int8 auto takes one goal: --target-fidelity or --budget-ms, not both")
