"""benchmarks/search_vs_rule.py: which student it compares with the rule's, and when it trains one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import search_vs_rule  # noqa: E402

SPACE = {"layers": [1, 2, 3, 4, 5, 6], "heads": [3, 6, 9, 12], "hidden": [96, 192, 288, 384],
         "ffn": [256, 512, 768, 1024, 1280, 1536], "head_size": 32}


def _record(arch: str, ms: float, rho: float) -> dict:
    return {"arch": arch, "params": 1, "steps": 2400, "train_rows": 15360, "dir": f"runs/{arch}", "within_budget": True,
            "latency_ms": ms, "latency_int8_onnx": {"median_ms": ms / 2},
            "quality": {"fidelity": {"student": {"spearman": rho, "spearman_se": 0.01, "mean_cosine": 0.9},
                                     "inherited (untrained)": {"spearman": 0.5}},
                        "int8": {"spearman": rho - 0.01}}}


def _summary(finals: dict[str, dict | None]) -> dict:
    teacher_ms = 16.0
    return {"settings": {"space": SPACE}, "teacher_latency": {"median_ms": teacher_ms}, "budget_ms": 8.0,
            "budgets": [{"label": label, "budget_ms": teacher_ms * float(label[:-1]), "folder": f"best-{label}",
                         "final": [] if rec is None else [rec]} for label, rec in finals.items()]}


def test_each_budget_gets_its_ratio_its_rule_shape_and_its_shipped_students_row():
    summary = _summary({"0.5x": _record("3x12x384x1536", 7.6, 0.91), "0.25x": _record("2x9x288x1024", 3.9, 0.85)})
    budgets = search_vs_rule.budgets_of(summary)
    assert [(b["label"], b["ratio"]) for b in budgets] == [("0.5x", 0.5), ("0.25x", 0.25)]
    rules = [search_vs_rule.rule_arch(summary, 6, b["ratio"]) for b in budgets]
    assert [search_vs_rule.arch_of(r, 32) for r in rules] == ["3x12x384x1536", "1x12x384x1536"]
    row = search_vs_rule.student_row(budgets[0]["final"], summary, budgets[0]["budget_ms"])
    assert row["budget_used"] == 7.6 / 8.0 and row["int8_of_teacher"] == 3.8 / 16.0
    assert row["spearman"] == 0.91 and row["int8_spearman"] == 0.90 and row["baselines"] == {"inherited (untrained)": 0.5}


def test_the_rule_is_trained_only_where_the_search_shipped_another_shape(tmp_path, monkeypatch):
    summary = _summary({"0.5x": _record("3x12x384x1536", 7.6, 0.91), "0.25x": _record("2x9x288x1024", 3.9, 0.85),
                        "0.125x": None})
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    trained = []

    def rule_run(teacher, budget, shape, head_size, steps, work, extra):
        arch = search_vs_rule.arch_of(shape, head_size)
        trained.append((budget["label"], arch, steps))
        return {"arch": arch, "over_budget": False, "student": {"arch": arch}}

    monkeypatch.setattr(search_vs_rule, "_rule_run", rule_run)
    rows = search_vs_rule.compare("minilm-l6", tmp_path, 6, tmp_path / "work", [])
    assert rows[0]["rule"] == {"attempts": [], "same_as_search": True, "student": rows[0]["search"]}
    assert trained == [("0.25x", "1x12x384x1536", 2400)]  # the shipped student's steps, the rule's one shape
    assert rows[1]["rule"]["student"] == {"arch": "1x12x384x1536"} and not rows[1]["rule"]["same_as_search"]
    assert rows[2]["search"] is None and rows[2]["rule"] is None  # nothing shipped: nothing to set beside


def test_a_rule_shape_over_the_budget_gives_way_to_the_next_shallower_down_to_the_searchs_own(tmp_path, monkeypatch):
    summary = _summary({"0.5x": _record("2x12x384x1536", 7.6, 0.91)})
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    tried = []

    def rule_run(teacher, budget, shape, head_size, steps, work, extra):
        tried.append(search_vs_rule.arch_of(shape, head_size))
        return {"arch": tried[-1], "over_budget": True, "student": None}  # every shape the rule tries reads over

    monkeypatch.setattr(search_vs_rule, "_rule_run", rule_run)
    (row,) = search_vs_rule.compare("minilm-l6", tmp_path, 6, tmp_path / "work", [])
    assert tried == ["3x12x384x1536"]  # then 2 layers: the search's own student, known to fit
    assert row["rule"]["same_as_search"] and row["rule"]["student"] == row["search"]


def test_the_benchmarks_budget_flags_are_checked_before_any_work():
    import argparse

    import base_teacher
    import pytest
    from _env import kdnas, ratio_list

    assert ratio_list("0.5,0.25") == [0.5, 0.25]
    assert base_teacher.budget_sets("minilm,0.5+0.25") == ["minilm", "0.5+0.25"]
    for check, bad in [(ratio_list, "0.5,abc"), (ratio_list, "0"), (ratio_list, "1.5"),
                       (base_teacher.budget_sets, "0.5+abc"), (base_teacher.budget_sets, "minilm,0.5+0"),
                       (base_teacher.budget_sets, "mini")]:
        with pytest.raises(argparse.ArgumentTypeError, match=repr(bad).replace("+", r"\+")):
            check(bad)
    assert kdnas(["kdnas", "search", "--trials", "1"])[1:] == ["-m", "kdnas", "search", "--trials", "1"]


def test_a_searchs_record_keeps_the_free_alternative_it_measured(tmp_path):
    summary = {**_summary({"0.5x": _record("3x12x384x1536", 7.6, 0.91)}), "counts": {"feasible": 9},
               "trials_table": [{}] * 10, "teacher_int8": {"latency": {"median_ms": 8.0}, "fidelity": {"spearman": 0.99}}}
    summary["settings"].update(teacher="minilm-l6", budget_ratio=[0.5])
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    record = search_vs_rule.search_record(tmp_path)
    assert record["teacher_int8"] == {"ms": 8.0, "of_teacher": 0.5, "spearman": 0.99}
    assert record["trials"] == 10 and record["settings"]["budget_ratio"] == [0.5]


def test_a_rule_run_that_ships_nothing_within_the_budget_counts_as_over_it(tmp_path, monkeypatch):
    refusal = "kdnas search: error: no finalist fits the budget of 5.44 ms as shipped (3x12x384x1536 5.50 ms)"
    monkeypatch.setattr(search_vs_rule, "run", lambda command: (2, 1.0, refusal))
    budget = {"label": "0.5x", "ratio": 0.5, "budget_ms": 5.44}
    shape = {"layers": 3, "heads": 12, "hidden": 384, "ffn": 1536}
    attempt = search_vs_rule._rule_run("minilm-l6", budget, shape, 32, 2000, tmp_path, [])
    assert attempt["over_budget"] and attempt["student"] is None and attempt["message"] == refusal


def test_the_docs_table_sets_each_budgets_students_side_by_side_with_the_free_alternative():
    summary = _summary({"0.5x": _record("3x12x384x1280", 7.6, 0.91)})
    searched = search_vs_rule.student_row(summary["budgets"][0]["final"][0], summary, 8.0)
    rule = {**searched, "arch": "2x12x384x1536", "spearman": 0.88, "dir": "runs/rule"}
    entry = {"budgets": [{"label": "0.5x", "ratio": 0.5, "budget_ms": 8.0, "search": searched,
                          "rule": {"attempts": [], "same_as_search": False, "student": rule}}],
             "search_runs": [{"teacher_int8": {"ms": 8.0, "of_teacher": 0.5, "spearman": 0.99}}],
             "quality": {"tasks": {"topic": {}}, "models": [{"model": "runs/rule", "probes": {"topic": {"full": 0.9}}}]}}
    lines = search_vs_rule.table(entry).splitlines()
    assert lines[2].startswith("| 0.5x (8.00 ms) | search | 3x12x384x1280 | 2,400 | 0.910 ± 0.010 | 0.900 | 0.475 / 0.237 | - |")
    assert lines[3] == "|  | rule | 2x12x384x1536 | 2,400 | 0.880 ± 0.010 | 0.900 | 0.475 / 0.237 | 90.0 |"
    assert "0.500" in lines[5] and "0.990" in lines[5]  # the teacher's own INT8 graph
