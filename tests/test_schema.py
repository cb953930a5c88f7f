"""nas.schema, the storage edge: what a study and a trial hold, read and written by field."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from kdnas.nas.schema import (SETTINGS_ATTR, FinalRecord, LatencyRecord, StudyFacts, TrialRecord, TrialSeconds,
                              TrialStatus, record_fact, recorded, store, stored)


def test_a_trials_record_reads_by_field_and_a_field_it_lacks_is_refused_when_written():
    study = optuna.create_study()
    trial = study.ask()
    store(trial, "arch", "3x12x384x1536")
    store(trial, "status", TrialStatus.FEASIBLE)
    with pytest.raises(KeyError, match="TrialRecord has no field 'arhc'"):
        store(trial, "arhc", "3x12x384x1536")
    rec = recorded(trial)
    assert rec.arch == "3x12x384x1536" and rec.status is TrialStatus.FEASIBLE and rec.reward is None
    assert TrialRecord.from_attrs({"status": "a status of a later version"}).status == "a status of a later version"


def test_an_optuna_heartbeat_retry_reads_as_retry_of_through_migrate():
    frozen = create_trial(state=TrialState.WAITING, params={"layers": 2}, distributions={"layers": IntDistribution(1, 6)},
                          system_attrs={"failed_trial": 4})
    assert recorded(frozen).retry_of == 4 and stored(frozen)["retry_of"] == 4
    own = create_trial(state=TrialState.WAITING, params={"layers": 2}, distributions={"layers": IntDistribution(1, 6)},
                       user_attrs={"retry_of": 1}, system_attrs={"failed_trial": 4})
    assert recorded(own).retry_of == 1  # kdnas's own record wins


def test_the_studys_facts_are_written_by_field_with_the_settings_last_and_read_back():
    facts = StudyFacts(settings={"teacher": "minilm-l6"}, budget_ms=8.0,
                       teacher_latency=LatencyRecord(median_ms=16.0, noisy=False, int8_ms=7.5))
    assert list(facts.set_fields())[-1] == "settings"  # a study without them is not yet a kdnas study
    study = optuna.create_study()
    for name, value in facts.set_fields().items():
        record_fact(study, name, value)
    assert SETTINGS_ATTR in study.user_attrs  # stored under the name earlier versions used
    assert StudyFacts.from_study(study) == facts
    assert study.user_attrs["teacher_latency"] == {"median_ms": 16.0, "noisy": False, "int8_ms": 7.5}  # as before
    with pytest.raises(KeyError, match="StudyFacts has no field 'finals'"):
        record_fact(study, "finals", [])
    shipped = FinalRecord(trial=2, arch="3x12x384x1536", dir="best", latency_ms=7.9, latency={"median_ms": 7.9})
    record_fact(study, "final", [shipped])
    assert study.user_attrs["final"][0]["latency"] == {"median_ms": 7.9}  # stored as its JSON
    assert StudyFacts.from_study(study).final == (shipped,)


def test_a_refused_finalist_is_a_typed_record_stored_as_the_json_earlier_versions_wrote():
    """The final stage's refusals are stored as the flat dicts earlier versions wrote (what `kdnas report` and a
    resumed study read), and read back as `Refusal`s: a key this version does not know is left out, a record of
    before the recipe tag reads with an empty recipe."""
    from kdnas.nas.schema import AS_SHIPPED, Refusal

    refusal = Refusal(trial=3, arch="3x12x384x1536", recipe={"method": "embed", "budget": "0.5x"}, stage=AS_SHIPPED,
                      latency_ms=8.9, budget_ms=8.3, budget_limit_ms=8.4, dir="runs/over-budget/3", steps=640,
                      distill_s=120.5, ratio_to_teacher=0.53, ratio_quartiles=[0.52, 0.54], latency_readings_ms=[8.9, 8.8])
    study = optuna.create_study()
    record_fact(study, "final_over_budget", [refusal])
    stored_dict = study.user_attrs["final_over_budget"][0]
    assert stored_dict["arch"] == "3x12x384x1536" and stored_dict["stage"] == "as shipped"
    assert "neighbour_of" not in stored_dict and stored_dict["latency_readings_ms"] == [8.9, 8.8]
    assert StudyFacts.from_study(study).final_over_budget == (refusal,)
    old = {"trial": 2, "arch": "2x12x384x1536", "stage": "before training", "dir": None, "latency_ms": 5.1,
           "budget_ms": 4.9, "latency_readings_ms": [], "a_later_field": 1}
    read = StudyFacts.from_attrs({"final_over_budget": [old]}).final_over_budget[0]
    assert (read.arch, read.recipe, read.dir, read.neighbour_of) == ("2x12x384x1536", {}, None, None)


def test_a_latency_record_is_a_field_of_the_trials_record_and_json_only_in_storage():
    """A trial's latency is stored as the set fields of its LatencyRecord (what earlier versions stored) and read
    back as the same record; a key this version does not know is left out, an empty record reads as none."""
    study = optuna.create_study()
    trial = study.ask()
    latency = LatencyRecord(median_ms=4.2, p90_ms=4.4, noisy=False, ratio_to_teacher=0.42, ratio_quartiles=[0.41, 0.43])
    store(trial, "latency", latency)
    assert trial.user_attrs["latency"] == {"median_ms": 4.2, "p90_ms": 4.4, "noisy": False, "ratio_to_teacher": 0.42,
                                           "ratio_quartiles": [0.41, 0.43]}
    assert recorded(trial).latency == latency and recorded(trial).latency_int8 is None
    later = TrialRecord.from_attrs({"latency": {"median_ms": 3.0, "a_later_field": 1}, "latency_int8": {}})
    assert later.latency == LatencyRecord(median_ms=3.0) and later.latency_int8 is None


def test_a_trials_seconds_are_typed_stored_as_the_json_earlier_versions_wrote_and_its_own_time_excludes_the_teacher():
    study = optuna.create_study()
    trial = study.ask()
    store(trial, "seconds", TrialSeconds(latency=1.5, distill=60.0, teacher=40.0, total=62.0))
    assert trial.user_attrs["seconds"] == {"latency": 1.5, "distill": 60.0, "teacher": 40.0, "total": 62.0}
    seconds = recorded(trial).seconds
    assert seconds == TrialSeconds(latency=1.5, distill=60.0, teacher=40.0, total=62.0) and seconds.own == 22.0
    untrained = TrialRecord.from_attrs({"seconds": {"latency": 0.5, "distill": 0.0, "total": 0.7}}).seconds
    assert untrained.teacher is None and untrained.own == 0.7 and TrialSeconds().own is None


def test_a_finalists_quality_is_typed_and_stored_as_the_json_earlier_versions_wrote():
    """A shipped student's fidelity table is stored in its record as the nested JSON earlier versions wrote (what
    search.json, summary.json and a resumed study hold) and read back as the same `Quality`: the student's row
    first, a graph's row by its file, a key this version does not know left out, a skipped table and an earlier
    record's `int8: null` read as they were meant."""
    from kdnas.nas.schema import Fidelity, Quality

    quality = Quality(fidelity={"student": Fidelity(0.91, 0.004, sentences=500), "first 3 layers (untrained)":
                                Fidelity(0.52, 0.01)}, sentences=500, max_len=128, beats_baselines=True,
                      trained_on=Fidelity(0.95, 0.004, sentences=500, passes=2.5), int8=Fidelity(0.90, 0.004))
    stored_dict = quality.to_attrs()
    assert stored_dict["fidelity"]["student"] == {"spearman": 0.91, "spearman_se": 0.004, "sentences": 500}
    assert stored_dict["trained_on"]["passes"] == 2.5 and "mixed" not in stored_dict and "skipped" not in stored_dict
    assert Quality.from_attrs(stored_dict) == quality
    assert quality.student.spearman == 0.91 and quality.of_graph("model.int8.onnx").spearman == 0.90
    assert quality.of_graph("model.onnx") is quality.student and quality.of_graph("model.mixed.onnx") is None
    earlier = {**stored_dict, "int8": None, "a_later_field": 1,
               "fidelity": {"student": {"spearman": 0.91, "spearman_se": 0.004, "a_later_key": 2}}}
    read = Quality.from_attrs(earlier)
    assert read.int8 is None and read.student == Fidelity(0.91, 0.004) and list(read.fidelity) == ["student"]
    skipped = Quality.from_attrs({"skipped": "the corpus holds 40 sentences"})
    assert skipped.skipped == "the corpus holds 40 sentences" and not skipped.fidelity and skipped.student is None
    assert skipped.to_attrs() == {"beats_baselines": False, "skipped": "the corpus holds 40 sentences"}
    assert Quality.from_attrs(None) is None  # fidelity not asked for


def test_the_teachers_int8_graph_and_its_plan_beside_the_student_are_typed_facts_stored_as_json():
    """The teacher's all-INT8 graph and its plan set beside a budget's student (nas.final._teacher) are stored as
    the nested JSON earlier versions wrote and read back as `TeacherInt8` and `FinalTeacher`: unset fields left
    out, a key this version does not know ignored."""
    from kdnas.nas.schema import Fidelity, FinalTeacher, Rival, TeacherInt8

    int8 = TeacherInt8(LatencyRecord(median_ms=8.9, p90_ms=9.1), Fidelity(0.991, 0.001), sentences=500)
    teacher = FinalTeacher(budget=None, budget_ms=9.61, plan={"label": "INT8, fp32: embeddings", "latency_ms": 9.6,
                                                              "fidelity": 0.994, "fp32_groups": ["embeddings"]},
                           fidelity=Fidelity(0.993, 0.001), student=Rival("5x12x384x1536", 0.949, "model.int8.onnx",
                                                                          dir="runs/demo/finalists/student-5x12x384x1536"),
                           shipped=True, budget_limit_ms=9.71, dir="runs/demo/best", graph="model.mixed.onnx",
                           latency_ms=9.58, latencies={"model.mixed.onnx": {"median_ms": 9.58}})
    study = optuna.create_study()
    record_fact(study, "teacher_int8", int8)
    record_fact(study, "final_teacher", [teacher])
    stored_dict = study.user_attrs["final_teacher"][0]
    assert stored_dict["student"] == {"arch": "5x12x384x1536", "rho": 0.949, "graph": "model.int8.onnx",
                                      "dir": "runs/demo/finalists/student-5x12x384x1536"}
    assert "budget" not in stored_dict and "params" not in stored_dict and stored_dict["fidelity"]["spearman"] == 0.993
    assert study.user_attrs["teacher_int8"] == {"latency": {"median_ms": 8.9, "p90_ms": 9.1},
                                                "fidelity": {"spearman": 0.991, "spearman_se": 0.001}, "sentences": 500}
    facts = StudyFacts.from_study(study)
    assert facts.teacher_int8 == int8 and facts.final_teacher == (teacher,)
    earlier = {**stored_dict, "budget": "0.5x", "a_later_field": 1, "student": {"arch": "2x12x384x1536", "rho": None}}
    read = FinalTeacher.from_attrs(earlier)
    assert (read.budget, read.student, read.shipped) == ("0.5x", Rival("2x12x384x1536"), True)


def test_a_final_stage_candidate_is_typed_and_a_scored_neighbour_is_stored_as_json():
    """The final stage's queue holds `Candidate`s: a trial's row as the trial table has it, or an FFN neighbour,
    whose score the study keeps (`final_neighbours`) as the JSON earlier versions wrote and reads back typed."""
    from kdnas.nas.schema import Candidate

    trial = Candidate.from_attrs({"number": 3, "arch": "3x12x384x1536", "layers": 3, "heads": 12, "hidden": 384,
                                  "ffn": 1536, "reward": 0.91, "latency_median_ms": 8.2, "status": "feasible"})
    assert (trial.arch, trial.reward, trial.scored_latency, trial.neighbour_of) == ("3x12x384x1536", 0.91, 8.2, None)
    neighbour = Candidate(number=3, arch="3x12x384x1280", layers=3, heads=12, hidden=384, ffn=1280, reward=0.9,
                          neighbour_of="3x12x384x1536", parent_latency_ms=8.2, proxy={"latency_ms": 7.6, "loss": 0.1},
                          recipe={"method": "embed"}, latency_read_ms=7.9, parent_read_ms=8.5, latency_scaled_by=0.9647)
    study = optuna.create_study()
    record_fact(study, "final_neighbours", [neighbour])
    stored_dict = study.user_attrs["final_neighbours"][0]
    assert stored_dict["proxy"] == {"latency_ms": 7.6, "loss": 0.1} and "latency_median_ms" not in stored_dict
    assert StudyFacts.from_study(study).final_neighbours == (neighbour,) and neighbour.scored_latency == 7.6
