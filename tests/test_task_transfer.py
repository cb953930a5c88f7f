"""XtremeDistil task transfer: the five stages freeze what they should; the recipe runs end to end."""

from __future__ import annotations


import pytest
import torch

from kdnas.distill.data import pad_rows
from kdnas.evaluation.finetune import Classifier, FinetuneConfig
from kdnas.evaluation.models import encode
from kdnas.distill.losses import od_loss
from kdnas.core.spec import parse_arch
from kdnas.evaluation.task_transfer import STAGES, StageBudget, TransferConfig, logit_loss, run_stage, set_trainable, task_transfer
from kdnas.evaluation.tasks import load_task
from kdnas.core.errors import KdnasError

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def topic():
    return load_task("topic")


def _student(teacher):
    from transformers import BertModel

    spec = parse_arch("2x12x48x96", **teacher.student_sizes())
    torch.manual_seed(0)
    return Classifier(BertModel(spec.to_config()), num_labels=5)


def _snapshot(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("stage", STAGES[1:], ids=lambda s: s.name)
def test_task_stages_train_only_what_they_unfreeze(stage, teacher, topic):
    student = _student(teacher)
    texts, labels = topic.train.texts[:16], torch.tensor(topic.train.labels[:16])
    rows = encode(teacher.tokenizer, texts, 32)
    targets = torch.randn(16, 5) if stage.loss == "logit" else labels
    before = _snapshot(student)
    grads = {}

    def loss_fn(logits, y):
        loss = logit_loss("mse", 1.0)(logits, y) if stage.loss == "logit" else torch.nn.functional.cross_entropy(logits, y)
        return loss

    # One step; capture the gradients the optimiser saw through a hook on the loss function's result.
    def batches(index):
        ids, mask = pad_rows([rows[i] for i in index], 0)
        return ids, mask, targets[index]

    config = TransferConfig(batch_size=8, progress=False)
    original_step = torch.optim.AdamW.step

    def spy(self, *args, **kwargs):
        for name, p in student.named_parameters():
            grads[name] = None if p.grad is None else p.grad.abs().sum().item()
        return original_step(self, *args, **kwargs)

    torch.optim.AdamW.step = spy
    try:
        run_stage(student, stage, batches, 16, StageBudget(1, 1e-2), config=config, loss_fn=loss_fn)
    finally:
        torch.optim.AdamW.step = original_step

    head = {n for n in grads if n.startswith("head.")}
    word = "encoder.embeddings.word_embeddings.weight"
    layers = {n for n in grads if n.startswith("encoder.encoder.layer.")}
    for name in head:
        assert grads[name], f"{stage.name}: head {name} got no gradient"
        assert not torch.equal(before[name], student.state_dict()[name])
    for name in layers:
        if stage.trains == "head":
            assert grads[name] is None, f"{stage.name}: frozen {name} got a gradient"
            assert torch.equal(before[name], dict(student.named_parameters())[name].detach())
        else:
            assert grads[name], f"{stage.name}: {name} should learn"
    assert grads[word] is None and torch.equal(before[word], dict(student.named_parameters())[word].detach())


def test_representation_stage_trains_encoder_and_projection_not_head(teacher):
    from kdnas.distill.methods import build_method
    from kdnas.distill.teachers import activations, model_dims

    student = _student(teacher)
    method = build_method("xtremedistil", teacher.dims, model_dims(student.encoder))
    set_trainable(student, STAGES[0], method.projection)
    assert all(p.requires_grad for p in student.encoder.parameters())
    assert not any(p.requires_grad for p in student.head.parameters())
    enc = teacher.tokenizer(["The markets fell sharply on Monday."] * 2, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    t_acts = teacher.activations(ids, mask, method.teacher_needs())
    s_acts = activations(student.encoder, ids, mask, method.student_needs())
    method(s_acts, t_acts, mask).backward()
    assert all(p.grad is None for p in student.head.parameters())
    assert student.encoder.embeddings.word_embeddings.weight.grad is not None
    assert student.encoder.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
    assert method.projection.weight.grad.abs().sum() > 0


def test_logit_losses():
    s, t = torch.tensor([[1.0, 2.0], [0.0, 0.0]]), torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert logit_loss("mse", 1.0)(s, t).item() == pytest.approx(0.5 * (4 + 2) / 2)
    assert logit_loss("od", 3.0)(s, t).item() == pytest.approx(od_loss(s, t, 3.0).item())
    assert logit_loss("od", 3.0)(t, t).item() == pytest.approx(0.0, abs=1e-6)


def test_config_rejects_bad_values():
    with pytest.raises(KdnasError, match="logit loss"):
        TransferConfig(logit_loss="kl")
    with pytest.raises(KdnasError, match="LAYERSxHEADSxHIDDENxFFN"):
        TransferConfig(arch="4x192")
    with pytest.raises(KdnasError, match="labeled size 0 is invalid"):
        TransferConfig(labeled_size=0)
    with pytest.raises(KdnasError, match="sequence length 0 is invalid: allowed 8..512"):
        TransferConfig(seq_len=0)


def test_cli_refuses_before_the_teacher_is_fine_tuned(tmp_path, capsys, monkeypatch):
    """Each of these was found only after the teacher's fine-tuning (minutes), or not at all."""
    import importlib

    import kdnas.cli

    module = importlib.import_module("kdnas.evaluation.task_transfer")  # the package's name is also the function's

    monkeypatch.setattr(module, "_finetuned_teacher", lambda *a, **k: pytest.fail("the teacher was fine-tuned"))
    (tmp_path / "a-file").write_text("")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text("{}")
    cases = [(["--arch", "4x8x192x768"], "needs equal attention heads"),
             (["--out", str(tmp_path / "a-file" / "sub")], "a-file is a file, not a folder"),
             (["--out", str(tmp_path / "mine")], "is not an earlier kdnas transfer result"),
             (["--labeled-size", "0"], "labeled size 0 is invalid")]
    for args, message in cases:
        argv = ["transfer", "--out", str(tmp_path / "new"), "--quiet", *args]
        assert kdnas.cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert (tmp_path / "mine" / "config.json").read_text() == "{}" and not (tmp_path / "new").exists()


def test_task_transfer_end_to_end(minilm_2l, topic, tmp_path, shared_modes):
    """All five stages on real data with a real (2-layer MiniLM) teacher; the saved student loads."""
    from transformers import AutoModel

    tiny = FinetuneConfig(lr=2e-4, batch_size=16, epochs=2, max_len=32, eval_size=100, seeds=(0,), progress=False)
    config = TransferConfig(
        arch="2x12x96x192", transfer_size=128, labeled_size=160, seq_len=32, batch_size=16,
        representation=StageBudget(20, 1e-3), logit_head=StageBudget(10, 1e-3), logit_all=StageBudget(10, 2e-4),
        ce_head=StageBudget(10, 1e-3), ce_all=StageBudget(15, 2e-4), teacher_finetune=tiny, progress=False,
        device="cpu",
    )
    result = task_transfer(minilm_2l, topic, config)
    names = [s["stage"] for s in result.stages]
    assert names == ["teacher-finetune", *(s.name for s in STAGES)]
    majority = topic.test.subsample(100, seed=0).majority_accuracy()
    assert result.teacher_source["accuracy"] > majority + 0.2
    assert result.student_source["accuracy"] > majority  # the student learned the source task
    out = result.save(tmp_path / "xd")
    loaded = AutoModel.from_pretrained(out)
    assert loaded.config.num_hidden_layers == 2 and (out / "tokenizer.json").exists()
    assert (out / "transfer.json").exists() and (out / "task_head.pt").exists()
    mask = shared_modes.umask()  # readable as any file the user makes, the weights too (core.files)
    assert shared_modes(out) == {"folders": 0o777 & ~mask, "files": 0o666 & ~mask}
