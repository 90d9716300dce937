"""The parent-selection settings an OpenEvolve or ShinkaEvolve run recorded, for its run record.

A closed-loop replay of such a run re-runs its own evolutionary algorithm
(``gfsim.simulator.closed.evolution``) with these settings; what a run's folder does not record is
left out here, and the replay fills it with the tool's documented default and says so.

- OpenEvolve: the ``database`` section of the run's YAML configuration, found in the run
  folder, beside it, or in an ``inputs`` folder beside it (OpenEvolve writes its output next to
  the initial program, where its config usually lives; it does not copy the config into the
  run), else the number of islands its checkpoints hold.
- ShinkaEvolve: the database settings of a configuration saved in the run folder (Hydra's
  ``.hydra/config.yaml`` or ``experiment_config.yaml``), else what its program database shows:
  the islands its programs sit on.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["openevolve_selection", "shinka_selection", "recorded_selection", "OPENEVOLVE_KEYS",
           "SHINKA_KEYS"]

# The tools' database settings -> gfsim.simulator.closed.evolution.EvolutionConfig fields.
OPENEVOLVE_KEYS = {"num_islands": "islands", "exploration_ratio": "exploration_ratio",
                   "exploitation_ratio": "exploitation_ratio",
                   "elite_selection_ratio": "elite_selection_ratio",
                   "archive_size": "archive_size", "population_size": "population_size",
                   "migration_interval": "migration_interval",
                   "migration_rate": "migration_rate"}
SHINKA_KEYS = {"num_islands": "islands", "parent_selection_strategy": "strategy",
               "exploitation_alpha": "exploitation_alpha",
               "exploitation_ratio": "exploitation_ratio",
               "parent_selection_lambda": "parent_selection_lambda", "num_beams": "num_beams",
               "archive_size": "archive_size", "migration_interval": "migration_interval",
               "migration_rate": "migration_rate"}


def _yaml(path: Path, root: Path) -> dict | None:
    """A run's YAML settings, read as an input (bounded, a regular file inside ``root``: a
    link out of it is not followed); None where there is none fit to read."""
    from gfsim.replay_logs.io import read_input

    try:
        import yaml

        data = yaml.safe_load(read_input(path, root=root).decode("utf-8"))
    except Exception:  # noqa: BLE001 - an unreadable config is one the run did not leave
        return None
    return data if isinstance(data, dict) else None


def _pick(section: dict, keys: dict) -> dict:
    out = {}
    for key, field in keys.items():
        v = section.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            continue
        out[field] = v
    return out


def openevolve_selection(run: Path, islands_in_checkpoints: int | None) -> dict:
    """``{"from": where, "settings": {field: value}}`` of an OpenEvolve run folder."""
    run = Path(run)
    for path in (run / "config.yaml", run.parent / "config.yaml",
                 run.parent / "inputs" / "config.yaml"):
        data = _yaml(path, path.parent if path.parent == run else run.parent) \
            if path.is_file() else None
        if data and isinstance(data.get("database"), dict):
            where = path.relative_to(run.parent).as_posix()
            return {"from": f"{where} (database section)",
                    "settings": _pick(data["database"], OPENEVOLVE_KEYS)}
    if islands_in_checkpoints:
        return {"from": "the checkpoints' islands (no configuration file found)",
                "settings": {"islands": int(islands_in_checkpoints)}}
    return {"from": "nothing (no configuration file found)", "settings": {}}


def shinka_selection(run: Path, islands_seen: int) -> dict:
    """``{"from": where, "settings": {field: value}}`` of a ShinkaEvolve run folder."""
    run = Path(run)
    for path in (run / ".hydra" / "config.yaml", run / "experiment_config.yaml",
                 run / "config.yaml"):
        data = _yaml(path, run) if path.is_file() else None
        section = (data or {}).get("database") or (data or {}).get("db_config")
        if isinstance(section, dict):
            return {"from": f"{path.relative_to(run).as_posix()} (database settings)",
                    "settings": _pick(section, SHINKA_KEYS)}
    settings = {"islands": int(islands_seen)} if islands_seen else {}
    return {"from": "the program database (the islands its programs sit on; no "
                    "configuration file found)", "settings": settings}


def recorded_selection(found: dict) -> dict:
    """The run record's keys for what ``openevolve_selection``/``shinka_selection`` found:
    ``selection`` (the settings) and ``selection_from`` (where they were read)."""
    return {"selection": found["settings"], "selection_from": found["from"]}
