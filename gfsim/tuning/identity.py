"""What a tuning study is: the settings that decide its trials' values, recorded in the study.

A trial's values depend on the log's bytes, the policy and the search space, the driver and the
search shape, where children come from, the cost model's figures, the budget, the objectives
and constraint, the seeds, the forecaster, the pipeline and measurement noise. They are kept in
the study's user attributes (``CONFIG_ATTR``) when it is made; a study opened again with other
settings is refused, naming what differs, instead of mixing trials of two experiments (or
reporting one study's trials under another's settings). Settings that change no trial value
(``--jobs``, ``--workers``, ``--trials``, the sampler, what is printed) are not part of it. The
default study name carries a short hash of the configuration, so new settings start a new
study and the same command resumes its own.

It touches a study only through its methods: optuna is imported by ``study`` alone.
"""

from __future__ import annotations

import hashlib
import json
import re

from gfsim.core.errors import GfsimError

__all__ = ["CONFIG_ATTR", "VERSION_ATTR", "RUNS_ATTR", "log_sha256", "cost_model_sha256",
           "configuration", "configuration_hash", "default_study_name", "differences",
           "claim_study"]

CONFIG_ATTR = "gfsim_configuration"
VERSION_ATTR = "gfsim_version"  # recorded beside it, not compared: see ``claim_study``
RUNS_ATTR = "gfsim_runs"  # each gfsim tune that ran the study: its effective settings
_LEGACY_ATTR = "setup"  # what gfsim wrote before configurations were recorded


def log_sha256(log) -> str:
    """The SHA-256 of the log file's bytes as stored: the digest that names the log's columnar
    cache (``replay_logs.cache``), so one log has one identity everywhere in gfsim."""
    from pathlib import Path

    from gfsim.replay_logs.cache import _digest
    from gfsim.replay_logs.io import read_raw

    return _digest(read_raw(Path(log.path)))


def cost_model_sha256(model) -> str:
    """A hash of the cost model's effective figures (its dataclass repr holds every price and
    prior), so an edited TOML file under the same name is a different model."""
    return hashlib.sha256(repr(model).encode()).hexdigest()[:16]


def configuration(*, log, policy: str, params, driver: str, search, children: str,
                  forecaster: str | None, learning, cost: str, model, budget, objectives,
                  constraint, target: float, seeds: list[int] | None) -> dict:
    """The settings a trial's values depend on, as plain JSON values, in the order differences
    are named. ``seeds`` None: a configuration no seed can change (each trial replays once)."""
    from gfsim.simulator.pipeline import DEFAULT_PIPELINE

    names = [n for n, _ in objectives]
    return {
        "policy": policy,
        "params": [p.spec() for p in params],
        "driver": driver,
        "search": search.as_dict() if search is not None else None,
        "children": children,
        "log": log.name,
        "log_sha256": log_sha256(log),
        "forecaster": forecaster,
        "learning": repr(learning) if learning is not None else None,
        "cost_model": cost,
        "cost_model_sha256": cost_model_sha256(model),
        "budget": budget.as_dict(),
        "objectives": [list(o) for o in objectives],
        "constraint": list(constraint) if constraint is not None else None,
        # --target only enters a trial's values through cost_to_target.
        "target": target if "cost_to_target" in names else None,
        "seeds": list(seeds) if seeds is not None else None,
        "pipeline": str(DEFAULT_PIPELINE),  # tune replays the default pipeline ...
        "measure_noise": None,  # ... without measurement noise
    }


def configuration_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def default_study_name(config: dict) -> str:
    """``gfsim-tune-POLICY-HASH``: the same settings give the same name (a rerun resumes),
    other settings another (a new study)."""
    return f"gfsim-tune-{config['policy']}-{configuration_hash(config)[:8]}"


def _show(key: str, value) -> str:
    if value is None:
        return "none"
    if key.endswith("_sha256"):
        return value[:16]
    if key == "seeds" and value == list(range(value[0], value[0] + len(value))):
        return f"{value[0]}..{value[-1]}"
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 120 else text[:117] + "..."


def differences(recorded: dict, config: dict) -> list[str]:
    """``KEY=RECORDED, not NOW`` for each setting ``recorded`` holds that ``config`` does not
    match (settings ``recorded`` lacks are not compared)."""
    return [f"{k}={_show(k, recorded[k])}, not {_show(k, config[k])}" for k in config
            if k in recorded and json.loads(json.dumps(recorded[k])) != json.loads(
                json.dumps(config[k]))]


def _legacy(setup: dict, config: dict) -> dict:
    """The part of an older gfsim's ``setup`` attribute that can be compared with ``config``:
    it held the log's name, not its bytes, and the seeds as a count and a first seed."""
    from gfsim.simulator import parse_budget

    out = {k: setup[k] for k in ("policy", "params", "driver", "children", "forecaster")
           if k in setup}
    if "log" in setup:
        out["log"] = setup["log"]
    if "cost" in setup:
        out["cost_model"] = setup["cost"]
    if "budget" in setup:
        out["budget"] = parse_budget(setup["budget"]).as_dict()
    if config["seeds"] is not None and "seeds" in setup and "seed" in setup:
        out["seeds"] = list(range(setup["seed"], setup["seed"] + setup["seeds"]))
    return out


def _where(url: str) -> str:
    """The storage as printed: a password in a database URL is not."""
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


def claim_study(study, config: dict, url: str) -> str | None:
    """Check that ``study`` was made with ``config`` and record it there; returns a note when
    the study is an older gfsim's, adopted. Refused in one line (``GfsimError``) when the
    recorded settings differ, or when a study that holds trials records none.

    A study an older gfsim made records a partial ``setup`` (log name, policy, parameters,
    driver, children, cost, budget, forecaster, seeds): it is adopted when those agree, its
    configuration recorded from then on. The gfsim version is recorded, not compared: a
    study outlives an upgrade, and its trials' values then come from two versions."""
    from gfsim import __version__

    attrs = study.user_attrs
    recorded = attrs.get(CONFIG_ATTR)
    legacy = recorded is None and isinstance(attrs.get(_LEGACY_ATTR), dict)
    if recorded is None and legacy:
        recorded = _legacy(attrs[_LEGACY_ATTR], config)
    if recorded is not None:
        diff = differences(recorded, config)
        if diff:
            raise GfsimError(f"study {study.study_name!r} in {_where(url)} was made with "
                             f"{'; '.join(diff)}; use another `study` name or the same "
                             "settings")
    elif study.get_trials(deepcopy=False):
        raise GfsimError(f"study {study.study_name!r} in {_where(url)} holds trials but no "
                         "record of the settings they were run with (not made by gfsim tune); "
                         "use another `study` name")
    if attrs.get(CONFIG_ATTR) != config:
        study.set_user_attr(CONFIG_ATTR, config)
    versions = attrs.get(VERSION_ATTR) or []
    if __version__ not in versions:
        study.set_user_attr(VERSION_ATTR, [*versions, __version__])
    if legacy:
        return (f"study {study.study_name!r} was made by an older gfsim that recorded part of "
                "its settings; those agree, and the whole configuration is recorded now")
    if len(versions) and versions != [__version__]:
        return (f"study {study.study_name!r} holds trials run by gfsim "
                f"{', '.join(versions)}; this is {__version__}")
    return None
