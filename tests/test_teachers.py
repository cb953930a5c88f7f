import pytest
import torch

from kdnas.distill import Needs, load_teacher
from kdnas.distill.teachers import activations


def test_qkv_hooks_match_the_projection_modules(teacher, small_data):
    ids, mask = small_data.eval_ids[:2], small_data.eval_mask[:2]
    acts = teacher.activations(ids, mask, Needs(hidden=frozenset({0, 2}), qkv=frozenset({3})))
    layer = teacher.model.encoder.layer[2].attention.self
    h2 = acts.hidden[2]
    torch.testing.assert_close(acts.query[3], layer.query(h2))
    torch.testing.assert_close(acts.value[3], layer.value(h2))
    assert acts.hidden[0].shape == (2, 64, 384) and set(acts.hidden) == {0, 2}


def test_mpnet_adapter_reads_its_own_module_names(small_data):
    mpnet = load_teacher("mpnet-base")
    assert mpnet.dims.layers == 12 and mpnet.dims.hidden == 768
    ids, mask = small_data.eval_ids[:1, :16], small_data.eval_mask[:1, :16]
    acts = mpnet.activations(ids, mask, Needs(hidden=frozenset({12}), qkv=frozenset({12})))
    assert acts.key[12].shape == (1, 16, 768) and torch.isfinite(acts.hidden[12]).all()


def test_student_hooks_keep_gradients(teacher, small_data):
    from kdnas.distill import build_student, parse_arch

    student = build_student(parse_arch("2x4x64x128", **teacher.student_sizes()))
    acts = activations(student, small_data.eval_ids[:2], small_data.eval_mask[:2], Needs(qkv=frozenset({2})))
    acts.key[2].sum().backward()
    assert student.encoder.layer[1].attention.self.key.weight.grad is not None


def test_a_teacher_folder_without_weights_is_one_user_error(tmp_path):
    """A config and a tokenizer but no weights file: a traceback from transformers before."""
    import shutil

    import pytest

    from kdnas.core.assets import teacher_path
    from kdnas.core.errors import InputError

    folder = tmp_path / "no-weights"
    shutil.copytree(teacher_path("minilm-l6"), folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    with pytest.raises(InputError, match=r"its weights \(no model file in .*\) could not be loaded"):
        load_teacher(str(folder))


def _broken_teacher(tmp_path, damage):
    import shutil

    from kdnas.core.assets import teacher_path

    folder = tmp_path / "teacher"
    shutil.copytree(teacher_path("minilm-l6"), folder)
    damage(folder)
    return folder


def _truncated(folder):
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1_000_000])  # a download cut short


def _narrower_config(folder):
    import json

    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 192}))  # 12 heads of 16: valid alone


def _damaged_tokenizer(folder):
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "WordPiece", "vocab": ')


@pytest.mark.parametrize("damage, message", [
    (_truncated, r"its weights \(.*model.safetensors\) could not be loaded: .*incomplete metadata"),
    (_narrower_config, r"its weights \(.*model.safetensors\) do not match its config.json: \S+ \(.*384.*\) in the "
                       r"weights, \(.*192.*\) in config.json \(and \d+ more\)"),
    (_damaged_tokenizer, r"its tokenizer \(.*tokenizer.json.*\) does not load"),
])
def test_a_broken_teacher_folder_is_one_line_exit_2_nothing_written(tmp_path, capsys, damage, message):
    """A truncated model.safetensors (a broken download), a config.json whose hidden size does not match the
    weights, a tokenizer that does not load: one line naming the file and what is wrong, exit 2, no --out."""
    import re

    from kdnas.cli import main

    folder = _broken_teacher(tmp_path, damage)
    out = tmp_path / "search"
    assert main(["search", "--teacher", str(folder), "--out", str(out), "--trials", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert not out.exists()
