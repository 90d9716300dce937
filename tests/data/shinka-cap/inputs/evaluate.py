"""The fixture's evaluation script with gfsim's gate in front (--surrogate, --cap)."""
import json
from pathlib import Path

from gfsim.integrations.cap import DollarCap
from gfsim.integrations.kernel_evaluator import evaluate_kernel
from gfsim.integrations.shinka import ShinkaGate

# --cap: the run's dollar cap as the fixture's proxies hold it (cap.json, beside this file)
CAP_FILE = Path(__file__).with_name("cap.json")
CAP = None
if CAP_FILE.exists():
    CAP = DollarCap(**{k: tuple(v) if isinstance(v, list) else v
                       for k, v in json.loads(CAP_FILE.read_text()).items()})


def evaluate(program_path):
    return evaluate_kernel(program_path, "softmax")


ShinkaGate(evaluate, runtime_metric="runtime_ns", policy='all', forecaster=None,
           log='/tmp/gfsim-shinka-fixture-apej7l79/gfsim-surrogate.jsonl', task="softmax", cap=CAP).main()
