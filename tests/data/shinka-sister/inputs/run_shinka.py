"""Runs ShinkaEvolve for the fixture (executed by --shinka-python)."""
import json
import sys

from shinka.core import EvolutionConfig, ShinkaEvolveRunner
from shinka.database import DatabaseConfig
from shinka.launch import LocalJobConfig

cfg = json.loads(sys.argv[1])
evo = EvolutionConfig(
    llm_models=cfg["llm_models"], llm_dynamic_selection=None,
    llm_kwargs={"temperatures": [0.0], "max_tokens": 512},
    patch_types=["full"], patch_type_probs=[1.0], num_generations=cfg["generations"],
    max_patch_resamples=1,  # a proposal the noise model spoils fails: attempt_log has rows
    job_type="local", language="python", embedding_model=None, meta_rec_interval=None,
    meta_llm_models=None, novelty_llm_models=None, init_program_path=cfg["initial"],
    results_dir=cfg["results"])
job = LocalJobConfig(eval_program_path=cfg["evaluate"], python_executable=cfg["python"],
                     time="00:05:00")
db = DatabaseConfig(num_islands=2, archive_size=8, migration_interval=4)
ShinkaEvolveRunner(evo_config=evo, job_config=job, db_config=db, max_evaluation_jobs=1,
                   max_proposal_jobs=1, max_db_workers=1, verbose=False).run()
