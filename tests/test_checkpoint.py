"""A stopped run goes on from its last save as if it had never stopped (distill.checkpoint)."""

import dataclasses

import pytest
import torch

from kdnas.core.errors import InputError
from kdnas.distill import Checkpoints, DistillConfig, TeacherCache, distill, parse_arch


class Crash(Exception):
    pass


@pytest.fixture(scope="module")
def cache(teacher, small_data):
    return TeacherCache(teacher, small_data)


# 128 training rows in batches of 16: a pass is 8 updates, so 12 cross into a second pass; half the
# batches perturbed, so the RNG both orders the batches and perturbs them; hs trains projections too.
CONFIG = DistillConfig(method="hs", steps=12, batch_size=16, lr=1e-3, eval_every=3, augment=0.5, progress=False)


def _crash_at(step: int):
    def on_eval(at: int, _metrics: dict) -> None:
        if at == step:
            raise Crash(at)
    return on_eval


@pytest.mark.parametrize("every", [4, 5])  # the save at 8 ends a pass; the one at 5 is inside one
def test_a_run_stopped_and_started_again_ends_as_the_uninterrupted_run(teacher, small_data, cache, tmp_path, every):
    spec = parse_arch("1x4x64x128", **teacher.student_sizes())
    whole = distill(spec, teacher, small_data, CONFIG, cache=cache)
    saves = Checkpoints(tmp_path / "run.pt", every)
    with pytest.raises(Crash):
        distill(spec, teacher, small_data, CONFIG, cache=cache, checkpoints=saves, on_eval=_crash_at(9))
    seen = []
    again = distill(spec, teacher, small_data, CONFIG, cache=cache, checkpoints=saves,
                    on_eval=lambda step, _m: seen.append(step))
    last_save = 9 - 9 % every
    assert again.resumed_from == last_save and whole.resumed_from == 0
    assert seen == [s for s in (3, 6, 9, 12) if s > last_save]  # only the evaluations after the save run again
    assert again.history == whole.history and again.steps == whole.steps == 12
    assert again.tokens_per_second > 0 and again.seconds > 0
    for (name, a), b in zip(whole.student.state_dict().items(), again.student.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_finished_save_gives_the_run_back_without_training(teacher, small_data, cache, tmp_path, monkeypatch):
    spec = parse_arch("1x4x64x128", **teacher.student_sizes())
    saves = Checkpoints(tmp_path / "run.pt", 6)  # 12 is a multiple: the last update is saved
    first = distill(spec, teacher, small_data, CONFIG, cache=cache, checkpoints=saves)
    monkeypatch.setattr(teacher, "activations", lambda *a: pytest.fail("a finished run trained again"))
    again = distill(spec, teacher, small_data, CONFIG, cache=cache, checkpoints=saves)
    assert again.resumed_from == 12 and again.metrics == first.metrics and again.history == first.history
    assert all(torch.equal(a, b) for a, b in zip(first.student.parameters(), again.student.parameters()))


def test_a_save_of_another_run_is_refused_naming_what_differs(teacher, small_data, cache, tmp_path):
    spec = parse_arch("1x4x64x128", **teacher.student_sizes())
    saves = Checkpoints(tmp_path / "run.pt", 2)
    with pytest.raises(Crash):
        distill(spec, teacher, small_data, CONFIG, cache=cache, checkpoints=saves, on_eval=_crash_at(3))
    before = saves.path.read_bytes()
    with pytest.raises(InputError, match=r"run\.pt holds a run with config\.steps=12, this run has config\.steps=20"):
        distill(spec, teacher, small_data, dataclasses.replace(CONFIG, steps=20), cache=cache, checkpoints=saves)
    other = parse_arch("1x4x128x128", **teacher.student_sizes())
    with pytest.raises(InputError, match=r"arch=1x4x64x128, this run has arch=1x4x128x128"):
        distill(other, teacher, small_data, CONFIG, cache=cache, checkpoints=saves)
    assert saves.path.read_bytes() == before  # refused, nothing lost
    saves.path.write_bytes(b"not a save")
    with pytest.raises(InputError, match=r"is not a readable kdnas run state .*remove it"):
        distill(spec, teacher, small_data, CONFIG, cache=cache, checkpoints=saves)


@pytest.mark.parametrize("every", [0, -3, 1.5, True])
def test_a_bad_save_interval_is_refused(every, tmp_path):
    with pytest.raises(InputError, match=rf"save every {every!r} steps is invalid: must be a whole number >= 1"):
        Checkpoints(tmp_path / "run.pt", every)


def test_a_run_fitted_to_a_deadline_is_not_saved(teacher, small_data, cache, tmp_path):
    spec = parse_arch("1x4x64x128", **teacher.student_sizes())
    with pytest.raises(ValueError, match="fixed step count"):
        distill(spec, teacher, small_data, CONFIG, cache=cache, checkpoints=Checkpoints(tmp_path / "r.pt", 2),
                until=1e12)


def test_a_two_stage_recipe_takes_its_finished_first_stage_from_the_save(teacher, small_data, cache, tmp_path, capsys):
    from kdnas.distill import with_assistant

    spec = parse_arch("1x4x64x128", **teacher.student_sizes())
    config = dataclasses.replace(CONFIG, steps=4, eval_every=2, augment=0.0)
    whole = with_assistant(spec, teacher, small_data, config, cache=cache)
    calls = []

    def third_evaluation_stops(step: int, _metrics: dict) -> None:  # stage 2's first, after its save at step 1
        calls.append(step)
        if len(calls) == 3:
            raise Crash(step)

    saves = Checkpoints(tmp_path / "run.pt", 1)
    with pytest.raises(Crash):
        with_assistant(spec, teacher, small_data, config, cache=cache, checkpoints=saves,
                       on_eval=third_evaluation_stops)
    capsys.readouterr()
    again = with_assistant(spec, teacher, small_data, config, cache=cache, checkpoints=saves)
    said = capsys.readouterr().err
    assert "run-stage1.pt, saved after step 4 of 4" in said and "run-stage2.pt, saved after step 1 of 4" in said
    assert again.history == whole.history and again.metrics == whole.metrics
