"""The measuring process: `python -m latency._worker` reads one request (JSON on stdin), prints one result.

It runs apart from the caller so a search's training threads and memory never share its process,
and so it can pin itself to exactly the requested cores. With onnxruntime it times an ONNX file
(the caller exports a shape or folder first: `latency._profile._graph_to_time`); with torch it
builds the random-weight model itself. User errors come back as
{"error": ..., "user_error": true} with exit code 3; anything else is a crash (traceback on stderr).
"""

from __future__ import annotations

import json
import os
import sys
import time

from kdnas.core.quiet import reserved_latency_cores

from . import _stats

EXIT_USER_ERROR = 3


def main() -> int:
    request = json.loads(sys.stdin.read())
    from kdnas.core.errors import KdnasError

    try:
        result = run(request)
    except KdnasError as err:
        print(json.dumps({"error": str(err), "user_error": True}))
        return EXIT_USER_ERROR
    print(json.dumps(result))
    return 0


def run(request: dict) -> dict:
    threads = int(request["threads"])
    # Pin to `threads` cores: a runtime that sees more cores than it may use oversubscribes them.
    cores = latency_cores(threads)
    os.sched_setaffinity(0, cores)
    runner = _torch_runner if request["runtime"] == "torch" else _ort_runner
    if "reference" in request:
        return _run_pair(request, runner, threads, cores)
    rule = _stats.StopRule(**request.get("rule", {}))
    run_once = runner(request, threads)
    started = time.time()  # the timed runs (what must not overlap another measurement) start here
    best, blocks, quiet = _stats.measure_blocks(run_once, rule, blocks=int(request.get("blocks", 1)),
                                                retries=int(request["retries"]), max_cv=request["max_cv"])
    return {**best.__dict__, "attempts": len(blocks), "block_medians": [round(b.median_ms, 4) for b in blocks],
            "quiet": quiet, "cores": cores, "window": [started, time.time()]}


def _run_pair(request: dict, runner, threads: int, cores: list[int]) -> dict:
    """`request["target"]` and `request["reference"]` timed in alternation (`_stats.measure_pair`)."""
    run_target = runner(request, threads)
    run_reference = runner({**request, "target": request["reference"]}, threads)
    started = time.time()
    pair = _stats.measure_pair(run_target, run_reference, **request.get("pair", {}))
    return {"ratio": pair.ratio, "ratio_low": pair.ratio_low, "ratio_high": pair.ratio_high, "rounds": pair.rounds,
            "target": pair.target.__dict__, "reference": pair.reference.__dict__, "cores": cores,
            "window": [started, time.time()]}


def latency_cores(threads: int) -> list[int]:
    """The cores a measurement runs on: those `kdnas search --workers` kept free of training
    (`KDNAS_LATENCY_CORES`), else the last `threads` cores this process may use."""
    reserved = reserved_latency_cores()
    if reserved:
        return reserved[:threads]
    return sorted(os.sched_getaffinity(0))[-threads:]


def _inputs(request: dict):
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (int(request["batch"]), int(request["seq"]))
    # Ordinary word-piece ids: the values do not change the cost, only the shape does.
    vocab = int(request.get("vocab_size") or 30522)
    low, high = min(1000, vocab // 2), min(vocab, 30000)
    return {
        "input_ids": rng.integers(low, high, size=shape, dtype=np.int64),
        "attention_mask": np.ones(shape, dtype=np.int64),
        "token_type_ids": np.zeros(shape, dtype=np.int64),
    }


def random_model(target: dict):
    """A random-weight model of a shape (`{"kind": "spec", "spec": ...}`) or of a model folder's
    config (`{"kind": "folder", "path": ...}`): weights do not change the latency."""
    if target["kind"] == "spec":
        from kdnas.core.spec import StudentSpec, build_student

        return build_student(StudentSpec(**target["spec"]), seed=0).eval()
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(target["path"], attn_implementation="eager")
    return AutoModel.from_config(config, attn_implementation="eager").eval()


def _ort_runner(request: dict, threads: int):
    """Times an ONNX file as is (a shape or folder arrives exported by the caller).

    Every session of the process runs on one thread pool of `threads` threads (onnxruntime's global pool),
    as one deployed model does. With a pool per session, two graphs timed in alternation (`_run_pair`) each
    keep workers that spin after their runs on the same pinned cores: an INT8 student beside its fp32 teacher
    then read 0.40-0.83 of it round by round (median 0.555), against 0.456 for the two read one after the
    other; on one shared pool its rounds read 0.39-0.47 (median 0.445), and each graph alone as fast as
    before (2-core AMD EPYC; a one-off check, in git history)."""
    import onnxruntime as ort

    _one_pool(ort, threads)
    path = request["target"]["path"]
    options = ort.SessionOptions()
    options.use_per_session_threads = False
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feed = {k: v for k, v in _inputs(request).items() if k in names}
    missing = names - set(feed)
    if missing:
        from kdnas.core.errors import InputError

        raise InputError(f"ONNX model inputs {sorted(missing)} are not BERT-style encoder inputs")
    try:
        session.run(None, feed)
    except Exception as err:  # onnxruntime raises its own Fail/InvalidArgument types
        from kdnas.core.errors import InputError

        raise InputError(f"onnxruntime cannot run this model at batch {request['batch']}, "
                         f"seq {request['seq']}: {' '.join(str(err).split())[:300]}") from None
    return lambda: session.run(None, feed)


def _one_pool(ort, threads: int) -> None:
    """onnxruntime's process-wide thread pool, sized once, before the first session of the process."""
    from onnxruntime.capi import _pybind_state

    if not getattr(_one_pool, "done", False):
        _pybind_state.set_global_thread_pool_sizes(threads, 1)
        _one_pool.done = True


def _torch_runner(request: dict, threads: int):
    import torch

    torch.set_num_threads(threads)
    model = random_model(request["target"])
    feed = {k: torch.from_numpy(v) for k, v in _inputs(request).items()}
    if getattr(model.config, "type_vocab_size", 0) < 2:
        feed.pop("token_type_ids")

    def run_once():
        with torch.inference_mode():
            model(**feed)

    return run_once


if __name__ == "__main__":
    sys.exit(main())
