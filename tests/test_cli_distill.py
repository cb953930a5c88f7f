"""`kdnas distill` end to end through the real console entry point, and its bad-input contract."""

import json
import subprocess
import sys

import numpy as np
import pytest


def kdnas(*args, env_cache):
    import os

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "KDNAS_CACHE": str(env_cache)}
    return subprocess.run([sys.executable, "-m", "kdnas.cli", *args], capture_output=True, text=True, env=env, timeout=600)


def test_distill_writes_a_loadable_student_and_losses(tmp_path):
    out = tmp_path / "student"
    run = kdnas("distill", "--arch", "2x4x64x128", "--method", "hs", "--steps", "4", "--batch-size", "8",
                "--train-size", "32", "--eval-size", "8", "--out", str(out), "--json", "--quiet", env_cache=tmp_path)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["arch"] == "2x4x64x128" and summary["metrics"]["l_hs_norm"] > 0
    saved = json.loads((out / "distill.json").read_text())
    assert saved["metrics"] == summary["metrics"] and saved["teacher"] == "minilm-l6"
    from transformers import AutoModel

    model = AutoModel.from_pretrained(out)
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert list((tmp_path / "targets").iterdir()), "teacher targets were cached on disk"
    # a drop-in for its sentence-transformers teacher: the same pooling and normalization, not the plain
    # mean pooling sentence-transformers gives a folder without modules.json
    from sentence_transformers import SentenceTransformer

    student = SentenceTransformer(str(out), device="cpu")
    assert [type(m).__name__ for m in student] == ["Transformer", "Pooling", "Normalize"]
    assert student.max_seq_length == 256 and student.get_sentence_embedding_dimension() == 64
    norms = np.linalg.norm(student.encode(["A sentence to embed.", "And another one."]), axis=1)
    assert np.allclose(norms, 1.0, atol=1e-5), norms


def in_process(capsys, *args) -> tuple[int, str]:
    """Exit code and stderr of `kdnas ARGS`, run in this process through the same `main` the console
    script calls (the script itself runs as a subprocess in the tests around): a fresh interpreter
    per bad-input case would add about 5 s each."""
    import kdnas.cli

    try:
        code = kdnas.cli.main(list(args))
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--arch", "4x5x192x768"], "hidden=192 is not divisible by heads=5"),
    (["--arch", "four-layers"], "is not of the form LAYERSxHEADSxHIDDENxFFN"),
    (["--teacher", "no-such-teacher"], "teacher 'no-such-teacher' is neither a bundled name"),
    (["--corpus", "/no/such/corpus.txt"], "corpus '/no/such/corpus.txt' is neither a bundled name"),
    (["--method", "od"], "OD needs a teacher with a trained masked-LM head"),
    (["--method", "magic"], "method 'magic' is invalid: allowed hs, minilmv2"),
    (["--method", "minilm", "--arch", "2x4x64x128"], "needs equal attention heads"),
    (["--steps", "0"], "--steps 0 is invalid"),
    (["--augment", "2"], "augment 2.0 is invalid: the share of batches perturbed, 0 <= augment <= 1"),
    (["--augment-words", "vocab"], "--augment-words: invalid choice: 'vocab' (choose from 'batch', 'neighbours')"),
    (["--method", "hs", "--relation-heads", "4"], "does not apply to method 'hs'"),
    (["--save-every", "-1"], "--save-every -1 is invalid: must be >= 0"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.setenv("KDNAS_CACHE", str(tmp_path))
    code, stderr = in_process(capsys, "distill", *args, "--out", str(tmp_path / "o"), "--quiet")
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert message in lines[0]
    assert not (tmp_path / "o").exists()


def test_out_below_a_file_is_refused_before_any_training(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KDNAS_CACHE", str(tmp_path))
    (tmp_path / "a-file").write_text("mine")
    code, stderr = in_process(capsys, "distill", "--out", str(tmp_path / "a-file" / "sub"), "--quiet")
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert "a-file is a file, not a folder" in stderr and (tmp_path / "a-file").read_text() == "mine"


def test_out_that_holds_other_files_is_refused(tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "precious.txt").write_text("keep me")
    run = kdnas("distill", "--out", str(tmp_path / "o"), "--quiet", env_cache=tmp_path)
    assert run.returncode == 2 and "is not an earlier kdnas student" in run.stderr
    assert (tmp_path / "o" / "precious.txt").read_text() == "keep me"


def test_help_explains_methods_and_options():
    run = kdnas("distill", "--help", env_cache="/tmp")
    assert run.returncode == 0
    for word in ("minilmv2", "--layer-map", "uniform+last", "--assistant", "--cache-dir", "AutoModel.from_pretrained"):
        assert word in run.stdout


@pytest.mark.parametrize("args, message", [
    (("search", "--final-train", "abc"), "argument --final-train: invalid int value: 'abc'"),
    (("profile", "4x12x192x768", "--batch", "1.5"), "argument --batch: invalid int value: '1.5'"),
    (("distill", "--out", "unused", "--no-such-option"), "unrecognized arguments: --no-such-option"),
    (("distill",), "the following arguments are required: --out"),
    (("frobnicate",), "invalid choice: 'frobnicate'"),
])
def test_argparse_errors_are_one_line_too(args, message, capsys):
    """A mistyped value or option gets the same one-line error as every other user error, not the usage."""
    from kdnas.cli import main

    with pytest.raises(SystemExit) as exited:
        main(list(args))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "usage:" not in err, err


@pytest.mark.parametrize("arch, words", [
    ("8x12x384x1536", "student layers=8 exceeds the teacher's 6"),
    ("2x12x768x1536", "student hidden=768 exceeds the teacher's 384"),
])
def test_init_inherit_with_a_student_larger_than_the_teacher_is_one_line_exit_2(tmp_path, monkeypatch, capsys,
                                                                              arch, words):
    monkeypatch.setenv("KDNAS_CACHE", str(tmp_path))
    code, stderr = in_process(capsys, "distill", "--arch", arch, "--init", "inherit", "--out", str(tmp_path / "o"),
                              "--quiet")
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert words in stderr and "--init svd" in stderr
    assert not (tmp_path / "o").exists() and not (tmp_path / "targets").exists()


def test_first_line_of_an_error_never_fails():
    from kdnas.core.errors import first_line

    assert first_line(ValueError("bad value\nmore detail")) == "bad value"
    assert first_line(ValueError("")) == "ValueError"  # an empty message once raised IndexError
    assert first_line(RuntimeError("  \n  second")) == "second"


def test_a_stopped_run_goes_on_from_its_save_when_the_command_runs_again(tmp_path, monkeypatch, capsys):
    from kdnas.distill import trainer

    monkeypatch.setenv("KDNAS_CACHE", str(tmp_path))
    small = ["--arch", "1x4x64x128", "--method", "hs", "--steps", "6", "--batch-size", "8", "--train-size", "32",
             "--eval-size", "8", "--quiet"]
    assert in_process(capsys, "distill", *small, "--out", str(tmp_path / "whole"))[0] == 0
    evaluate = trainer._Loop.evaluate

    def stop_at_the_end(self, step, running, last):
        if last:
            raise KeyboardInterrupt  # the job killed after its save at step 3
        return evaluate(self, step, running, last)

    monkeypatch.setattr(trainer._Loop, "evaluate", stop_at_the_end)
    out = tmp_path / "stopped"
    assert in_process(capsys, "distill", *small, "--save-every", "3", "--out", str(out)) == (130, "kdnas distill: interrupted\n")
    assert [p.name for p in out.iterdir()] == ["checkpoint.pt"]
    monkeypatch.setattr(trainer._Loop, "evaluate", evaluate)
    code, stderr = in_process(capsys, "distill", *small, "--steps", "8", "--save-every", "3", "--out", str(out))
    assert code == 2 and "holds a run with config.steps=6, this run has config.steps=8" in stderr
    assert [p.name for p in out.iterdir()] == ["checkpoint.pt"]  # refused, the save kept
    code, stderr = in_process(capsys, "distill", *small, "--save-every", "3", "--out", str(out))
    assert code == 0 and f"going on from {out / 'checkpoint.pt'}, saved after step 3 of 6" in stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (tmp_path / "whole").iterdir())
    resumed, whole = (json.loads((tmp_path / d / "distill.json").read_text()) for d in ("stopped", "whole"))
    assert resumed["resumed_from"] == 3 and whole["resumed_from"] == 0
    assert resumed["metrics"] == whole["metrics"] and resumed["history"] == whole["history"]
