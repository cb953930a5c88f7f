"""The target profile (`kdnas target`, `--target FILE`): what it reads of a graph, its fit, its file, its judge,
and a search judged by another host's profile reading nothing."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from kdnas.core.errors import InputError
from kdnas.latency import (Composition, Host, Settings, Shape, TargetReading, fitted_profile,
                           load_profile)

# Costs of a plausible 2-core host (ms per unit of each feature), of the order `kdnas target` fits for MiniLM-L6.
COSTS = np.array([0.07, 0.01, 12.0, 5.3, 0.8, 42.0, 0.7])
TEACHER_MS = 20.0
FOREIGN = Host(cpu="Foreign CPU 9000", flags=(), cores=2, versions={"python": "3.11", "torch": "2.13.0",
                                                                    "onnxruntime": "1.0.0"})


def synthetic_profile(host: Host = FOREIGN, noise: float = 0.0, teacher: str = "minilm-l6"):
    """A profile of MiniLM-L6's design whose readings follow COSTS exactly (times 1 + noise, alternating sign): a
    file as another host's `kdnas target` would write it."""
    from kdnas.nas.target import design

    readings = []
    for i, graph in enumerate(design(6, 12, 384, 1536)):
        ms = float(graph.composition().features() @ COSTS) * (1 + noise * (-1) ** i)
        readings.append(TargetReading(graph, ms / TEACHER_MS, ms / TEACHER_MS, ms / TEACHER_MS, TEACHER_MS))
    return fitted_profile(teacher, "6x12x384x1536", Settings(), host, readings)


def test_a_plan_is_priced_between_its_fp32_and_all_int8_graphs():
    shape = Shape(4, 12, 384, 1536)
    fp32, int8 = Composition.of_arch(shape), Composition.of_arch(shape, int8=True)
    one = Composition.of_arch(shape, int8=True, fp32_groups=("0.ffn_out",))
    every = Composition.of_arch(shape, int8=True, fp32_groups=("ffn_out",))
    assert (fp32.precision, int8.precision, one.precision) == ("fp32", "int8", "plan")
    assert fp32.fp32_macs == int8.int8_macs == 4 * (4 * 384 * 384 + 2 * 384 * 1536)
    assert one.fp32_macs == 1536 * 384 and every.fp32_macs == 4 * 1536 * 384
    assert one.int8_inputs == int8.int8_inputs - 1536  # the fp32 product quantizes no input
    with pytest.raises(InputError, match="plan group 'x.ffn' is invalid"):
        Composition.of_arch(shape, int8=True, fp32_groups=("x.ffn",))


def test_an_exported_graph_reads_as_its_shape_and_precision(isolated_cache, teacher):
    """What the final stage and the plans price (a graph file) is what a trial priced (a shape and a precision)."""
    from kdnas.core.spec import parse_arch
    from kdnas.export import Plan, plan_graph, weight_groups
    from kdnas.latency import random_weight_graph

    spec = parse_arch("2x6x192x512", **teacher.student_sizes())
    fp32, int8 = random_weight_graph(spec), random_weight_graph(spec, int8=True)
    shape = Shape(2, 6, 192, 512)
    assert Composition.of_graph(fp32) == Composition.of_arch(shape)
    assert Composition.of_graph(int8) == Composition.of_arch(shape, int8=True)
    groups = weight_groups(fp32)
    plan = plan_graph(fp32, int8, isolated_cache / "plan.onnx", Plan(("embeddings", "1.ffn_in", "0.qkv")), groups)
    assert Composition.of_graph(plan) == Composition.of_arch(shape, int8=True, fp32_groups=("1.ffn_in", "0.qkv"))


def test_the_fit_recovers_the_costs_and_judges_itself_on_held_out_graphs():
    exact = synthetic_profile()
    assert np.allclose(exact.coef, COSTS, rtol=1e-6)
    assert exact.held_out.median_abs_error < 1e-6 and exact.held_out.within_5pct == 1.0
    assert exact.teacher_ms == TEACHER_MS and exact.rel_error < 1e-6
    noisy = synthetic_profile(noise=0.04)  # readings 4 % off either way: errors of that order, never zero
    assert 0.005 < noisy.rel_error < 0.2 and noisy.held_out.median_abs_error > 0.005
    guess = noisy.predict(Composition.of_arch(Shape(3, 12, 384, 1024), int8=True))
    assert guess.low < guess.ms < guess.high


def test_a_profile_file_reads_back_and_bad_ones_are_one_line(tmp_path):
    profile = synthetic_profile()
    path = profile.save(tmp_path / "target.json")
    assert load_profile(path) == profile
    text = path.read_text()
    cases = {"truncated.json": text[: len(text) // 2], "foreign.json": json.dumps({"readings": []}),
             "newer.json": text.replace('"version": 1', '"version": 99'), "list.json": "[1, 2]",
             "damaged.json": text.replace('"teacher_ms"', '"teacher_msx"')}
    for name, content in cases.items():
        (tmp_path / name).write_text(content)
        with pytest.raises(InputError) as err:
            load_profile(tmp_path / name)
        assert str(tmp_path / name) in str(err.value) and "\n" not in str(err.value), name
    with pytest.raises(InputError, match="cannot be read"):
        load_profile(tmp_path / "missing.json")


def test_a_profile_names_what_it_cannot_judge():
    profile = synthetic_profile()
    assert profile.mismatch(Settings()) is None and profile.mismatch(Settings(), "minilm-l6") is None
    assert "threads 2, not threads 4" in profile.mismatch(Settings(threads=4))
    assert "seq 128, not seq 256" in profile.mismatch(Settings(seq=256))
    assert "not torch" in profile.mismatch(Settings(runtime="torch"))
    assert "teacher minilm-l6, not mpnet-base" in profile.mismatch(Settings(), "mpnet-base")
    here = replace(FOREIGN, versions={**FOREIGN.versions, "onnxruntime": "9.9.9"})
    assert "onnxruntime 1.0.0 (here 9.9.9)" in profile.version_note(here)
    assert profile.version_note(FOREIGN) is None
    assert not FOREIGN.same_machine(Host.here())


def test_the_profile_judge_prices_what_the_search_reads(teacher):
    from kdnas.core.spec import parse_arch
    from kdnas.nas.config import SearchConfig
    from kdnas.nas.measure import beside_teacher, judge_for, latency_record

    profile = synthetic_profile()
    judge = judge_for(SearchConfig(), profile)
    assert judge.predicts and not judge_for(SearchConfig()).predicts
    assert judge.alone("minilm-l6").median_ms == TEACHER_MS
    spec = parse_arch("3x12x384x1024", **teacher.student_sizes())
    fp32, int8 = judge.alone(spec), judge.int8_twin().alone(spec)
    assert int8.median_ms < fp32.median_ms < TEACHER_MS and int8.predicted and int8.int8
    expected = profile.predict(Composition.of_arch(Shape(3, 12, 384, 1024), int8=True)).ms
    assert int8.median_ms == pytest.approx(expected)
    record = latency_record(int8)
    assert record.predicted and record.interval_ms[0] < record.median_ms < record.interval_ms[1]
    result, facts = beside_teacher(spec, judge.int8_twin(), TEACHER_MS, TEACHER_MS / 2)
    assert result.median_ms == pytest.approx(expected) and "edge_readings" not in facts  # one prediction decides


def test_a_profile_that_cannot_judge_the_search_is_refused_before_anything_is_written(tmp_path, capsys):
    from kdnas.cli import main

    profile = synthetic_profile().save(tmp_path / "target.json")
    (tmp_path / "cut.json").write_text(profile.read_text()[:100])
    for flags, words in ((["--target", str(tmp_path / "cut.json")], "not a kdnas target profile"),
                         (["--target", str(profile), "--threads", "1"], "threads 2, not threads 1"),
                         (["--target", str(profile), "--teacher", "mpnet-base"], "teacher minilm-l6, not mpnet-base")):
        assert main(["search", "--out", str(tmp_path / "run"), "--no-progress", *flags]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], lines
        assert not (tmp_path / "run").exists()


def test_a_search_judged_by_another_hosts_profile_reads_nothing(tmp_path, monkeypatch):
    """Every latency of the search — the teacher, the trials, the plans, the finalists — comes from the profile: the
    latency worker is never started; the summary gives the command that checks the shipped graph on the target."""
    import kdnas.latency._profile as measuring
    from kdnas.cli import main

    calls = []
    real = measuring._run_worker
    monkeypatch.setattr(measuring, "_run_worker", lambda *a, **k: calls.append(a) or real(*a, **k))
    monkeypatch.setenv("KDNAS_CACHE", str(tmp_path / "cache"))
    profile = synthetic_profile().save(tmp_path / "target.json")
    out = tmp_path / "run"
    rc = main(["search", "--out", str(out), "--target", str(profile), "--trials", "3", "--sampler", "random",
               "--layers", "1,2", "--hidden", "192,384", "--ffn", "512", "--proxy-steps", "4", "--eval-every", "2",
               "--final-steps", "4", "--proxy-eval", "8", "--seq-len", "32", "--final-train", "48",
               "--final-batch-size", "8", "--quality-sentences", "48", "--proxy-sentences", "60", "--no-progress"])
    assert rc == 0
    assert calls == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["target"]["cpu"] == "Foreign CPU 9000"
    assert summary["teacher_latency"]["median_ms"] == TEACHER_MS and summary["teacher_latency"]["predicted"]
    assert all(row["latency_predicted"] for row in summary["trials_table"] if row.get("latency_median_ms"))
    (check,) = summary["verified"]
    assert check["command"] == f"kdnas profile {check['dir']}/{check['graph']} --target {profile}"
    assert "read_ms" not in check
    ledger = summary["time_ledger"]
    assert ledger["wall_s"] > 0 and 0 < ledger["training_share"] < 1
    assert sum(ledger["seconds"].values()) == pytest.approx(ledger["wall_s"], abs=1.0)


def test_on_the_profiles_host_a_prediction_that_holds_the_budget_is_read(teacher):
    """`--target` on the profile's own host: a prediction sure of the verdict stands; one whose interval holds the
    budget is read there (`LatencyJudge.reading`), as a trial and a finalist would be without a profile."""
    from dataclasses import dataclass, field

    from kdnas.core.spec import parse_arch
    from kdnas.latency import LatencyResult
    from kdnas.nas.config import SearchConfig
    from kdnas.nas.measure import LatencyJudge, ProfileJudge, budget_latency

    @dataclass(frozen=True)
    class Reader(LatencyJudge):
        read: list = field(default_factory=list)

        def alone(self, target, *, use_cache=True):
            self.read.append(target)
            return LatencyResult(5.0, 5.0, 5.0, 5.0, 0.0, 10, False, 1, 128, 2, "onnxruntime", "here", {}, False, "k")

    reader = Reader(SearchConfig())

    @dataclass(frozen=True)
    class OnTarget(ProfileJudge):
        def reading(self):
            return reader

    spec = parse_arch("3x12x384x1024", **teacher.student_sizes())
    judge = OnTarget(SearchConfig(), profile=synthetic_profile(noise=0.04), on_target=True)
    guess = judge.alone(spec)
    assert budget_latency(spec, judge, guess.median_ms * 3)[0].predicted and reader.read == []  # far within
    assert budget_latency(spec, judge, guess.median_ms / 3)[0].predicted and reader.read == []  # far over
    result, _ = budget_latency(spec, judge, guess.median_ms * 1.001)  # inside the interval: read
    assert not result.predicted and result.median_ms == 5.0 and reader.read == [spec]
    elsewhere = OnTarget(SearchConfig(), profile=judge.profile, on_target=False)
    assert budget_latency(spec, elsewhere, guess.median_ms * 1.001)[0].predicted and len(reader.read) == 1
