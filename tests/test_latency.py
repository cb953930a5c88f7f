"""latency/: statistics on a fake clock, real measurements in the pinned subprocess, cache, bad input."""

from __future__ import annotations

import json
import statistics
import time

import pytest

import kdnas.export as export
from kdnas.core.errors import KdnasError, LatencyError
from kdnas.core.spec import StudentSpec
import kdnas.latency._profile as latency_profile
from kdnas.latency import LatencyResult, latency_cores, profile, profile_pair
from kdnas.latency._stats import StopRule, measure, measure_blocks, measure_pair, summarize

TINY = "2x2x64x128"  # measured in seconds; real onnxruntime, real export


class FakeClock:
    """Each run takes the next duration from `durations` (seconds); the clock only moves in run_once."""

    def __init__(self, durations):
        self.now = 0.0
        self.durations = list(durations)
        self.calls = 0

    def __call__(self) -> float:
        return self.now

    def run_once(self) -> None:
        self.now += self.durations[self.calls % len(self.durations)]
        self.calls += 1


def test_statistics_on_a_fake_timer():
    # warm-up 2 runs, then a repeating 1..10 ms pattern: the median settles after 20 runs.
    clock = FakeClock([0.5] * 2 + [i / 1000 for i in range(1, 11)] * 100)
    rule = StopRule(warmup_runs=2, warmup_seconds=0.0, min_runs=20, min_seconds=0.0, window=10, rel_tol=0.01)
    stats = measure(clock.run_once, rule, clock=clock)
    assert clock.calls == 2 + 20  # warm-up not timed; stopped at the first stable check
    samples = [float(i) for i in range(1, 11)] * 2
    assert stats.runs == 20 and stats.stable
    assert stats.median_ms == pytest.approx(5.5)
    assert stats.min_ms == pytest.approx(1.0)
    assert stats.mean_ms == pytest.approx(5.5)
    assert stats.p90_ms == pytest.approx(9.1)  # linear interpolation, as numpy's default
    assert stats.cv == pytest.approx(statistics.pstdev(samples) / 5.5)


def test_unstable_timings_hit_the_cap_and_say_so():
    # durations that keep growing: the median never settles, so the run cap ends it.
    clock = FakeClock([0.0] + [i / 1000 for i in range(1, 1000)])
    rule = StopRule(warmup_runs=1, warmup_seconds=0.0, min_runs=10, min_seconds=0.0, max_runs=50, window=10)
    stats = measure(clock.run_once, rule, clock=clock)
    assert stats.runs == 50 and not stats.stable
    assert stats.median_ms == pytest.approx(25.5)


def test_time_cap_ends_a_slow_measurement():
    clock = FakeClock([0.0] + [1.0, 3.0] * 50)  # 1 s and 3 s runs: the 10 s cap comes first
    rule = StopRule(warmup_runs=1, warmup_seconds=0.0, min_runs=20, min_seconds=0.0, max_seconds=10.0)
    stats = measure(clock.run_once, rule, clock=clock)
    assert stats.runs == 6  # after 5 runs 9 s have passed, the 6th ends at 12 s
    assert not stats.stable and stats.median_ms == pytest.approx(2000.0)


class DriftingHost:
    """Two models on a host whose speed drifts: a run of `model` costs its base time times the host's
    slowness, which grows by `drift` per run, with a 3x burst of other work over runs `burst`."""

    def __init__(self, drift: float, burst: range) -> None:
        self.now, self.runs, self.drift, self.burst = 0.0, 0, drift, burst

    def __call__(self) -> float:
        return self.now

    def runner(self, base_s: float):
        def run_once() -> None:
            slow = (1 + self.drift * self.runs) * (3.0 if self.runs in self.burst else 1.0)
            self.now += base_s * slow
            self.runs += 1
        return run_once


def test_a_pair_timed_in_alternation_keeps_the_ratio_on_a_drifting_host():
    # The host slows by half over the measurement and a burst hits a few runs: the student (5 ms)
    # read alone at the end would be 1.5x as slow as at the start, but its ratio to the teacher
    # (10 ms) stays 0.5 whatever the drift: each round times both, and the burst lands in one round.
    host = DriftingHost(drift=0.5 / 380, burst=range(100, 104))
    pair = measure_pair(host.runner(0.005), host.runner(0.010), rounds=12, runs=15, warmup_runs=5, clock=host)
    assert pair.ratio == pytest.approx(0.5, rel=0.01)
    assert pair.ratio_low <= pair.ratio <= pair.ratio_high and pair.rounds == 12
    assert pair.target.runs == pair.reference.runs == 12 * 15 and host.runs == 10 + 2 * 12 * 15
    # a solo reading cannot tell: the student's own runs spread with the host's drift
    assert pair.target.p90_ms / pair.target.min_ms > 1.3


def test_profile_pair_times_two_real_graphs_side_by_side(isolated_cache):
    small, large = "1x2x64x128", "4x2x128x512"
    pair = profile_pair(small, large, threads=1, rounds=4, runs=5)
    assert 0 < pair.ratio < 1 and pair.ratio_low <= pair.ratio <= pair.ratio_high
    assert pair.target.target == small and pair.reference.target == large and pair.rounds == 4
    assert pair.target_ms < pair.reference_ms and pair.target.runs == pair.reference.runs == 20
    on_scale = pair.on_scale(100.0)  # as if the reference read 100 ms
    assert on_scale.median_ms == pytest.approx(100.0 * pair.ratio) and on_scale.min_ms <= on_scale.median_ms
    graphs = sorted((latency_profile.default_cache_dir() / "graphs").glob("*/model.onnx"))
    assert len(graphs) == 2, "each graph exported once, kept for the next pair"
    again = profile_pair(large, small, threads=1, rounds=4, runs=5)
    assert sorted((latency_profile.default_cache_dir() / "graphs").glob("*/model.onnx")) == graphs
    assert again.ratio > 1 and again.target.target == large
    with pytest.raises(KdnasError, match="seq=4096 exceeds"):
        profile_pair(small, large, seq=4096)
    # a graph folder left without its graph (by hand: builds are renamed in whole) is named, not timed
    graphs[0].unlink()
    (graphs[0].parent / "notes.txt").write_text("")
    with pytest.raises(LatencyError, match="has no model.onnx; remove the folder and run again"):
        profile_pair(small, large, threads=1, rounds=4, runs=5)
    assert sorted(p.name for p in graphs[0].parent.parent.iterdir()) == sorted(g.parent.name for g in graphs)


BLOCK_RULE = StopRule(warmup_runs=1, warmup_seconds=0.0, min_runs=10, min_seconds=0.0, window=5, rel_tol=1.0)


def _block(ms: list[float]) -> list[float]:
    """One block under BLOCK_RULE: a warm-up run, then 10 timed runs (seconds)."""
    return [0.0] + [m / 1000 for m in (ms * 10)[:10]]


def test_blocks_keep_the_least_disturbed_median():
    # A burst of other work slows the second block; the quiet blocks' lower median is reported.
    clock = FakeClock(_block([10.0]) + _block([13.0]) + _block([10.2]))
    pauses = []
    best, blocks, quiet = measure_blocks(clock.run_once, BLOCK_RULE, blocks=3, retries=2, max_cv=0.10,
                                         clock=clock, sleep=pauses.append)
    assert [b.median_ms for b in blocks] == pytest.approx([10.0, 13.0, 10.2])
    assert best.median_ms == pytest.approx(10.0) and best is blocks[0] and quiet
    assert pauses == [0.2, 0.2]  # no retry: a block was quiet


def test_outliers_inflate_cv_not_the_kept_median_and_noisy_blocks_earn_retries():
    spiky = [10.0] * 8 + [40.0, 40.0]  # two preempted runs: median 10, cv about 50 %
    clock = FakeClock(_block(spiky) * 3 + _block([11.0]) + _block(spiky))
    pauses = []
    best, blocks, quiet = measure_blocks(clock.run_once, BLOCK_RULE, blocks=3, retries=2, max_cv=0.10,
                                         clock=clock, sleep=pauses.append)
    assert len(blocks) == 4 and quiet  # three spiky blocks, then one retry that was quiet
    assert pauses == [0.2, 0.2, 1.0]
    assert best.median_ms == pytest.approx(10.0) and best.cv > 0.10  # the lowest median, spikes and all


def test_a_machine_that_stays_noisy_uses_every_retry():
    clock = FakeClock(_block([5.0, 15.0]) * 5)
    best, blocks, quiet = measure_blocks(clock.run_once, BLOCK_RULE, blocks=3, retries=2, max_cv=0.10,
                                         clock=clock, sleep=lambda s: None)
    assert len(blocks) == 5 and not quiet and best.cv > 0.10


def test_summarize_single_sample():
    stats = summarize([4.0])
    assert (stats.median_ms, stats.p90_ms, stats.min_ms, stats.cv, stats.runs) == (4.0, 4.0, 4.0, 0.0, 1)


def _worker_reporting(quiet: bool, calls: list):
    """The real pinned worker, its verdict on the machine's quiet forced (so caching is deterministic)."""
    real = latency_profile._run_worker

    def run(request, threads, timeout):
        calls.append(request["target"])
        return {**real(request, threads, timeout), "quiet": quiet}
    return run


def _noisy_worker(calls: list):
    """A stand-in for the pinned worker that reports a busy machine (the caching rule is under test,
    not the measurement: the real worker runs in the other tests of this file)."""
    def run(request, threads, timeout):
        calls.append(request["target"])
        return {"median_ms": 1.0, "p90_ms": 1.5, "min_ms": 0.8, "mean_ms": 1.1, "cv": 0.3, "runs": 20, "quiet": False,
                "stable": False, "attempts": 5, "fused": {}, "block_medians": [1.0, 1.4], "cores": [1],
                "window": [0.0, 1.0]}
    return run


def test_noisy_measurements_are_not_cached(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(latency_profile, "_run_worker", _noisy_worker(calls))
    first = profile(TINY, seq=16, cache_dir=tmp_path)
    assert first.noisy and not any(tmp_path.iterdir())
    assert not profile(TINY, seq=16, cache_dir=tmp_path).cached and len(calls) == 2  # measured again
    # a noisy entry left by an older version is not trusted either
    (tmp_path / f"{first.key}.json").write_text(json.dumps(first.to_dict()))
    assert not profile(TINY, seq=16, cache_dir=tmp_path).cached and len(calls) == 3


def test_measure_then_cache_hit(tmp_path, monkeypatch):
    monkeypatch.setattr(latency_profile, "_run_worker", _worker_reporting(True, []))
    started = time.time()
    first = profile(TINY, seq=32, cache_dir=tmp_path)
    assert not first.cached
    assert first.median_ms > 0 and first.min_ms <= first.median_ms <= first.p90_ms
    assert first.runs >= 20 and first.cv >= 0
    assert (first.batch, first.seq, first.threads, first.runtime) == (1, 32, 2, "onnxruntime")
    assert first.fused["Attention"] == 2  # the measured graph is the fused one
    assert "onnxruntime" in first.versions and first.cpu
    # where and when the timed runs happened: the pinned cores, a window inside this test
    assert first.cores == latency_cores(2) and started < first.window[0] < first.window[1] < time.time()
    # The same shape given as a spec is the same key: the search never measures it twice.
    second = profile(StudentSpec(2, 2, 64, 128), seq=32, cache_dir=tmp_path)
    assert second.cached and second.key == first.key
    assert second.median_ms == first.median_ms
    stored = json.loads((tmp_path / f"{first.key}.json").read_text())
    assert LatencyResult(**stored).median_ms == first.median_ms
    # Another thread count or vocabulary is another key (keys only: the stand-in worker does not time).
    monkeypatch.setattr(latency_profile, "_run_worker", _noisy_worker([]))
    assert profile(TINY, seq=32, threads=1, cache_dir=tmp_path).key != first.key
    assert profile(StudentSpec(2, 2, 64, 128, vocab_size=1000), seq=32, cache_dir=tmp_path).key != first.key
    # An INT8 reading is of one quantization recipe: another recipe is another key, fp32 readings keep theirs.
    int8_key = profile(TINY, seq=32, int8=True, cache_dir=tmp_path).key
    assert int8_key != first.key
    monkeypatch.setattr(export, "int8_recipe", lambda **_: "another recipe")
    assert profile(TINY, seq=32, int8=True, cache_dir=tmp_path).key != int8_key
    assert profile(TINY, seq=32, cache_dir=tmp_path).key == first.key


def test_torch_runtime_and_onnx_file(tmp_path):
    torch_res = profile(TINY, seq=16, runtime="torch", use_cache=False)
    assert torch_res.runtime == "torch" and torch_res.median_ms > 0 and not torch_res.cached

    from kdnas.core.spec import build_student
    from kdnas.export import export_onnx

    path = tmp_path / "tiny.onnx"
    export_onnx(build_student(StudentSpec(2, 2, 64, 128, max_position=64)), path)
    res = profile(str(path), seq=16, cache_dir=tmp_path / "cache")
    assert res.median_ms > 0 and res.target == "tiny.onnx"
    with pytest.raises(KdnasError, match="exceeds the model's 64 positions"):
        profile(str(path), seq=65, cache_dir=tmp_path / "cache")
    with pytest.raises(KdnasError, match="runtime torch needs a model folder"):
        profile(str(path), runtime="torch", cache_dir=tmp_path / "cache")


@pytest.mark.parametrize(
    "target, kwargs, message",
    [
        (TINY, {"batch": 0}, "batch=0 is invalid"),
        (TINY, {"seq": -1}, "seq=-1 is invalid"),
        (TINY, {"threads": 0}, "threads=0 is invalid"),
        (TINY, {"threads": 4096}, "exceeds the"),
        (TINY, {"seq": 513}, "exceeds the model's 512 positions"),
        (TINY, {"runtime": "tensorrt"}, "runtime 'tensorrt' is invalid: allowed "),
        ("4x5x192x768", {}, "not divisible by heads=5"),
        ("0x12x192x768", {}, "layers=0 is invalid"),
        ("4x12x192", {}, "not of the form"),
        ("no-such-model", {}, "not an existing .onnx file"),
        ("/no/such/model.onnx", {}, "does not exist"),
        ("mpnet-base", {"seq": 513}, "exceeds the model's 512 positions"),
    ],
)
def test_bad_input_is_a_user_error(target, kwargs, message, tmp_path):
    with pytest.raises(KdnasError, match=message):
        profile(target, cache_dir=tmp_path, **kwargs)
    assert not any(tmp_path.iterdir())  # nothing measured, nothing cached


@pytest.mark.parametrize("config, message", [("[]", "is not a transformers config: 'list' object"),
                                             ('{"max_position_embeddings": "lots"}', "invalid literal for int")])
def test_a_config_json_that_is_no_config_is_a_user_error(config, message, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(config)
    with pytest.raises(KdnasError, match=message):
        profile(str(tmp_path / "model"), cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_a_cache_that_cannot_be_written_is_refused_before_measuring(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setattr(latency_profile, "_measure", lambda *a, **k: pytest.fail("measured first"))
    with pytest.raises(KdnasError, match="latency cache folder .*a-file/lat is not writable.*--no-cache"):
        profile(TINY, cache_dir=tmp_path / "a-file" / "lat")


def test_corrupt_onnx_file(tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07this is not a protobuf model" * 10)
    with pytest.raises(KdnasError, match="cannot be read|empty graph"):
        profile(str(bad), cache_dir=tmp_path / "cache")


def test_cli_profile_json_and_errors(tmp_path, capsys, monkeypatch):
    from kdnas.cli import main

    monkeypatch.setenv("KDNAS_CACHE", str(tmp_path))
    monkeypatch.setattr(latency_profile, "_run_worker", _worker_reporting(True, []))  # a 0.1 ms model is noisy
    assert main(["profile", TINY, "--seq", "16", "--threads", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seq"] == 16 and out["threads"] == 1 and out["median_ms"] > 0 and "cv" in out
    assert main(["profile", TINY, "--seq", "16", "--threads", "1"]) == 0
    text = capsys.readouterr().out
    assert "(cached)" in text and "cv " in text and "median" in text

    for argv in (["profile", TINY, "--batch", "0"], ["profile", str(tmp_path / "missing.onnx")],
                 ["profile", "3x7x384x1024"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("kdnas profile: error:") and err.count("\n") == 1


def test_cli_profile_beside_reports_the_ratio_and_refuses_bad_input(isolated_cache, capsys):
    from kdnas.cli import main

    assert main(["profile", "1x2x64x128", "--beside", "4x2x128x512", "--seq", "16", "--threads", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("1x2x64x128 beside 4x2x128x512") and "alternating rounds" in text
    assert main(["profile", "1x2x64x128", "--beside", "4x2x128x512", "--seq", "16", "--threads", "1", "--json"]) == 0
    assert 0 < json.loads(capsys.readouterr().out)["ratio"] < 1
    # INT8 beside INT8: both graphs quantized with the export's recipe
    assert main(["profile", "1x2x64x128", "--beside", "4x2x128x512", "--seq", "16", "--threads", "1", "--int8",
                 "--json"]) == 0
    pair = json.loads(capsys.readouterr().out)
    assert pair["target"]["runtime"] == "onnxruntime-int8" and 0 < pair["ratio"] < 1
    for argv in (["profile", TINY, "--beside", "3x7x384x1024"], ["profile", TINY, "--int8", "--runtime", "torch"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("kdnas profile: error:") and err.count("\n") == 1


def test_measurements_on_one_host_take_turns(tmp_path, monkeypatch):
    """Two measurements at once (two search workers) run one after the other, not side by side."""
    import threading

    spans = []

    def slow_worker(request, threads, timeout):
        start = time.monotonic()
        time.sleep(0.5)
        spans.append((start, time.monotonic()))
        return {"median_ms": 1.0, "p90_ms": 1.0, "min_ms": 1.0, "mean_ms": 1.0, "cv": 0.0, "runs": 1, "quiet": True,
                "stable": True, "attempts": 1, "fused": {}, "block_medians": [1.0], "cores": [1],
                "window": [time.time() - 0.5, time.time()]}

    monkeypatch.setattr(latency_profile, "_run_worker", slow_worker)
    results = []

    def measure_one(seq: int) -> None:
        results.append(profile(TINY, seq=seq, cache_dir=tmp_path))

    runs = [threading.Thread(target=measure_one, args=(8 * (i + 1),)) for i in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    assert len(results) == 2  # both measurements completed
    (a_start, a_end), (b_start, b_end) = sorted(spans)
    assert b_start >= a_end


_HOLD = """
import sys, time
from kdnas.core.quiet import quiet_host
with quiet_host():
    print("held", flush=True)
    time.sleep(float(sys.argv[1]))
"""


def test_training_on_shared_cores_waits_while_a_measurement_runs(monkeypatch):
    """Another process measuring (holding the host's latency lock): a training step that shares its
    cores waits for the end; a worker that `--workers` kept off the latency cores does not."""
    import subprocess
    import sys
    from pathlib import Path

    import torch

    from kdnas.core.quiet import LATENCY_CORES_ENV
    from kdnas.distill.loop import Optimization, train_steps

    model = torch.nn.Linear(2, 1)

    def one_step() -> float:
        started = time.monotonic()
        list(train_steps(list(model.parameters()), [torch.ones(1, 2)], lambda batch: model(batch).sum(),
                         Optimization(lr=1e-3, steps=1, warmup_steps=0, weight_decay=0.0), torch.device("cpu")))
        return time.monotonic() - started

    one_step()  # the first step also pays for imports and set-up
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, "2.0"], cwd=Path(__file__).resolve().parents[1],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv(LATENCY_CORES_ENV, "99999")  # measurements reserved a core this process is kept off
        assert one_step() < 0.5
        monkeypatch.delenv(LATENCY_CORES_ENV)
        assert one_step() > 1.0  # waited for the measurement to end
    finally:
        holder.wait(timeout=30)


def test_a_workers_child_counts_the_cores_kept_for_measurements(monkeypatch):
    """`kdnas search --workers` pins a child's training to fewer cores than --threads and keeps others
    for its measurements: the settings check must count those too."""
    from kdnas.latency import LATENCY_CORES_ENV, check_settings

    monkeypatch.setattr(latency_profile.os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setenv(LATENCY_CORES_ENV, "1,2")
    check_settings(1, 128, 3, "onnxruntime")
    with pytest.raises(KdnasError, match="threads=4 exceeds the 3 CPU cores"):
        check_settings(1, 128, 4, "onnxruntime")
