"""The search's training recipes, in one place: the proxy's (every trial and reference shape) and the final
run's (each finalist), and the transfer sets they train on. The trial and the final stage both read them here.

The fidelity proxy is the final recipe shortened (`proxy_config`): the final run's method, batch, rows and
transfer set, for `proxy.steps` steps at PROXY_FINAL_LR; the hs proxy is the paper's (its own method, batch,
windows and rate). A final run's records are tagged with its recipe (`recipe_of`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kdnas.distill import DistillConfig, make_transfer_set

from .config import PROXY_FINAL_LR, SearchConfig

# Interim (pruner) L_HS estimates score the first held-out rows only: an evaluation every few steps
# on all of them would cost more than the training it watches. The last evaluation uses every row.
INTERIM_EVAL_ROWS = 32


def proxy_transfer_set(cfg: SearchConfig, teacher: Any, texts: list[str]) -> Any:
    """The proxy's transfer set: for the fidelity proxy — the final recipe, shortened — `final.train`
    rows of `final.unit`, the final run's own set unless a long run needs more (`final.rows`); for hs,
    `proxy.train` windows. Both hold out the proxy's `proxy.eval` rows."""
    if cfg.proxy.kind == "fidelity":
        return _final_unit_set(cfg, teacher, texts, cfg.final.train)
    return make_transfer_set(teacher.tokenizer, texts, seq_len=cfg.proxy.seq_len, num_train=cfg.proxy.train,
                             num_eval=cfg.proxy.eval, seed=cfg.seed)


def final_transfer_set(cfg: SearchConfig, teacher: Any, texts: list[str], rows: int | None = None) -> Any:
    """The winner's transfer set: `rows` (by default `final.rows`) rows of `final.unit`, the proxy's
    `proxy.eval` held-out rows. A larger one starts with a smaller one's rows (`TeacherCache.grown`)."""
    return _final_unit_set(cfg, teacher, texts, cfg.final.rows if rows is None else rows)


def _final_unit_set(cfg: SearchConfig, teacher: Any, texts: list[str], rows: int) -> Any:
    return make_transfer_set(teacher.tokenizer, texts, seq_len=cfg.proxy.seq_len, num_train=rows,
                             num_eval=cfg.proxy.eval, seed=cfg.seed, unit=cfg.final.unit)


def final_config(cfg: SearchConfig) -> DistillConfig:
    """The winner's recipe: `final.method` (with `final.embed_terms` where given) for `final.steps`,
    evaluated five times on the way."""
    config = final_recipe(cfg, cfg.final.steps, max(1, cfg.final.steps // 5), lr=cfg.final.lr)
    return config if cfg.final.embed_terms is None else replace(config, embed_terms=cfg.final.embed_terms)


def final_recipe(cfg: SearchConfig, steps: int, eval_every: int, *, lr: float) -> DistillConfig:
    """`final.method` with the final run's batch and start, at peak learning rate `lr`, for `steps`."""
    return DistillConfig(method=cfg.final.method, steps=steps, batch_size=cfg.final.batch_size,
                         lr=lr, eval_every=eval_every, init=cfg.init,
                         interim_eval_rows=INTERIM_EVAL_ROWS, layer_map=cfg.layer_map, layer_rule=cfg.layer_rule,
                         seed=cfg.seed, device=cfg.device, precision=cfg.precision,
                         progress=False).for_method(cfg.final.method)


def recipe_of(cfg: SearchConfig, label: str | None = None) -> dict[str, Any]:
    """The final run's recipe as its records are tagged with (`final`, `final_over_budget`, `final_neighbours`):
    a rerun with another recipe trains again. One of several budgets (`label`) keeps its own."""
    f = cfg.final
    return {**({} if label is None else {"budget": label}), "steps": f.steps, "train": f.rows, "unit": f.unit,
            "method": f.method, "lr": f.lr, "batch_size": f.batch_size, "init": cfg.init, "layer_rule": cfg.layer_rule,
            # only when set: a study resumed from before the option keeps its finalists
            **({} if f.augment is None else {"augment": f.augment}),
            **({} if f.embed_terms is None else {"embed_terms": f.embed_terms})}


def proxy_config(cfg: SearchConfig, steps: int, eval_every: int | None = None) -> DistillConfig:
    """The proxy's recipe: the final recipe shortened to `steps` and evaluated at its end (fidelity proxy), or
    the paper's hs proxy, evaluated every `proxy.eval_every` steps for its pruner."""
    if cfg.proxy.kind == "fidelity":
        return final_recipe(cfg, steps, eval_every or steps, lr=PROXY_FINAL_LR)
    extra = {} if cfg.proxy.lr is None else {"lr": cfg.proxy.lr}
    return DistillConfig(method=cfg.proxy.method, steps=steps, batch_size=cfg.proxy.batch_size,
                         eval_every=cfg.proxy.eval_every if eval_every is None else eval_every,
                         interim_eval_rows=INTERIM_EVAL_ROWS,
                         layer_map=cfg.layer_map, init=cfg.init, layer_rule=cfg.layer_rule, seed=cfg.seed,
                         device=cfg.device, precision=cfg.precision, progress=False, **extra).for_method(cfg.proxy.method)
