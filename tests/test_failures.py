"""Failures are bounded: every failed trial is retried once, a shape whose retry fails too is not
trained again, a run of identical errors stops the search, and a trial that another worker failed
does not stop this one. The searches here run the real stack (storage, latency, teacher) with one
function of the proxy replaced so that a chosen shape fails."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from kdnas.core.errors import TrainingError
from kdnas.nas import SearchConfig, search
from kdnas.nas.resume import counted_trials, enqueue_retries, failed_shapes, repeated_failure
from kdnas.nas.storage import default_storage_url, open_storage
from kdnas.nas.context import SearchContext

DIST = {"layers": optuna.distributions.IntDistribution(1, 6)}


def _failed(study: optuna.Study, arch: str, reason: str) -> optuna.Trial:
    """A trial of `arch` that failed with an error, recorded as the objective records it."""
    trial = study.ask(DIST)
    for key, value in {"arch": arch, "fail_kind": "error", "reason": reason}.items():
        trial.set_user_attr(key, value)
    study.tell(trial, state=TrialState.FAIL)
    return trial


def test_a_failed_trial_is_retried_once_and_its_failed_retry_is_final(tmp_path):
    study = optuna.create_study(storage=open_storage(default_storage_url(tmp_path)), study_name="s")
    first = _failed(study, "2x4x96x256", "RuntimeError: boom")
    assert enqueue_retries(study) == [first.number] and enqueue_retries(study) == []
    retry = study.ask(DIST)  # the queued retry: same parameters
    assert retry.params == study.trials[first.number].params and retry.user_attrs["retry_of"] == first.number
    for key, value in {"arch": "2x4x96x256", "fail_kind": "error", "reason": "RuntimeError: boom again"}.items():
        retry.set_user_attr(key, value)
    study.tell(retry, state=TrialState.FAIL)
    assert enqueue_retries(study) == []  # the shape failed twice: no third try
    assert failed_shapes(study) == {"2x4x96x256": "RuntimeError: boom again"}
    assert counted_trials(study) == 1  # the first failure counts through its retry


def test_two_workers_that_take_the_last_slot_at_once_run_only_the_first_numbered_trial(tmp_path):
    from kdnas.nas.resume import is_surplus

    study = optuna.create_study(storage=open_storage(default_storage_url(tmp_path)), study_name="s")
    done = study.ask(DIST)
    study.tell(done, 0.5)
    retried = _failed(study, "2x4x96x256", "RuntimeError: boom")
    enqueue_retries(study)
    # Two workers each saw 2 of 3 trials counted and asked at the same moment: the queued retry and a new one.
    first, second = study.ask(DIST), study.ask(DIST)
    assert first.user_attrs["retry_of"] == retried.number
    assert not is_surplus(study, first.number, wanted=3)  # the done trial and nothing running ahead of it
    assert is_surplus(study, second.number, wanted=2)  # the done trial and the running retry fill 2
    assert not is_surplus(study, second.number, wanted=3)
    second.set_user_attr("status", "surplus")
    study.tell(second, state=TrialState.PRUNED)
    study.tell(first, 0.7)
    assert counted_trials(study) == 2  # the surplus trial does not count; the failure counts via its retry


def test_an_interrupted_retry_is_retried_again_and_the_shape_stays_open(tmp_path):
    study = optuna.create_study(storage=open_storage(default_storage_url(tmp_path)), study_name="s")
    first = study.ask(DIST)
    first.set_user_attr("fail_kind", "interrupted")
    study.tell(first, state=TrialState.FAIL)
    assert enqueue_retries(study) == [first.number]
    retry = study.ask(DIST)
    retry.set_user_attr("arch", "1x4x96x256")
    retry.set_user_attr("fail_kind", "interrupted")
    study.tell(retry, state=TrialState.FAIL)
    assert enqueue_retries(study) == [retry.number]  # Ctrl-C is the user's, not the shape's fault
    assert failed_shapes(study) == {}


def test_repeated_failure_needs_the_same_error_every_time(tmp_path):
    study = optuna.create_study(storage=open_storage(default_storage_url(tmp_path)), study_name="s")
    _failed(study, "1x4x96x256", "OSError: disk full")
    _failed(study, "2x4x96x256", "OSError: disk full")
    assert repeated_failure(study, 3) is None  # only two so far
    _failed(study, "3x4x96x256", "OSError: disk is full")
    assert repeated_failure(study, 3) is None  # not the same error
    _failed(study, "4x4x96x256", "OSError: disk is full")
    _failed(study, "5x4x96x256", "OSError: disk is full")
    assert repeated_failure(study, 3) == "OSError: disk is full"


POISON = "1x12x384x256"
BASE = dict(trials=4, sampler="random", budget_ms=1000.0, proxy_steps=4, eval_every=2, final_steps=0, final_train=48,
            proxy_eval=8, seq_len=32, quality_sentences=0, proxy_sentences=60, progress=False,
            space_overrides={"layers": "1,2", "heads": "12", "hidden": "384", "ffn": "256"})


@pytest.fixture
def proxy(monkeypatch):
    """The search's proxy distillation, with a switch that makes chosen shapes fail."""
    real = SearchContext.proxy
    state = {"fail": set(), "calls": []}

    def proxy(self, spec, on_eval=None):
        state["calls"].append(spec.arch)
        if "*" in state["fail"]:
            raise OSError("[Errno 28] No space left on device")
        if spec.arch in state["fail"]:
            raise RuntimeError(f"poisoned shape {spec.arch}")
        return real(self, spec, on_eval=on_eval)

    monkeypatch.setattr(SearchContext, "proxy", proxy)
    return state


def test_a_poison_shape_is_tried_twice_then_settled_and_the_search_finishes(tmp_path, proxy):
    proxy["fail"].add(POISON)
    search(SearchConfig.from_flags(out=str(tmp_path / "run"), seed=1, **BASE))
    study = optuna.load_study(study_name="kdnas", storage=open_storage(default_storage_url(tmp_path / "run")))
    poison = [t for t in study.trials if t.user_attrs.get("arch") == POISON]
    assert proxy["calls"].count(POISON) == 2, proxy["calls"]  # the first try and its one retry
    assert [t.state for t in poison[:2]] == [TrialState.FAIL, TrialState.FAIL]
    assert poison[1].user_attrs["retry_of"] == poison[0].number
    # the retry reuses the latency its first try measured (stored in the study, shared by all
    # workers), unless that one was NOISY: a busy machine's figure is measured again
    if not poison[0].user_attrs["latency"]["noisy"]:
        assert poison[1].user_attrs["latency"]["measured_in_trial"] == poison[0].number
        assert poison[1].user_attrs["latency"]["median_ms"] == poison[0].user_attrs["latency"]["median_ms"]
    assert len(poison) > 2, "seed 1 should propose the poison shape again (pick another seed)"
    for later in poison[2:]:  # proposed again: settled at once, infeasible, with the reason
        assert later.state == TrialState.COMPLETE and later.user_attrs["status"] == "rejected"
        assert "failed twice, not tried again: RuntimeError: poisoned shape" in later.user_attrs["reason"]
        assert later.constraints["shape"] > 0
    assert counted_trials(study) == 4 and not study.get_trials(states=(TrialState.RUNNING,))
    assert any(t.user_attrs.get("status") == "feasible" for t in study.trials)


@pytest.mark.slow  # the rule itself is tested above (test_repeated_failure_...); this is its wiring, 30-45 s
def test_the_same_error_three_times_stops_the_search_with_that_error(tmp_path, proxy):
    proxy["fail"].add("*")
    with pytest.raises(TrainingError, match=r"last 3 trials all failed with the same error.*No space left"):
        search(SearchConfig.from_flags(out=str(tmp_path / "run"), seed=0, **{**BASE, "trials": 20,
               "space_overrides": {"layers": "1,2,3", "heads": "4", "hidden": "96", "ffn": "256"}}))
    assert len(proxy["calls"]) == 3  # not 20
    assert (tmp_path / "run" / "trials.csv").is_file()  # the pages still show what happened


@pytest.mark.slow  # a full search (15-30 s); kept out of the default run, which is held near 15 minutes
def test_a_trial_failed_by_another_worker_does_not_stop_this_one(tmp_path, monkeypatch):
    real = SearchContext.proxy
    victims = []

    def proxy(self, spec, on_eval=None):
        result = real(self, spec, on_eval=on_eval)
        if not victims:  # another host judged this worker dead and failed its trial meanwhile
            study = optuna.load_study(study_name="kdnas", storage=open_storage(default_storage_url(tmp_path / "run")))
            running = study.get_trials(states=(TrialState.RUNNING,))[0]
            study._storage.set_trial_state_values(running._trial_id, state=TrialState.FAIL)
            victims.append(running.number)
        return result

    monkeypatch.setattr(SearchContext, "proxy", proxy)
    search(SearchConfig.from_flags(out=str(tmp_path / "run"), seed=0, **{**BASE, "trials": 2}))
    study = optuna.load_study(study_name="kdnas", storage=open_storage(default_storage_url(tmp_path / "run")))
    assert study.trials[victims[0]].state == TrialState.FAIL
    assert counted_trials(study) == 2 and not study.get_trials(states=(TrialState.RUNNING,))
