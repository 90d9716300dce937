"""Where does per-repetition timing noise come from? (a diagnostic for the H200 runs)

    PYTHONPATH=. python3 experiments/timing_diag.py

Times one softmax candidate under variants of the event protocol and prints, per variant, the
per-repetition CV, mean and median, and the CV of the mean over 5 separate runs.
"""

from __future__ import annotations

import statistics
import time

import torch

from gfsim.live.tasks import get_task


def run_variant(fn, inputs, flush, mode, reps=100):
    times = []
    for _ in range(reps):
        if flush is not None:
            flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if mode == "presync_end_then_sync":
            torch.cuda.synchronize()
        s.record()
        fn(*inputs)
        if mode == "sync_then_end":
            torch.cuda.synchronize()
            e.record()
            e.synchronize()
        else:  # end_then_sync, presync_end_then_sync
            e.record()
            torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return times


def cv(xs) -> float:
    return statistics.stdev(xs) / statistics.fmean(xs)


def main():
    task = get_task("softmax")
    cand = task.candidates()[0]
    path = "/tmp/diag_candidate.py"
    open(path, "w").write(cand.code)
    import importlib.util
    spec = importlib.util.spec_from_file_location("diag_candidate", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn = mod.run
    for dims in task.bench_shapes:
        inputs = task.make_inputs(dims, 0, "cuda")
        for _ in range(5):
            fn(*inputs)
        torch.cuda.synchronize()
        flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        for use_flush in (True, False):
            for mode in ("sync_then_end", "end_then_sync", "presync_end_then_sync"):
                means, medians, cvs = [], [], []
                t0 = time.perf_counter()
                for _ in range(5):
                    t = run_variant(fn, inputs, flush if use_flush else None, mode)
                    means.append(statistics.fmean(t))
                    medians.append(statistics.median(t))
                    cvs.append(statistics.stdev(t) / statistics.fmean(t))
                wall = (time.perf_counter() - t0) / 5
                print(f"{str(dims):28s} flush={use_flush!s:5s} {mode:22s} rep-CV "
                      f"{statistics.fmean(cvs):6.2%} mean {statistics.fmean(means)*1e3:8.1f}us "
                      f"run-CV(mean) {cv(means):6.2%} run-CV(median) {cv(medians):6.2%} "
                      f"wall/100 reps {wall:.3f}s", flush=True)


if __name__ == "__main__":
    main()
