"""What a replay says of its evaluations' seconds: how many the log recorded stage by stage,
how many were split from its whole-evaluation seconds (``simulator.log_seconds``), how many
took priors, and the cold starts the instance policy charged. Apart from ``log_seconds``, which
``simulator.traces`` uses, because it reads the traces and the fast path's segment sums."""

from __future__ import annotations

import numpy as np

__all__ = ["evaluation_seconds", "seconds_note"]


def evaluation_seconds(traces) -> dict:
    """Where the seconds of the traces' evaluations come from: counts of evaluations whose
    stages the log recorded, split from its whole-evaluation seconds, or took from priors
    (any stage); cold starts charged (from the log, from the prior); seconds in all."""
    from gfsim.simulator.traces import columns_of

    span = columns_of(traces)
    if span is not None:
        return _columns_seconds(*span)
    n = logged_total = split = prior = 0
    cold_logged = cold_prior = 0
    seconds = {"cold_start": 0.0, "compilation": 0.0, "check": 0.0, "timing": 0.0}
    for t in traces:
        ev = np.not_equal(np.array(t.outcome, dtype=object), None) & ~np.asarray(
            t.gen_failed, bool)
        n += int(ev.sum())
        sp = np.asarray(t.stage_split if t.stage_split is not None else [False] * len(t), bool)
        split += int((ev & sp).sum())
        imp = np.zeros(len(t), bool)
        for k in ("compilation", "check", "timing"):
            imp |= np.asarray(t.stage_imputed[k], bool)
        prior += int((ev & imp).sum())
        cold = np.asarray(t.stage_s["cold_start"], float)
        cold_imp = np.asarray(t.stage_imputed["cold_start"], bool)
        cold_prior += int((ev & (cold > 0) & cold_imp).sum())
        cold_logged += int((ev & (cold > 0) & ~cold_imp).sum())
        for k in seconds:
            seconds[k] += float(np.asarray(t.stage_s[k], float)[ev].sum())
        if t.eval_logged_s is not None:
            logged_total += float(np.nansum(np.asarray(t.eval_logged_s, float)[ev & sp]))
    return {"evaluations": n, "stages_split": split, "stages_prior": prior,
            "stages_logged": n - split - prior, "split_from_s": logged_total,
            "cold_starts_logged": cold_logged, "cold_starts_prior": cold_prior,
            "seconds": seconds}


def _columns_seconds(cols, a: int, b: int) -> dict:
    """``evaluation_seconds`` of the searches of rows a:b of one log's ``TraceColumns`` in
    one pass, to the bit: each search's sums as numpy takes them, added search by search."""
    from functools import reduce
    from operator import add

    from gfsim.simulator.trace.fast import _sums

    whole = cols.whole()
    sizes = (cols.ends - cols.starts)[(cols.starts >= a) & (cols.ends <= b)]
    search = np.repeat(np.arange(len(sizes)), sizes)
    ev = np.not_equal(whole["outcome"][a:b], None) & ~whole["gen_failed"][a:b]
    sp = np.asarray(cols.lists["stage_split"][a:b], bool)
    imp = np.zeros(b - a, bool)
    for k in ("compilation", "check", "timing"):
        imp |= np.asarray(cols.stage_imputed[k][a:b], bool)
    cold = whole["cold_start"][a:b]
    cold_imp = np.asarray(cols.stage_imputed["cold_start"][a:b], bool)

    def total(x, mask):  # per search x[mask].sum(), then added in search order
        counts = np.bincount(search[mask], minlength=len(sizes))
        starts = np.zeros(len(sizes), np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        return reduce(add, _sums(x[mask], starts, counts).tolist(), 0.0)

    logged = np.nan_to_num(np.asarray(cols.lists["eval_logged_s"][a:b], float), nan=0.0)
    n = int(ev.sum())
    split = int((ev & sp).sum())
    prior = int((ev & imp).sum())
    return {"evaluations": n, "stages_split": split, "stages_prior": prior,
            "stages_logged": n - split - prior, "split_from_s": total(logged, ev & sp),
            "cold_starts_logged": int((ev & (cold > 0) & ~cold_imp).sum()),
            "cold_starts_prior": int((ev & (cold > 0) & cold_imp).sum()),
            "seconds": {k: total(whole[k][a:b], ev) for k in
                        ("cold_start", "compilation", "check", "timing")}}


def seconds_note(traces, model) -> str:
    """One line: where the evaluations' seconds come from, and the instance policy."""
    e = evaluation_seconds(traces)
    p = model.priors
    parts = [f"{e['stages_logged']} recorded stage by stage"] if e["stages_logged"] else []
    if e["stages_split"]:
        parts.append(f"{e['stages_split']} split from the log's whole-evaluation seconds "
                     f"({e['split_from_s']:,.1f} s) in the priors' proportions (compile:check:"
                     f"timing {p.compile_s:g}:{p.check_s:g}:{p.timing_s:g})")
    if e["stages_prior"]:
        parts.append(f"{e['stages_prior']} with stages from the priors")
    cold = e["cold_starts_logged"] + e["cold_starts_prior"]
    return (f"evaluation seconds of the log's {e['evaluations']} evaluations: "
            f"{'; '.join(parts) or 'none'}. Cold starts: {model.instance_policy()}; {cold} charged "
            f"({e['cold_starts_logged']} the log's, {e['cold_starts_prior']} at the prior, "
            f"{e['seconds']['cold_start']:,.0f} s)")
