"""The fixture's evaluator: a task-suite softmax kernel, measured by gfsim (interpreter)."""
from gfsim.integrations.kernel_evaluator import evaluate_kernel


def evaluate(program_path):
    return evaluate_kernel(program_path, "softmax")
