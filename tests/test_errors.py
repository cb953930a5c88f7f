"""The error hierarchy: each kind of failure has its class, all of them are `KdnasError` (one line,
exit 2 in the CLI), and bad input is also a `ValueError`."""

from __future__ import annotations

import pytest

import kdnas.latency._profile as latency_profile
from kdnas.core.errors import (AssetError, InputError, KdnasError, LatencyError, ParityError, StorageError, TrainingError,
                         check_choice, first_line)
from kdnas.core.spec import parse_arch
from kdnas.nas.storage import read_pointer


def test_every_kind_is_a_kdnas_error_and_bad_input_is_a_value_error():
    for kind in (InputError, AssetError, ParityError, LatencyError, StorageError, TrainingError):
        assert issubclass(kind, KdnasError)
    assert issubclass(InputError, ValueError) and not issubclass(ParityError, InputError)


def test_a_bad_shape_is_input_and_a_missing_search_is_storage(tmp_path):
    with pytest.raises(InputError, match="7x"):
        parse_arch("7xbanana")
    with pytest.raises(StorageError, match="holds no search"):
        read_pointer(tmp_path)
    for text, kind in (("{not json", "JSONDecodeError"), ("{}", "KeyError")):  # edited by hand
        (tmp_path / "search.json").write_text(text)
        with pytest.raises(StorageError, match=f"search.json is not a search pointer \\({kind}"):
            read_pointer(tmp_path)


def test_a_crashed_latency_worker_is_a_latency_error_with_its_last_line(monkeypatch):
    class Crashed:
        returncode, stdout = 1, ""
        stderr = "Traceback (most recent call last):\n  File x\nMemoryError: out of memory\n"

    monkeypatch.setattr(latency_profile.subprocess, "run", lambda *a, **k: Crashed())
    with pytest.raises(LatencyError, match=r"exit 1\): MemoryError: out of memory$"):
        latency_profile._run_worker({}, 1, 5.0)


def test_first_line_of_an_empty_message_is_the_type_name():
    assert first_line(ValueError("")) == "ValueError" and first_line(ValueError("a\nb")) == "a"


def test_a_value_outside_its_choices_is_named_with_what_is_allowed():
    check_choice("precision", "bf16", ("auto", "bf16", "fp32"))  # allowed: nothing raised
    with pytest.raises(InputError, match=r"^precision 'half' is invalid: allowed auto, bf16, fp32$"):
        check_choice("precision", "half", ("auto", "bf16", "fp32"))
    with pytest.raises(InputError, match=r"^heads 5 is invalid: allowed 1, 2, 4$"):
        check_choice("heads", 5, (1, 2, 4))
