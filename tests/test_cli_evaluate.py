"""`kdnas evaluate` / `kdnas transfer` on the command line: teaching help, bad input -> one line, exit 2."""

from __future__ import annotations

import json
import shutil

import pytest

import kdnas.cli


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_help_teaches_tasks_protocol_and_examples(capsys):
    with pytest.raises(SystemExit) as exit_:
        kdnas.cli.main(["evaluate", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for text in ("sentiment", "10,202", "tweets", "% of teacher", "--train-size", "examples:", "label column"):
        assert text in out
    with pytest.raises(SystemExit):
        kdnas.cli.main(["transfer", "--help"])
    out = capsys.readouterr().out
    assert "logit-head" in out and "ce-all" in out and "SVD" in out


def test_a_mistyped_model_or_teacher_is_named_as_what_it_is(capsys, tmp_path, minilm_2l):
    typo = str(tmp_path / "runs" / "typo")
    assert kdnas.cli.main(["evaluate", typo, "--quiet"]) == 2
    assert _error_line(capsys).startswith(f"kdnas evaluate: error: model {typo!r} is neither a bundled name")
    assert kdnas.cli.main(["evaluate", minilm_2l, "--teacher", typo, "--quiet"]) == 2
    assert _error_line(capsys).startswith(f"kdnas evaluate: error: --teacher {typo!r} is neither a bundled name")


def test_unknown_task(capsys, minilm_2l):
    assert kdnas.cli.main(["evaluate", minilm_2l, "--teacher", "none", "--tasks", "glue-sst2", "--quiet"]) == 2
    line = _error_line(capsys)
    assert "glue-sst2" in line and "sentiment, topic, tweets" in line


def test_dataset_without_text_or_label_column(capsys, tmp_path, minilm_2l):
    path = tmp_path / "reviews.csv"
    path.write_text("review_body,stars\nnice,5\nbad,1\n")
    assert kdnas.cli.main(["evaluate", minilm_2l, "--tasks", str(path), "--quiet"]) == 2
    line = _error_line(capsys)
    assert "columns found: review_body, stars" in line


def test_one_class_only(capsys, tmp_path, minilm_2l):
    path = tmp_path / "one.jsonl"
    path.write_text("\n".join(json.dumps({"text": f"t {i}", "label": "spam"}) for i in range(10)))
    assert kdnas.cli.main(["evaluate", minilm_2l, "--tasks", str(path), "--quiet"]) == 2
    assert "only one class (spam)" in _error_line(capsys)


def test_student_folder_without_tokenizer(capsys, tmp_path, minilm_2l):
    bare = tmp_path / "student"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(f"{minilm_2l}/{name}", bare / name)
    assert kdnas.cli.main(["evaluate", str(bare), "--tasks", "topic", "--quiet"]) == 2
    line = _error_line(capsys)
    assert "has no tokenizer" in line and str(bare) in line


def test_bad_numbers_are_user_errors(capsys, minilm_2l):
    assert kdnas.cli.main(["evaluate", minilm_2l, "--seeds", "a,b", "--quiet"]) == 2
    assert "--seeds" in _error_line(capsys)
    assert kdnas.cli.main(["evaluate", minilm_2l, "--train-size", "lots", "--quiet"]) == 2
    assert "--train-size" in _error_line(capsys)
    assert kdnas.cli.main(["transfer", "--stage-steps", "1,2", "--out", "x", "--quiet"]) == 2
    assert "5 numbers" in _error_line(capsys)


def test_an_out_or_latency_setting_that_would_fail_late_is_refused_before_measuring(capsys, tmp_path, minilm_2l):
    (tmp_path / "a-file").write_text("mine")
    cases = [(["--out", str(tmp_path)], "is a folder; give the path of the JSON file"),
             (["--out", str(tmp_path / "a-file" / "eval.json")], "a-file is a file, not a folder"),
             (["--latency-seq", "0"], "--latency-seq 0 is invalid"),
             (["--latency-seq", "9999"], "--latency-seq 9999 exceeds"),
             (["--threads", "999"], "--threads 999 exceeds the")]
    for args, message in cases:  # each would have measured (minutes) before failing
        assert kdnas.cli.main(["evaluate", minilm_2l, "--tasks", "topic", "--quiet", *args]) == 2
        assert message in _error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"] and (tmp_path / "a-file").read_text() == "mine"


def test_evaluate_writes_json_and_table(capsys, tmp_path, minilm_2l, isolated_cache):
    out = tmp_path / "eval.json"
    code = kdnas.cli.main(["evaluate", minilm_2l, "--teacher", minilm_2l, "--tasks", "topic", "--seeds", "0",
                         "--train-size", "32", "--eval-size", "20", "--finetune-epochs", "1", "--max-len", "16",
                         "--finetune-lr", "2e-4", "--no-latency", "--quiet", "--out", str(out), "--measures", "finetune"])
    assert code == 0
    table = capsys.readouterr().out
    assert "topic acc (F1)" in table and "(teacher)" in table and "majority class" in table
    report = json.loads(out.read_text())
    assert [m["role"] for m in report["models"]] == ["teacher", "student"]
    assert report["models"][1]["percent_of_teacher"]["topic"] == pytest.approx(100.0)
    assert report["protocol"]["seeds"] == [0]
    assert report["protocol"]["lr"] == 2e-4 and report["protocol"]["epochs"] == 1


def test_a_flag_name_means_one_thing_across_commands():
    """`kdnas distill --lr` and `--batch-size` are the distillation's; fine-tuning in `kdnas evaluate` has its own
    names, and the search names each rate by its run (--proxy-lr, --final-lr)."""
    from kdnas.cli import build_parser
    from kdnas._reference import commands

    options = {name: {o for a in p._actions for o in a.option_strings} for name, p in commands(build_parser()).items()}
    assert {"--lr", "--batch-size"} <= options["distill"]
    assert not {"--lr", "--batch-size", "--epochs"} & (options["evaluate"] | options["search"])
    assert {"--finetune-lr", "--finetune-batch-size", "--finetune-epochs"} <= options["evaluate"]


def test_latency_beside_the_teacher_is_a_ratio_timed_side_by_side(capsys, tmp_path, minilm_2l, isolated_cache):
    out = tmp_path / "eval.json"
    assert kdnas.cli.main(["evaluate", minilm_2l, "--tasks", "topic", "--measures", "probe", "--draws", "2",
                           "--max-len", "16", "--latency-seq", "32", "--quiet", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "× teacher" in table and "the two timed in alternation in one process" in table
    teacher, student = json.loads(out.read_text())["models"]
    assert "latency_beside_teacher" not in teacher
    beside = student["latency_beside_teacher"]
    assert 0.15 < beside["ratio"] < 0.8 and beside["rounds"] > 1  # two of the teacher's six layers
    assert beside["quartiles"][0] <= beside["ratio"] <= beside["quartiles"][1]
    assert student["speedup"] == pytest.approx(1 / beside["ratio"])


def test_card_puts_the_table_into_the_student_s_model_card_and_a_rerun_replaces_it(capsys, tmp_path, minilm_2l,
                                                                                   isolated_cache):
    from kdnas.evaluation.card import END, START

    student = tmp_path / "student"
    shutil.copytree(minilm_2l, student)
    (student / "README.md").write_text("# my student\n\nWhat the search wrote.\n")
    common = [str(student), "--teacher", minilm_2l, "--tasks", "topic", "--max-len", "16", "--no-latency", "--quiet",
              "--card"]
    assert kdnas.cli.main(["evaluate", *common, "--measures", "probe", "--draws", "2"]) == 0
    assert f"the table is in {student / 'README.md'}" in capsys.readouterr().err
    card = (student / "README.md").read_text()
    assert card.startswith("# my student\n\nWhat the search wrote.\n\n" + START)
    assert "| model | params | latency ms | topic probe | topic 16-shot | probe gain kept |" in card
    assert f"| **{student}** (this model) |" in card and f"| {minilm_2l} (teacher) |" in card
    assert f"`kdnas evaluate {student} --teacher {minilm_2l}" in card and card.rstrip().endswith(END)
    report = json.loads((student / "evaluate.json").read_text())  # the whole report beside it
    assert [m["role"] for m in report["models"]] == ["teacher", "student"] and "standard_errors" in report["models"][1]
    # a second run replaces its section, and only it
    assert kdnas.cli.main(["evaluate", *common, "--measures", "finetune", "--seeds", "0", "--train-size", "32",
                           "--eval-size", "20", "--finetune-epochs", "1"]) == 0
    card = (student / "README.md").read_text()
    assert card.count(START) == card.count(END) == 1 and card.count("What the search wrote.") == 1
    assert "topic acc (F1)" in card and "topic probe" not in card


def test_card_without_a_student_folder_is_refused_before_any_work(capsys):
    assert kdnas.cli.main(["evaluate", "minilm-l6", "--card", "--quiet"]) == 2
    line = _error_line(capsys)
    assert "--card" in line and "no MODEL is a folder (minilm-l6)" in line


def test_a_card_section_replaces_only_itself(tmp_path):
    from kdnas.evaluation.card import END, START, write_card

    report = {"protocol": {"measures": []}, "tasks": {}, "models": [
        {"model": "s", "path": "/nowhere/s", "role": "student", "parameters": 1e6, "latency_ms": None}]}
    card = tmp_path / "README.md"
    # a start marker whose end an edit removed, the user's text after it, then a whole section
    card.write_text(f"# card\n\n{START}\nmine\n\n{START}\nold table\n{END}\n\nafter\n")
    write_card(tmp_path, report, "kdnas evaluate s --card", machine="a CPU")
    text = card.read_text()
    assert text.startswith(f"# card\n\n{START}\nmine\n\n{START}\n## Measured with `kdnas evaluate`")
    assert "old table" not in text and text.endswith(f"{END}\n\nafter\n") and text.count(END) == 1
