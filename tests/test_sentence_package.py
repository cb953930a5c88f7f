"""A finished student is a sentence-transformers drop-in: its module files follow the teacher, its
ONNX `sentence_embedding` equals `SentenceTransformer(folder).encode`, and it carries a model card."""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from kdnas.core.assets import teacher_path  # noqa: E402
from kdnas.core.errors import KdnasError  # noqa: E402
from kdnas.core.spec import StudentSpec, build_student  # noqa: E402
from kdnas.export import SentencePipeline, export_model, read_sentence_pipeline, write_sentence_transformers  # noqa: E402
from kdnas.nas._progress import Progress  # noqa: E402
from kdnas.nas.records import StudySummary  # noqa: E402
from kdnas.nas.schema import Candidate, Fidelity, FinalRecord, LatencyRecord, Quality, StudyFacts, stored  # noqa: E402

SENTENCES = [
    "Stocks fell.",
    "The central bank left interest rates unchanged on Thursday.",
    "Is it raining in Berlin?",
    # Longer than any max_seq_length below: encode and the ONNX input must truncate alike.
    " ".join(["After weeks of negotiations, lawmakers agreed on a budget for schools and roads."] * 30),
]
# Hidden 64, not the teacher's 384: the pooling dimension must come from the student.
TINY = StudentSpec(layers=2, heads=4, hidden=64, ffn=128, max_position=128)


def _ship(model, tokenizer, dest: Path, teacher_dir) -> dict:
    """What run_final does: export with the teacher's pipeline, save weights, write the module files."""
    pipe = read_sentence_pipeline(teacher_dir)
    export_model(model, dest, tokenizer=tokenizer, pooling=pipe.pooling, normalize=pipe.normalize)
    model.save_pretrained(dest)
    return write_sentence_transformers(dest, teacher_dir, hidden_size=int(model.config.hidden_size))


def _onnx_embeddings(folder: Path, max_length: int) -> np.ndarray:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    batch = tok(SENTENCES, padding=True, truncation=True, max_length=max_length, return_tensors="np")
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    feeds = {n: batch[n].astype(np.int64) if n in batch else np.zeros_like(batch["input_ids"]) for n in names}
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    return outputs["sentence_embedding"]


def _st_embeddings(folder: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    return model.encode(SENTENCES, convert_to_numpy=True, batch_size=2)


def _fake_teacher(folder: Path, *, pooling_key: str, normalize: bool, max_seq_length: int) -> Path:
    """A sentence-transformers teacher folder's module files (the student only reads those)."""
    folder.mkdir()
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 999, pooling_key: True}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    return folder


@pytest.fixture(scope="module")
def minilm_student(minilm_2l, tmp_path_factory):
    """The 2-layer MiniLM shipped with the real MiniLM teacher's pipeline (mean pooling, Normalize)."""
    from transformers import AutoModel, AutoTokenizer

    dest = tmp_path_factory.mktemp("st") / "best"
    model = AutoModel.from_pretrained(minilm_2l)
    facts = _ship(model, AutoTokenizer.from_pretrained(minilm_2l), dest, teacher_path("minilm-l6"))
    return dest, facts


def test_sentence_transformers_encode_equals_onnx_sentence_embedding(minilm_student):
    dest, facts = minilm_student
    assert facts["max_seq_length"] == 256  # the teacher's, within the student's 512 positions
    st = _st_embeddings(dest)
    onnx = _onnx_embeddings(dest, facts["max_seq_length"])
    assert st.shape == onnx.shape == (len(SENTENCES), 384)
    assert np.abs(st - onnx).max() <= 1e-4
    # The teacher normalizes, so both are unit vectors (a plain mean-pooled export is not).
    np.testing.assert_allclose(np.linalg.norm(onnx, axis=1), 1.0, atol=1e-5)
    manifest = json.loads((dest / "export.json").read_text())
    assert manifest["normalize"] is True and manifest["pooling"] == "mean"


def test_module_files_follow_the_teacher_and_the_students_size(minilm_student):
    dest, facts = minilm_student
    modules = json.loads((dest / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    assert (dest / "2_Normalize").is_dir() and facts["normalize"] is True
    # the facts written read back as the teacher's pipeline (its 256 tokens fit the student's positions)
    assert SentencePipeline.from_dict(facts) == read_sentence_pipeline(teacher_path("minilm-l6"))
    pooling = json.loads((dest / "1_Pooling" / "config.json").read_text())
    assert pooling["word_embedding_dimension"] == 384 and pooling["pooling_mode_mean_tokens"] is True
    assert json.loads((dest / "sentence_bert_config.json").read_text())["max_seq_length"] == 256
    assert json.loads((dest / "config_sentence_transformers.json").read_text())["model_type"] == "SentenceTransformer"


def test_teacher_without_normalize_cls_pooling_and_a_short_student(tmp_path):
    from transformers import AutoTokenizer

    teacher = _fake_teacher(tmp_path / "teacher", pooling_key="pooling_mode_cls_token", normalize=False,
                            max_seq_length=384)
    model = build_student(TINY, seed=0).eval()
    facts = _ship(model, AutoTokenizer.from_pretrained(teacher_path("minilm-l6")), tmp_path / "best", teacher)
    dest = tmp_path / "best"
    assert (facts["pooling"], facts["normalize"]) == ("cls", False)
    assert facts["max_seq_length"] == 128  # the teacher's 384, capped by the student's positions
    assert not (dest / "2_Normalize").exists()
    pooling = json.loads((dest / "1_Pooling" / "config.json").read_text())
    assert pooling["word_embedding_dimension"] == 64 and pooling["pooling_mode_cls_token"] is True
    assert not pooling["pooling_mode_mean_tokens"]
    st, onnx = _st_embeddings(dest), _onnx_embeddings(dest, 128)
    assert st.shape == (len(SENTENCES), 64) and np.abs(st - onnx).max() <= 1e-4
    assert np.abs(np.linalg.norm(onnx, axis=1) - 1.0).max() > 1e-2  # not normalized


def test_teacher_without_modules_gets_mean_and_no_normalize_said_plainly(tmp_path):
    facts = read_sentence_pipeline(tmp_path)  # a folder with no sentence-transformers files
    assert (facts.pooling, facts.normalize) == ("mean", False) and "default" in facts.source
    bad = _fake_teacher(tmp_path / "weighted", pooling_key="pooling_mode_weightedmean_tokens", normalize=True,
                        max_seq_length=64)
    assert read_sentence_pipeline(bad).pooling == "weightedmean"  # written as is; the ONNX graph refuses it
    with pytest.raises(KdnasError, match="pooling mode 'weightedmean' is not supported by the ONNX export"):
        export_model(TINY, tmp_path / "out", tokenizer="minilm-l6", pooling="weightedmean")
    with pytest.raises(KdnasError, match="has no config.json"):
        write_sentence_transformers(tmp_path / "empty", None, hidden_size=64)
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "modules.json").write_text("[1, 2]")  # a list, but not of modules
    with pytest.raises(KdnasError, match="is not a list of modules"):
        read_sentence_pipeline(tmp_path / "odd")


def test_model_card_names_shape_scores_and_a_command_that_reproduces_the_config(tmp_path, monkeypatch):
    import kdnas.nas as nas
    from kdnas.nas import SearchConfig
    from kdnas.nas.card import write_model_card
    from kdnas.cli import main

    config = SearchConfig.from_flags(teacher="minilm-l6", out="runs/demo dir", trials=20, budget_ms=8.0, prune=False,
                          space_overrides={"layers": "2-4"}, final_steps=50)
    entry = FinalRecord(trial=0, arch="3x12x384x1536", dir="best", latency_ms=3.21, params=17_400_000, l_hs_norm=0.4321,
                        steps=50, train_rows=1024, latency=LatencyRecord(3.21, p90_ms=3.5),
                        latency_int8_onnx=LatencyRecord(1.87, p90_ms=2.0),
                        sentence_transformers={"pooling": "mean", "normalize": True, "max_seq_length": 256})
    card = write_model_card(tmp_path, entry, config).read_text()
    assert "3x12x384x1536" in card and "17,400,000" in card and "0.4321" in card
    # the front matter names the model its weights come from, and that model's licence; the YAML parses
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["base_model"] == "sentence-transformers/all-MiniLM-L6-v2" and front["license"] == "apache-2.0"
    assert front["library_name"] == "sentence-transformers" and "knowledge-distillation" in front["tags"]
    assert "| teacher | `minilm-l6` (bundled copy of sentence-transformers/all-MiniLM-L6-v2, licence apache-2.0) |" in card
    own = write_model_card(tmp_path, entry, replace(config, teacher="/models/my-teacher")).read_text()
    assert set(yaml.safe_load(own.split("---\n")[1])) == {"library_name", "pipeline_tag", "tags"}
    assert "3.21 ms" in card and "1.87 ms" in card and "not measured" in card  # no quality in the entry
    assert "mean pooling, L2-normalized, max_seq_length 256" in card
    assert "| 50 steps on 1024 sequences |" in card  # what the training ran in is not in this entry
    timed = write_model_card(tmp_path, replace(entry, precision="bf16", seconds={"distill": 239.8}), config).read_text()
    assert "| 50 steps on 1024 sequences (bf16, 4.0 min) |" in timed and "scaled" not in timed
    drifted = write_model_card(tmp_path, replace(entry, latency_scaled_by=0.9, teacher_latency_now_ms=22.2),
                               config).read_text()
    assert "3.21 ms median" in drifted and "scaled by 0.900: the host had slowed, the teacher read 22.20 ms" in drifted
    paired = write_model_card(tmp_path, replace(entry, ratio_to_teacher=0.4591, read_ms=3.5, latency_scaled_by=0.9,
                                                teacher_latency_now_ms=7.62), config).read_text()
    assert "3.21 ms median" in paired and "0.459x the teacher, the two timed side by side" in paired
    assert "(here 3.50 and 7.62 ms)" in paired and "the host had slowed" not in paired
    quick = write_model_card(tmp_path, replace(entry, precision="fp32", seconds={"distill": 3.2}), config).read_text()
    assert "| 50 steps on 1024 sequences (fp32, 3 s) |" in quick
    perturbed = write_model_card(tmp_path, replace(entry, augment=0.5), config).read_text()
    assert "| 50 steps on 1024 sequences, 50% of the batches perturbed |" in perturbed
    command = card.split("```bash\n", 1)[1].split("\n```", 1)[0]
    assert command == ("kdnas search --teacher minilm-l6 --corpus news --out 'runs/demo dir' "
                       "--budget-ms 8.0 --layers 2-4 --no-prune --final-steps 50 --trials 20")
    # The command, run through the real CLI, builds exactly this config.
    seen = []
    monkeypatch.setattr(nas, "search", lambda cfg: seen.append(cfg) or StudySummary("s", StudyFacts()))
    assert main(shlex.split(command)[1:] + ["--json"]) == 0
    assert seen == [config]
    quality = Quality(sentences=1000, beats_baselines=True,
                      fidelity={"student": Fidelity(0.9512), "first 3 layers (untrained)": Fidelity(0.4321)})

    def card_of(quality: Quality) -> Path:  # the entry as search.json holds it (the quality as its JSON), read back
        return write_model_card(tmp_path, FinalRecord.from_attrs({**entry.to_attrs(), "quality": quality.to_attrs()}),
                                config)

    scored = card_of(quality).read_text()
    assert "student 0.951; first 3 layers (untrained) 0.432" in scored and "beats both untrained baselines" in scored
    assert "fp32: " not in scored  # no INT8 fidelity in this entry
    with_int8 = card_of(replace(quality, int8=Fidelity(0.9487)))
    assert "1.87 ms median (p90 2.00; batch 1, 128 tokens, 2 threads, onnxruntime); embedding fidelity ρ 0.949 on " \
           "the same held-out sentences (fp32: 0.951)" in with_int8.read_text()
    failed = card_of(replace(quality, beats_baselines=False)).read_text()
    assert "does NOT beat the untrained baselines" in failed
    # short of text: the card names the option that gives more of it, with the run's rows
    short = replace(quality, fidelity={**quality.fidelity, "student": Fidelity(0.9512, 0.003)},
                    trained_on=Fidelity(0.9912, 0.003, sentences=1000, passes=4.0))
    card = card_of(short).read_text()
    assert "on 1000 of its own training rows rho 0.991 (+0.040 over held-out, beyond the noise)" in card
    assert "more of the corpus (--final-train above this run's 1024 rows)" in card


def test_run_final_ships_a_sentence_transformers_folder_with_a_card(teacher, news_texts, tmp_path, isolated_cache):

    import optuna

    from kdnas.nas import SearchConfig
    from kdnas.nas.final import run_final
    from kdnas.nas.space import SearchSpace
    from kdnas.nas.context import SearchContext

    out = tmp_path / "run"
    config = SearchConfig.from_flags(out=str(out), final_steps=2, final_train=16, proxy_eval=8, seq_len=32,
                          latency_seq=16, threads=1, seed=3, quality_sentences=0, proxy_sentences=60)
    space = SearchSpace(layers=(1,), heads=(4,), hidden=(64,), ffn=(128,))  # one width: no FFN neighbour
    ctx = SearchContext(config=config, space=space, sizes=teacher.student_sizes(), teacher=teacher, texts=news_texts,
                        data=None, cache=None, teacher_latency_ms=10.0, budget_ms=100.0,
                        progress=Progress(1, 0, enabled=False))
    row = Candidate(number=0, arch="1x4x64x128", layers=1, heads=4, hidden=64, ffn=128, reward=0.5)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    [entry] = run_final(study, ctx, out, [row])
    [kept] = stored(study)["final"]  # the study's JSON: every fact a finalist stores is a field of its record
    assert set(kept) <= {f.name for f in fields(FinalRecord)} and FinalRecord.from_attrs(kept) == entry
    assert json.loads((out / "best" / "search.json").read_text())["trial"] == 0
    assert entry.latency.median_ms > 0 and entry.within_budget and entry.rank == 1
    assert entry.latency_fp32_onnx.median_ms > 0 and entry.budget_graph == "model.onnx"
    best = out / "best"
    assert entry.sentence_transformers["normalize"] is True and entry.export["normalize"] is True
    pooling = json.loads((best / "1_Pooling" / "config.json").read_text())
    assert pooling["word_embedding_dimension"] == 64
    st, onnx = _st_embeddings(best), _onnx_embeddings(best, entry.sentence_transformers["max_seq_length"])
    assert np.abs(st - onnx).max() <= 1e-4
    card = (best / "README.md").read_text()
    assert "1x4x64x128" in card and "not measured" in card
    assert f"kdnas search --teacher minilm-l6 --corpus news --out {out} " in card and "--final-steps 2" in card


def test_cli_normalize_flag_and_plain_mean_without_modules(tmp_path, capsys):
    from transformers import AutoTokenizer

    from kdnas.cli import main

    student = tmp_path / "student"  # an HF folder without sentence-transformers files
    build_student(TINY, seed=0).save_pretrained(student)
    AutoTokenizer.from_pretrained(teacher_path("minilm-l6")).save_pretrained(student)
    for flag, normalized in (([], False), (["--normalize"], True)):
        out = tmp_path / f"onnx{len(flag)}"
        assert main(["export", str(student), "--out", str(out), *flag]) == 0
        assert json.loads((out / "export.json").read_text())["normalize"] is normalized
        norms = np.linalg.norm(_onnx_embeddings(out, 128), axis=1)
        assert np.allclose(norms, 1.0, atol=1e-5) is normalized
    assert "sentence_embedding: mean pooling, L2-normalized" in capsys.readouterr().out


def test_a_finalist_over_the_budget_is_not_shipped(teacher, news_texts, tmp_path, isolated_cache):

    import optuna

    from kdnas.core.errors import KdnasError
    from kdnas.nas import SearchConfig
    from kdnas.nas.final import run_final
    from kdnas.nas.final._records import shippable
    from kdnas.nas.space import SearchSpace
    from kdnas.nas.context import SearchContext

    out = tmp_path / "run"
    config = SearchConfig.from_flags(out=str(out), final_steps=1, final_train=16, proxy_eval=8, seq_len=32,
                          latency_seq=16, threads=1, seed=3, quality_sentences=0, proxy_sentences=60)
    # A budget no model meets: each finalist's shipped graph is timed before training and refused
    # (and no trimmed shape is new: 1x4x64x256 trims to 1x4x64x128, refused already).
    space = SearchSpace(layers=(1,), heads=(4,), hidden=(64,), ffn=(128, 256))
    ctx = SearchContext(config=config, space=space, sizes=teacher.student_sizes(), teacher=teacher, texts=news_texts,
                        data=None, cache=None, teacher_latency_ms=10.0, budget_ms=1e-6,
                        progress=Progress(1, 0, enabled=False))
    pool = [Candidate(number=n, arch=f"1x4x64x{f}", layers=1, heads=4, hidden=64, ffn=f, reward=0.5 - n / 10)
            for n, f in ((0, 128), (1, 256))]
    study = optuna.create_study()
    with pytest.raises(KdnasError, match=r"no finalist fits the budget .*1x4x64x128 .* ms, 1x4x64x256"):
        run_final(study, ctx, out, pool)
    assert not (out / "best").exists() and not (out / "over-budget").exists(), "nothing was trained or shipped"
    over = StudyFacts.from_study(study).final_over_budget
    assert [(s.trial, s.stage) for s in over] == [(0, "before training"), (1, "before training")]
    assert all(s.latency_ms > s.budget_ms for s in over)
    # A ratio budget: each graph timed side by side with the teacher (real graphs, real onnxruntime),
    # its latency stated on the scale of the teacher's reading that set the budget.
    assert all(s.latency_readings_ms == [] and 0 < s.ratio_to_teacher < 1 for s in over)
    # (the ratio is kept to 4 places)
    assert all(s.latency_ms == pytest.approx(s.ratio_to_teacher * 10.0, abs=1e-3) for s in over)
    assert shippable(study, pool, config) == []  # a rerun with the same recipe does not retrain them
    assert shippable(study, pool, config.with_flags(final_steps=2)) == pool[:1]  # another recipe does


class _Judge:
    """A fake latency judge (`nas.measure.LatencyJudge`'s two methods), answering as a test sets: read alone,
    1 ms; beside the teacher, `ratio(graph)` of a 10 ms teacher (0.1: within these tests' budget of 1.5 ms);
    two graphs of one shape (fused and plain), a tie. What ships and why is under test here, not the
    measurement (the real worker runs in test_latency.py and the end-to-end searches); real sub-millisecond
    readings, each beside a freshly exported teacher, made these tests 20-30 s long. Every call is kept."""

    def __init__(self, config, ratio=lambda graph: 0.1, alone=lambda target: _reading(1.0)):
        self.config, self.ratio, self.read_alone, self.calls = config, ratio, alone, []

    def alone(self, target, *, use_cache=True):
        self.calls.append(("alone", target, use_cache))
        return self.read_alone(target)

    def pair(self, target, reference):
        self.calls.append(("pair", target, reference))
        return _pair(self.ratio(target), 10.0) if reference == self.config.teacher else _pair(1.0, 5.0)


def _ffn(graph) -> int:
    """The FFN width of an exported graph's model (its folder's config.json)."""
    return json.loads((Path(graph).parent / "config.json").read_text())["intermediate_size"]


def test_the_final_stage_tries_the_ffn_neighbours_of_a_finalist_and_ranks_them_by_the_proxy(
        teacher, news_texts, tmp_path, isolated_cache):

    import optuna

    import kdnas.nas.final as final
    from kdnas.distill import TeacherCache
    from kdnas.nas import SearchConfig
    from kdnas.nas.space import SearchSpace
    from kdnas.nas.recipe import proxy_transfer_set
    from kdnas.nas.context import SearchContext

    config = SearchConfig.from_flags(proxy_steps=1, final_steps=1, final_train=16, proxy_eval=8, seq_len=32,
                          latency_seq=16, threads=1, seed=3, quality_sentences=0, proxy_sentences=60)
    data = proxy_transfer_set(config, teacher, news_texts)
    space = SearchSpace(layers=(1,), heads=(4,), hidden=(64,), ffn=(64, 128, 256))
    # The input this test sets: which shipped graphs fit the budget of 1.5 ms (FFN 256 does not: 2 ms).
    judge = _Judge(config, ratio=lambda graph: 0.2 if _ffn(graph) > 128 else 0.1)

    def run(name, trials, **known):
        ctx = SearchContext(config=config, space=space, sizes=teacher.student_sizes(), teacher=teacher,
                            texts=news_texts, data=data, cache=TeacherCache(teacher, data), teacher_latency_ms=10.0,
                            budget_ms=1.5, progress=Progress(1, 0, enabled=False), judge=judge)
        pool = [Candidate(number=n, arch=f"1x4x64x{f}", layers=1, heads=4, hidden=64, ffn=f, reward=r, **known)
                for n, f, r in trials]
        study = optuna.create_study()
        [entry] = final.run_final(study, ctx, tmp_path / name, pool)
        return entry, study, pool

    # Narrower: the winner 1x4x64x256 is refused; 1x4x64x128 is scored by the proxy like a trial
    # and, ranked above the next trial, shipped in its place.
    entry, study, pool = run("narrower", [(4, 256, 9.0), (7, 64, -5.0)])
    facts = StudyFacts.from_study(study)
    [over], [neighbour] = facts.final_over_budget, facts.final_neighbours
    assert (over.arch, neighbour.arch, neighbour.neighbour_of) == ("1x4x64x256", "1x4x64x128", "1x4x64x256")
    assert (entry.arch, entry.trial, entry.neighbour_of) == ("1x4x64x128", 4, "1x4x64x256")
    assert entry.proxy_reward == neighbour.reward and "loss" in neighbour.proxy
    assert "FFN neighbour of trial #4's 1x4x64x256" in (Path(entry.dir) / "README.md").read_text()
    assert final._records.shippable(study, pool, config) == [neighbour]  # a rerun replays the same choice
    # When the proxy ranks the neighbour below the next trial, the trial ships.
    entry, study, _ = run("ranked-below", [(4, 256, 9.0), (7, 64, 5.0)])
    assert StudyFacts.from_study(study).final_neighbours[0].arch == "1x4x64x128"
    assert (entry.arch, entry.trial, entry.neighbour_of) == ("1x4x64x64", 7, None)
    # Wider: before the winner 1x4x64x64 is trained, 1x4x64x128 is tried, ranks above it and ships;
    # its own wider neighbour 1x4x64x256 is over the budget (two neighbours at most).
    entry, study, _ = run("wider", [(3, 64, -5.0)], latency_median_ms=0.5)
    facts = StudyFacts.from_study(study)
    [neighbour] = facts.final_neighbours
    # Scored on the trials' scale: the parent read 1.0 ms beside it and 0.5 ms as a trial.
    assert (neighbour.arch, neighbour.latency_read_ms, neighbour.parent_read_ms) == ("1x4x64x128", 1.0, 1.0)
    assert neighbour.latency_scaled_by == 0.5 and neighbour.scored_latency == 0.5
    assert [(s.arch, s.neighbour_of) for s in facts.final_over_budget] == [("1x4x64x256", "1x4x64x128")]
    assert (entry.arch, entry.trial, entry.neighbour_of) == ("1x4x64x128", 3, "1x4x64x64")


# The default run keeps the common path (the run continues); shipping as narrowed is in -m slow.
@pytest.mark.parametrize("min_steps, steps", [(1, 2), pytest.param(3, 0, marks=pytest.mark.slow)])
def test_a_finalist_refused_as_shipped_hands_its_training_to_its_narrower_neighbour(
        min_steps, steps, teacher, news_texts, tmp_path, isolated_cache, monkeypatch):

    import optuna

    import kdnas.nas.final as final
    from kdnas.distill import TeacherCache
    from kdnas.nas import SearchConfig
    from kdnas.nas.space import SearchSpace
    from kdnas.nas.recipe import proxy_transfer_set
    from kdnas.nas.context import SearchContext

    config = SearchConfig.from_flags(proxy_steps=1, final_steps=2, final_train=16, proxy_eval=8, seq_len=32,
                          latency_seq=16, threads=1, seed=3, quality_sentences=0, proxy_sentences=60)
    data = proxy_transfer_set(config, teacher, news_texts)
    # What this test sets: every graph fits before training (the graph exported to be timed, in a
    # temporary folder), and 1x4x64x256 reads over as shipped.
    judge = _Judge(config, ratio=lambda graph: 1e4 if _ffn(graph) == 256 and "kdnas-final-" not in str(graph) else 0.1)
    from kdnas.distill import inherit

    # narrowed_from (what the final stage calls) reads the wide student back and cuts it with inherit.narrowed
    real_narrowed, narrowed_to = inherit.narrowed, []

    def narrowed(model, tokenizer, spec, ids, mask):
        narrowed_to.append((model.config.intermediate_size, spec.arch))
        return real_narrowed(model, tokenizer, spec, ids, mask)

    monkeypatch.setattr(inherit, "narrowed", narrowed)
    # fewer steps than the least a continued run makes: it ships as narrowed, with no steps of its own
    monkeypatch.setattr(final._train, "MIN_CONTINUED_STEPS", min_steps)
    ctx = SearchContext(config=config, space=SearchSpace(layers=(1,), heads=(4,), hidden=(64,), ffn=(128, 256)),
                        sizes=teacher.student_sizes(), teacher=teacher, texts=news_texts, data=data,
                        cache=TeacherCache(teacher, data), teacher_latency_ms=10.0, budget_ms=1.5,
                        progress=Progress(1, 0, enabled=False), judge=judge)
    study, out = optuna.create_study(), tmp_path / "run"
    [entry] = final.run_final(study, ctx, out, [Candidate(number=4, arch="1x4x64x256", layers=1, heads=4, hidden=64,
                                                          ffn=256, reward=9.0)])
    [over] = StudyFacts.from_study(study).final_over_budget
    assert (over.arch, over.stage, over.steps) == ("1x4x64x256", "as shipped", 2)
    assert Path(over.dir).is_dir() and narrowed_to == [(256, "1x4x64x128")]
    assert (entry.arch, entry.neighbour_of, entry.steps) == ("1x4x64x128", "1x4x64x256", steps)
    assert entry.init == {"init": "continued", "from": "1x4x64x256", "after_steps": 2,
                             "narrowed_by": "activation importance (distill.narrowed)"}
    assert entry.l_hs_norm > 0  # held-out L_HS of what ships, trained or not
    card = (out / "best" / "README.md").read_text()
    said = "2 steps" if steps else "0 of 2 steps"
    assert f"{said} on top of 2 as 1x4x64x256 (refused over the budget as shipped, then narrowed)" in card


def test_ffn_neighbours_take_the_next_width_and_never_a_shape_already_had():
    from kdnas.nas.neighbours import NARROWER, WIDER, candidates, ffn_neighbour, on_trial_scale, rank_in
    from kdnas.nas.schema import BEFORE_TRAINING, Refusal

    # A neighbour's reading on the scale its parent was scored with: the host is 10 % slower now.
    assert on_trial_scale(9.9, 8.2, 9.02) == pytest.approx((9.0, 0.909), abs=1e-3)
    assert on_trial_scale(9.9, None, 9.02) == (9.9, 1.0) and on_trial_scale(9.9, 8.2, None) == (9.9, 1.0)
    from kdnas.nas.space import SearchSpace

    space = SearchSpace(layers=(3,), heads=(), hidden=(384,), ffn=(256, 1024, 1280, 1536), head_size=32)
    row = Candidate(number=2, arch="3x12x384x1280", layers=3, heads=12, hidden=384, ffn=1280, reward=0.7,
                    latency_median_ms=8.1)
    narrower, wider = ffn_neighbour(space, row, NARROWER, set()), ffn_neighbour(space, row, WIDER, set())
    assert (narrower.arch, narrower.number, narrower.reward, narrower.ffn) == ("3x12x384x1024", 2, None, 1024)
    assert wider.arch == "3x12x384x1536" and wider.neighbour_of == "3x12x384x1280" and wider.parent_latency_ms == 8.1
    assert ffn_neighbour(space, row, WIDER, {"3x12x384x1536"}) is None, "a shape already had"
    assert ffn_neighbour(space, replace(row, ffn=256, arch="3x12x384x256"), NARROWER, set()) is None, "no width"

    def shape(arch: str, reward: float) -> Candidate:
        return replace(row, arch=arch, reward=reward)

    queue = [shape("a", 0.6), shape("b", 0.4)]
    rank_in(queue, narrower)
    assert [r.arch for r in queue] == ["3x12x384x1024", "a", "b"], "not yet scored: tried next"
    rank_in(queue, replace(wider, reward=0.5))
    assert [r.arch for r in queue] == ["3x12x384x1024", "a", "3x12x384x1536", "b"]
    pool = [shape("a", 0.6), shape("b", 0.4)]
    refused = Refusal(trial=0, arch="a", recipe={}, stage=BEFORE_TRAINING, latency_ms=9.0, budget_ms=8.0)
    assert [r.arch for r in candidates(pool, [refused], [replace(wider, reward=0.5)])] == ["3x12x384x1536", "b"]


def test_a_reading_over_the_budget_is_measured_again_and_the_lower_stands():
    from types import SimpleNamespace

    from kdnas.nas.measure import budget_latency

    def readings(*medians):
        calls = []

        def alone(target, use_cache=True):
            calls.append(use_cache)
            median = medians[len(calls) - 1]
            return SimpleNamespace(median_ms=median, min_ms=median - 0.5)
        return SimpleNamespace(alone=alone), calls  # a fake judge: nas.measure.LatencyJudge's reading alone

    once, calls = readings(7.9)
    result, seen = budget_latency("m.onnx", once, 8.0)
    assert (result.median_ms, seen, calls) == (7.9, [], [True]), "within the budget: one reading"
    once, calls = readings(8.6, 6.9)  # a busy spell, then a quiet reading: ships
    result, seen = budget_latency("m.onnx", once, 8.0)
    assert (result.median_ms, seen, calls) == (6.9, [8.6, 6.9], [True, False]), "the second reading is fresh"
    once, calls = readings(8.6, 8.7)  # over on both: over
    result, seen = budget_latency("m.onnx", once, 8.0)
    assert (result.median_ms, seen) == (8.6, [8.6, 8.7])
    # A search trial measures again only when the budget lies inside the reading's spread.
    once, calls = readings(8.3, 7.9)  # fastest run 7.8 <= 8.0
    assert budget_latency("m.onnx", once, 8.0, marginal_only=True)[1] == [8.3, 7.9]
    once, calls = readings(9.5)  # fastest run 9.0 > 8.0: far over, one reading
    assert budget_latency("m.onnx", once, 8.0, marginal_only=True)[1] == [] and calls == [True]


def _reading(ms):
    """A latency reading of `ms` (median), for the unit tests of the budget's judgement."""
    from kdnas.latency import LatencyResult

    return LatencyResult(median_ms=ms, p90_ms=ms + 0.2, min_ms=ms - 0.1, mean_ms=ms, cv=0.01, runs=20, noisy=False,
                         batch=1, seq=128, threads=2, runtime="onnxruntime", cpu="cpu", versions={}, cached=False,
                         key="k")


def _pair(ratio, teacher_ms):
    """A side-by-side measurement of a graph at `ratio` of a teacher that read `teacher_ms` in it."""
    from dataclasses import replace

    from kdnas.latency import PairResult

    student = replace(_reading(ratio * teacher_ms), target="model.onnx", runs=180)
    return PairResult(ratio=ratio, ratio_low=ratio - 0.003, ratio_high=ratio + 0.002, rounds=12, target=student,
                      reference=replace(_reading(teacher_ms), target="minilm-l6", runs=180))


@pytest.mark.parametrize("ratio, teacher_now, fits", [
    (0.459, 24.0, True),  # the host slowed since the budget was set (teacher 20 ms then): the ratio decides
    (0.459, 17.0, True),  # ... or sped up: the same
    (0.506, 24.0, False),  # over half the teacher side by side: over, however fast each reads alone
])
def test_a_finalist_under_a_ratio_budget_is_timed_side_by_side_with_the_teacher(ratio, teacher_now, fits):
    from types import SimpleNamespace

    import kdnas.nas.final as final
    from kdnas.nas import SearchConfig

    config = SearchConfig.from_flags(budget_ratio=0.5)
    judge = _Judge(config, alone=lambda target: pytest.fail("a ratio budget is not read alone"))
    judge.pair = lambda target, reference: judge.calls.append((target, reference)) or _pair(ratio, teacher_now)
    ctx = SimpleNamespace(config=config, budget_ms=10.0, teacher_latency_ms=20.0,
                          progress=Progress(1, 0, enabled=False), judge=judge)
    shipped, readings, facts = final._latency.final_latency(ctx, Path("model.onnx"), "final 1/1")
    assert judge.calls == [(Path("model.onnx"), config.teacher)] and readings == []
    assert shipped.median_ms == pytest.approx(ratio * 20.0) and (shipped.median_ms <= ctx.budget_ms) == fits
    assert facts["ratio_to_teacher"] == ratio and facts["teacher_latency_now_ms"] == teacher_now
    assert facts["latency_scaled_by"] == pytest.approx(20.0 / teacher_now, abs=1e-4)  # for the INT8 read alone
    assert facts["read_ms"] == pytest.approx(ratio * teacher_now)


def test_a_finalist_under_an_absolute_budget_is_read_alone():
    from types import SimpleNamespace

    import kdnas.nas.final as final
    from kdnas.nas import SearchConfig

    config = SearchConfig.from_flags(budget_ms=5.0)
    readings_ms = iter([5.6, 5.5])  # over: read again, and the lower stands
    judge = _Judge(config, alone=lambda target: _reading(next(readings_ms)))
    judge.pair = lambda *a: pytest.fail("--budget-ms has no teacher")
    ctx = SimpleNamespace(config=config, budget_ms=5.0, teacher_latency_ms=10.0,
                          progress=Progress(1, 0, enabled=False), judge=judge)
    shipped, readings, facts = final._latency.final_latency(ctx, Path("model.onnx"), "final 1/1")
    assert (shipped.median_ms, readings, facts) == (5.5, [5.6, 5.5], {})
    assert [call[2] for call in judge.calls] == [True, False]  # the second reading is fresh


def test_the_summary_says_when_a_refused_finalist_was_judged_beside_a_fresh_teacher_reading(capsys, tmp_path):
    from kdnas.nas._cli import _print_summary
    from kdnas.nas.records import TrialRow
    from kdnas.nas.schema import Refusal

    over = Refusal(trial=2, arch="3x12x384x1536", recipe={}, stage="before training", latency_ms=10.03, budget_ms=9.87,
                   latency_readings_ms=[10.15, 10.13], teacher_latency_now_ms=19.93, latency_scaled_by=0.99)
    neighbour = Candidate(number=2, arch="3x12x384x1280", layers=3, heads=12, hidden=384, ffn=1280, reward=0.7291,
                          neighbour_of="3x12x384x1536", proxy={"latency_ms": 9.21}, latency_read_ms=9.93,
                          parent_read_ms=8.9, latency_scaled_by=0.9275)
    final = FinalRecord(dir="best", arch="3x12x384x1280", trial=2, neighbour_of="3x12x384x1536", steps=1200,
                        latency_ms=9.2, fidelity=0.9, l_hs_norm=0.3, reward=0.89)
    facts = StudyFacts(budget_ms=9.87, teacher_latency=LatencyRecord(median_ms=19.73), final=[final],
                       final_neighbours=[neighbour],
                       final_over_budget=[over, replace(over, trial=3, latency_scaled_by=1.0),
                                          replace(over, trial=4, latency_ms=10.12, latency_readings_ms=[],
                                                  ratio_to_teacher=0.5127, teacher_latency_now_ms=21.4, read_ms=10.97,
                                                  latency_scaled_by=0.922)])
    summary = StudySummary("s", facts, rows=tuple(TrialRow(number=n) for n in range(8)), counts={"feasible": 8})
    _print_summary(summary, tmp_path)
    out = capsys.readouterr().out.splitlines()
    lines = [line for line in out if line.startswith("not shipped")]
    assert "twice (10.15 and 10.13 ms), scaled by 0.990 (the teacher read 19.93 ms beside it)" in lines[0]
    assert "scaled" not in lines[1]
    assert lines[2].startswith("not shipped: 3x12x384x1536 (trial #4) measured 10.12 ms before training: 0.513x the "
                               "teacher side by side (the teacher 21.40 ms, it 10.97 ms), over the budget of 9.87 ms")
    assert ("FFN neighbour 3x12x384x1280 of 3x12x384x1536: 9.93 ms as shipped beside 8.90 ms for 3x12x384x1536: "
            "9.21 ms on the trials' scale, proxy reward 0.7291") in out
    assert any(line.startswith("final best: 3x12x384x1280 (the FFN neighbour of trial #2's 3x12x384x1536) after")
               for line in out)


@pytest.mark.parametrize("shape_ms, ratio, budget_ms, expect_ms, paired", [
    (10.7, 0.486, None, 0.486 * 20.0, True),  # a slow spell during the trials: fits side by side
    (10.7, 0.512, None, 0.512 * 20.0, True),  # over side by side too
    (15.5, 0.8, None, 15.5, False),  # over by more than ALONE_BAND: over however the host drifts, no pair
    (13.0, 0.49, None, 0.49 * 20.0, True),  # 30 % over alone, within side by side: how the host drifts
    (9.5, 0.45, None, 9.5, False),  # within the budget: nothing to judge
    (10.7, 0.486, 10.0, 10.7, False),  # --budget-ms is absolute: judged as read
])
def test_a_trial_over_a_ratio_budget_is_timed_side_by_side_with_the_teacher(shape_ms, ratio, budget_ms, expect_ms,
                                                                           paired):
    from types import SimpleNamespace

    from kdnas.nas import SearchConfig
    from kdnas.nas.measure import trial_latency

    judge = _Judge(SearchConfig.from_flags(budget_ms=budget_ms, budget_ratio=0.5), alone=lambda target: _reading(shape_ms))
    judge.pair = lambda target, reference: judge.calls.append("pair") or _pair(ratio, 22.0)
    record = trial_latency(SimpleNamespace(arch="3x12x384x1536"), judge, 10.0, 20.0)
    assert record.median_ms == pytest.approx(expect_ms) and ("pair" in judge.calls) == paired
    if paired:
        assert record.ratio_to_teacher == ratio and record.read_ms == pytest.approx(ratio * 22.0)
        assert record.latency_scaled_by == pytest.approx(20.0 / 22.0, abs=1e-4)
    else:
        assert record.read_ms is None and record.ratio_to_teacher is None


def test_a_finalist_read_within_the_margin_is_read_again_before_its_training(teacher):
    """The shipped graph's pre-training reading, once more when within 5 % of the budget (nas.time_limit.settled):
    the mean is what the run counts, both readings are kept, and the extra pair counts as steps of the reading."""
    from types import SimpleNamespace

    import kdnas.nas.final as final
    from kdnas.core.assets import teacher_path
    from kdnas.export import read_sentence_pipeline
    from kdnas.nas import SearchConfig

    ratios = iter([0.49, 0.46])  # the first within 5 % of a budget of half the teacher, the second not
    said, config = [], SearchConfig()
    ctx = SimpleNamespace(config=config, teacher=teacher, teacher_latency_ms=10.0, budget_ms=5.0,
                          progress=SimpleNamespace(phase=said.append),
                          judge=_Judge(config, ratio=lambda graph: next(ratios)))  # plain and fused: a tie
    spec = StudentSpec(layers=1, heads=2, hidden=64, ffn=128, **teacher.student_sizes())
    pipeline = read_sentence_pipeline(teacher_path("minilm-l6"))
    before, readings, facts, steps, choice, graph = final._latency.shipped_graph_latency(ctx, spec, pipeline, "final 1/1")
    assert choice.shipped == "fused" and graph == "model.onnx"  # a tie keeps the fused graph
    assert before == pytest.approx(4.75) and readings == [] and steps == 7  # export, graph + teacher twice, variant
    assert facts["ratio_to_teacher"] == 0.49 and facts["settled_from_ms"] == [pytest.approx(4.9), pytest.approx(4.6)]
    assert "read again, within 5% of the budget: 4.90 and 4.60 ms, 4.75 ms counted" in said[-1]
    ratios = iter([0.40])  # well inside: one reading
    assert final._latency.shipped_graph_latency(ctx, spec, pipeline, "final 1/1")[::3] == (pytest.approx(4.0), 5)


def test_on_the_int8_runtime_the_budget_judges_the_int8_graph(teacher):
    """--runtime onnxruntime-int8: a finalist's pre-training reading is of the INT8 graph it will ship,
    quantized by the export's recipe, and a shipped folder's INT8 graph is the one judged."""
    from types import SimpleNamespace

    import onnx

    import kdnas.nas.final as final
    from kdnas.core.assets import teacher_path
    from kdnas.export import read_sentence_pipeline
    from kdnas.nas import SearchConfig

    judged = []

    def beside(graph):
        judged.append((graph.name, any("Integer" in n.op_type or "Quantize" in n.op_type
                                       for n in onnx.load(str(graph)).graph.node)))
        return 0.3

    config = SearchConfig.from_flags(runtime="onnxruntime-int8")
    ctx = SimpleNamespace(config=config, teacher=teacher, teacher_latency_ms=10.0, budget_ms=5.0,
                          progress=SimpleNamespace(phase=lambda _: None), judge=_Judge(config, ratio=beside))
    spec = StudentSpec(layers=1, heads=2, hidden=64, ffn=128, **teacher.student_sizes())
    final._latency.shipped_graph_latency(ctx, spec, read_sentence_pipeline(teacher_path("minilm-l6")), "final 1/1")
    assert judged == [("model.int8.onnx", True)]
    assert final.shipped_graphs("onnxruntime-int8") == ("model.int8.onnx", "model.onnx")
    assert final.shipped_graphs("onnxruntime") == ("model.onnx", "model.int8.onnx")


def test_on_the_auto_runtime_an_fp32_graph_over_the_budget_is_followed_by_its_int8_graph(teacher):
    """--runtime onnxruntime-auto (the default): a finalist whose fp32 graph reads over the budget before training
    is judged by its all-INT8 graph, the fastest precision plan; the gate says which graph it judged."""
    from types import SimpleNamespace

    import onnx

    import kdnas.nas.final as final
    from kdnas.core.assets import teacher_path
    from kdnas.export import read_sentence_pipeline
    from kdnas.nas import SearchConfig

    judged = []

    def beside(graph):
        int8 = any("Integer" in n.op_type for n in onnx.load(str(graph)).graph.node)
        judged.append((graph.name, int8))
        return 0.4 if int8 else 0.7  # a budget of half the teacher: only as INT8

    config = SearchConfig()
    assert config.latency.runtime == "onnxruntime-auto" and config.latency.plans
    ctx = SimpleNamespace(config=config, teacher=teacher, teacher_latency_ms=10.0, budget_ms=5.0,
                          progress=SimpleNamespace(phase=lambda _: None), judge=_Judge(config, ratio=beside))
    spec = StudentSpec(layers=1, heads=2, hidden=64, ffn=128, **teacher.student_sizes())
    gate = final._latency.shipped_graph_latency(ctx, spec, read_sentence_pipeline(teacher_path("minilm-l6")), "f")
    assert judged == [("model.onnx", False), ("model.int8.onnx", True)]
    # judged as INT8, it ships a plan grown from the fused graph: no plain fp32 graph replaces it
    assert gate.graph == "model.int8.onnx" and gate.ms == pytest.approx(4.0) and gate.variant is None
    ratio = iter([0.45])  # fp32 fits: no INT8 reading
    judged.clear()
    ctx.judge = _Judge(config, ratio=lambda graph: judged.append(graph.name) or next(ratio))
    assert final._latency.shipped_graph_latency(ctx, spec, read_sentence_pipeline(teacher_path("minilm-l6")),
                                                "f").graph == "model.onnx" and judged == ["model.onnx"]


def test_a_finalist_judged_as_int8_whose_plan_finds_none_now_ships_its_int8_graph_and_says_why(tmp_path,
                                                                                           monkeypatch):
    """Judged as INT8 before training, a finalist whose plan on the trained weights reads over the budget ships the
    all-INT8 graph the budget judged (the verdict is made before the long run), and export.json names that graph
    and why, as search.json's budget_graph does."""
    import json
    from types import SimpleNamespace

    from kdnas.nas import SearchConfig, plans
    from kdnas.nas.final import _shipping

    (tmp_path / "export.json").write_text(json.dumps({"int8": True}))
    monkeypatch.setattr(plans, "plan_student", lambda ctx, dest, label, until=None: None)  # not even all-INT8 fits now
    monkeypatch.setattr(_shipping, "shipped_latencies", lambda ctx, dest, label, judged: judged)
    ctx = SimpleNamespace(config=SearchConfig(), progress=SimpleNamespace(phase=lambda _: None))
    choice, judged, latencies = _shipping._precision(ctx, tmp_path, "final 1/1", "model.int8.onnx")
    assert choice is None and judged == latencies == "model.int8.onnx"
    precision = json.loads((tmp_path / "export.json").read_text())["precision"]
    assert precision["graph"] == "model.int8.onnx" and precision["why"] == _shipping.NO_PLAN_NOW


@pytest.mark.parametrize("plain_over_fused, shipped", [(0.93, "plain"), (0.999, "fused")])
def test_the_fp32_graph_shipped_is_the_faster_of_fused_and_plain(plain_over_fused, shipped, teacher, tmp_path):
    """On onnxruntime fp32 a finalist's shape is exported fused and plain and the two are timed side by side
    (here by a fake judge): the plain graph is read against the budget and shipped as model.onnx only where
    it is faster in three rounds of four (0.93, quartiles 0.927-0.932); a near tie (0.999, up to 1.001) keeps
    the fused one. The INT8 graph is quantized from the fused graph either way, and export.json says which."""
    from types import SimpleNamespace

    import onnx

    import kdnas.nas.final as final
    from kdnas.core.assets import teacher_path
    from kdnas.export import read_sentence_pipeline
    from kdnas.nas import SearchConfig

    judged, timed = [], []

    def fused_ops(graph):
        return {"SkipLayerNormalization", "Attention"} & {n.op_type for n in onnx.load(str(graph)).graph.node}

    config = SearchConfig()
    judge = _Judge(config, ratio=lambda graph: judged.append(fused_ops(graph)) or 0.3)
    judge.pair = lambda target, reference: (
        _Judge.pair(judge, target, reference) if reference == config.teacher
        else timed.append((fused_ops(target), fused_ops(reference))) or _pair(plain_over_fused, 5.0))
    ctx = SimpleNamespace(config=config, teacher=teacher, teacher_latency_ms=10.0, budget_ms=5.0,
                          progress=SimpleNamespace(phase=lambda _: None), judge=judge)
    spec = StudentSpec(layers=1, heads=2, hidden=64, ffn=128, **teacher.student_sizes())
    pipeline = read_sentence_pipeline(teacher_path("minilm-l6"))
    gate = final._latency.shipped_graph_latency(ctx, spec, pipeline, "final 1/1")
    steps, choice = gate.steps, gate.variant
    assert timed == [(set(), {"SkipLayerNormalization", "Attention"})]  # the plain graph beside the fused one
    assert choice.shipped == shipped and choice.plain_over_fused == plain_over_fused and steps == 5
    assert judged == [set() if shipped == "plain" else {"SkipLayerNormalization", "Attention"}]

    from kdnas.core.spec import build_student
    dest = tmp_path / "best"
    facts = final._shipping.ship(ctx, build_student(spec, seed=0).eval(), dest, teacher_path("minilm-l6"), pipeline, choice, {})
    manifest = json.loads((dest / "export.json").read_text())
    assert manifest == facts["export"] and manifest["fp32_variant"]["shipped"] == shipped
    assert manifest["optimized"] is (shipped == "fused") and manifest["parity"]["passed"]
    assert bool(fused_ops(dest / "model.onnx")) is (shipped == "fused")
    assert manifest["sizes"]["model.onnx"] == (dest / "model.onnx").stat().st_size
    int8_ops = {n.op_type for n in onnx.load(str(dest / "model.int8.onnx")).graph.node}
    assert "QAttention" in int8_ops  # quantized from the fused graph
    st, graph = _st_embeddings(dest), _onnx_embeddings(dest, facts["sentence_transformers"]["max_seq_length"])
    assert np.abs(st - graph).max() <= 1e-4
