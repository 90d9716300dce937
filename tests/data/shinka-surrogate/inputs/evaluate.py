"""The fixture's evaluation script with gfsim's surrogate in front (--surrogate)."""
from gfsim.integrations.kernel_evaluator import evaluate_kernel
from gfsim.integrations.shinka import ShinkaGate


def evaluate(program_path):
    return evaluate_kernel(program_path, "softmax")


ShinkaGate(evaluate, runtime_metric="runtime_ns", policy='random:0.5', forecaster='vllm:http://127.0.0.1:8019/v1,model=tiny,mode=logprobs,max_prompt_tokens=400',
           log='/tmp/gfsim-shinka-fixture-i4m7w7vi/gfsim-surrogate.jsonl', task="softmax").main()
