"""Offline throughput: one workload through pdserve, HF static batching, HF continuous batching
and vLLM-CPU, side by side, against this machine's fp32 compute roofline.

    python benchmarks/offline_throughput.py \\
        --engines pdserve,hf-static,hf-cb,vllm \\
        --vllm-python /work/vllm-venv/bin/python --out results.json

The workload: ``--num-requests`` random token-id prompts (lengths uniform in
``--prompt-len``), each generating exactly its own output length (uniform in ``--output-len``),
greedy, EOS ignored, fixed seed, on a random-weight Llama with the SmolLM2-135M shape in fp32
(created once under ``--model-dir``). Each engine runs in its own subprocess (vLLM's with
``--vllm-python``, see benchmarks/README.md): load, a short warm-up, then ``--repeats`` timed
passes over the whole workload. Wall time counts neither the load nor the warm-up.

Reported per engine: median output tokens/s, pdserve's speed-up over it, the fraction of
the compute roofline it reaches (roofline time = the workload's minimal matmul FLOPs / the
best fp32 GEMM rate measured at the model's shapes in this run, ``F.linear``'s or pdserve's
packed GEMM's, whichever is faster: ``benchmarks/roofline.py``), and the fraction of the
workload's physical floor (``benchmarks/floor.py``: prefill FLOPs at that GEMM rate plus decode
steps x weight and KV bytes at the read bandwidth measured in the same run). Greedy outputs are
compared with pdserve's request by request; an exact-match count is printed, divergences are
not hidden. ``pdserve-torch`` is pdserve without its compiled CPU kernels
(``PDSERVE_CPU_KERNELS=0``: the torch attention backend and torch layers), the path a machine
without a C++ compiler takes. ``pdserve-fp32-panels`` keeps every weight on float32 panels
(``PDSERVE_BF16_EXACT_WEIGHTS=0``): with ``--checkpoint-dtype bfloat16``, against ``pdserve``,
it shows what packing bf16-exact weights as bf16 gives. ``pdserve-fp32-head`` takes greedy
tokens from the float32 logits (``PDSERVE_CPU_GREEDY_HEAD=0``): against ``pdserve``, what the
screened greedy lm_head gives.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
from benchmarks import throughput_report as report  # noqa: E402
from benchmarks.floor import physical_floor  # noqa: E402
from benchmarks.machine_load import loadavg, wait_for_quiet  # noqa: E402
from benchmarks.workloads import (  # noqa: E402
    SHAPES,
    add_checkpoint_dtype,
    default_model_dir,
    ensure_model_folder,
    make_workload,
    model_shape,
    workload_flops,
    workload_to_json,
)

ENGINES: tuple[str, ...] = ("pdserve", "pdserve-torch", "pdserve-fp32-panels")
ENGINES += ("pdserve-fp32-head", "hf-static", "hf-cb", "vllm")
RUNNER = REPO_ROOT / "benchmarks" / "engine_runners.py"
ROOFLINE = REPO_ROOT / "benchmarks" / "roofline.py"
GPU_ROOFLINE = REPO_ROOT / "benchmarks" / "gpu_roofline.py"
BYTES_PER_ELEMENT = {"float32": 4, "bfloat16": 2, "float16": 2}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--engines",
        default="pdserve,pdserve-torch,hf-static,hf-cb,vllm",
        help="comma-separated subset of " + ",".join(ENGINES),
    )
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--prompt-len", type=int, nargs=2, default=[32, 512], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[16, 256], metavar=("MIN", "MAX"))
    p.add_argument("--seed", type=int, default=0, help="workload seed (the model's seed is fixed)")
    p.add_argument(
        "--repeats", type=int, default=2, help="timed passes per engine (median reported)"
    )
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m", help="model shape")
    p.add_argument("--model-dir", type=Path, default=None, help="default: by --shape, cached")
    add_checkpoint_dtype(
        p, "; the floor then counts the weights at the 2 bytes that read them exactly"
    )
    p.add_argument(
        "--plan-only",
        action="store_true",
        help="print the workload and the engines' commands, run nothing, create nothing",
    )
    p.add_argument(
        "--skip-roofline",
        action="store_true",
        help="no GEMM/bandwidth measurement; no roofline or floor columns",
    )
    p.add_argument(
        "--gpu-roofline",
        action="store_true",
        help="measure the roofline and floor on the CUDA device (gpu_roofline.py: GEMMs in "
        "--pdserve-dtype, HBM read bandwidth) instead of this machine's CPU",
    )
    p.add_argument("--out", type=Path, help="write raw results as JSON here")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per engine subprocess")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0,
        metavar="MAX_S",
        help="before each engine, wait up to MAX_S seconds for other jobs to use under "
        "--quiet-threshold of the cores (this machine is shared); 0: do not wait",
    )
    p.add_argument("--quiet-threshold", type=float, default=0.2)
    p.add_argument(
        "--omp-wait-policy",
        choices=("passive", "active"),
        default=None,
        help="set OMP_WAIT_POLICY for every engine (default: leave the environment alone). "
        "With other jobs on the cores, libgomp's spinning threads can slow torch several-fold; "
        "passive avoids that",
    )
    g = p.add_argument_group("pdserve")
    g.add_argument("--pdserve-max-num-seqs", type=int, default=None, help="default: pdserve's")
    g.add_argument(
        "--pdserve-max-num-batched-tokens", type=int, default=None, help="default: pdserve's"
    )
    g.add_argument(
        "--pdserve-max-prefill-tokens-with-decodes", type=int, default=None,
        help="default: the offline LLM's (0: prefill chunks take the whole budget)",
    )  # fmt: skip
    g.add_argument("--pdserve-num-kv-blocks", type=int, default=None, help="default: pdserve's")
    g.add_argument("--pdserve-dtype", default="float32", help="pdserve engines' dtype")
    g.add_argument(
        "--pdserve-skip-tokenizer-init",
        action="store_true",
        help="no detokenization (as the vLLM runner); default: pdserve detokenizes",
    )
    g = p.add_argument_group("HF transformers")
    g.add_argument("--hf-batch-size", type=int, default=8, help="static batch size for generate")
    g.add_argument("--hf-device", default="cpu", help="cpu | cuda: where HF's model runs")
    g.add_argument("--hf-dtype", default="float32", help="HF model's dtype")
    g.add_argument("--hf-cb-page-size", type=int, default=256)
    g.add_argument("--hf-cb-num-blocks", type=int, default=160)
    g.add_argument("--hf-cb-max-batch-tokens", type=int, default=512)
    g = p.add_argument_group("vLLM")
    g.add_argument(
        "--vllm-python",
        default=os.environ.get("PDSERVE_BENCH_VLLM_PYTHON"),
        help="python of the vLLM-CPU venv (default: env PDSERVE_BENCH_VLLM_PYTHON); "
        "see benchmarks/README.md",
    )
    g.add_argument("--vllm-max-num-batched-tokens", type=int, default=None)
    g.add_argument("--vllm-max-num-seqs", type=int, default=None)
    g.add_argument("--vllm-kv-cache-gib", type=int, default=4)
    args = p.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(args.engines) - set(ENGINES)
    if unknown:
        p.error(f"unknown engines {sorted(unknown)}; choose from {ENGINES}")
    if "vllm" in args.engines and not args.vllm_python:
        p.error("--vllm-python is required for the vllm engine")
    if args.model_dir is None:
        args.model_dir = default_model_dir(args.shape, args.checkpoint_dtype)
    return args


def engine_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    pdserve = {
        "max_num_seqs": args.pdserve_max_num_seqs,
        "max_num_batched_tokens": args.pdserve_max_num_batched_tokens,
        "max_prefill_tokens_with_decodes": args.pdserve_max_prefill_tokens_with_decodes,
        "num_kv_blocks": args.pdserve_num_kv_blocks,
        "skip_tokenizer_init": args.pdserve_skip_tokenizer_init or None,
        "dtype": args.pdserve_dtype,
    }
    return {
        "pdserve": pdserve,
        "pdserve-torch": pdserve,
        "pdserve-fp32-panels": pdserve,
        "pdserve-fp32-head": pdserve,
        "hf-static": {
            "batch_size": args.hf_batch_size,
            "device": args.hf_device,
            "dtype": args.hf_dtype,
        },
        "hf-cb": {
            "device": args.hf_device,
            "dtype": args.hf_dtype,
            "page_size": args.hf_cb_page_size,
            "num_blocks": args.hf_cb_num_blocks,
            "max_batch_tokens": args.hf_cb_max_batch_tokens,
        },
        "vllm": {
            "max_num_batched_tokens": args.vllm_max_num_batched_tokens,
            "max_num_seqs": args.vllm_max_num_seqs,
            "kv_cache_gib": args.vllm_kv_cache_gib,
        },
    }


def run_subprocess(cmd: list[str], env: dict[str, str], timeout: float) -> None:
    """Run ``cmd`` in its own process group; afterwards end whatever of that group is left
    (vLLM's engine-core and worker processes must not keep computing during the next engine)."""
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    if rc != 0:
        raise subprocess.CalledProcessError(rc, cmd)


def measure_roofline(args: argparse.Namespace, tmp: Path, tag: str) -> dict[str, Any]:
    if args.wait_quiet:
        wait_for_quiet(args.wait_quiet, args.quiet_threshold)
    out = tmp / f"gemm_{tag}.json"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    if args.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
    if args.gpu_roofline:  # the card's rates, in the dtype pdserve runs
        probe = [str(GPU_ROOFLINE), "--shape", args.shape, "--dtype", args.pdserve_dtype]
    else:
        probe = [str(ROOFLINE)]
    run_subprocess([sys.executable, *probe, "--out", str(out)], env, 600)
    result: dict[str, Any] = json.loads(out.read_text())
    result["loadavg"] = loadavg()
    return result


def run_engine(engine: str, args: argparse.Namespace, spec_path: Path, tmp: Path) -> dict[str, Any]:
    out = tmp / f"{engine}.json"
    if engine == "vllm":
        python = args.vllm_python
        # vLLM's venv must not see the repo (it would not, but keep its sys.path its own).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    else:
        python = sys.executable
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    if args.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
    quiet = wait_for_quiet(args.wait_quiet, args.quiet_threshold) if args.wait_quiet else None
    loadavg_before = loadavg()
    t0 = time.perf_counter()
    run_subprocess(
        [python, str(RUNNER), "--engine", engine, "--spec", str(spec_path), "--out", str(out)],
        env,
        args.timeout,
    )
    result: dict[str, Any] = json.loads(out.read_text())
    result["process_wall_s"] = time.perf_counter() - t0
    result["loadavg_before"] = loadavg_before
    result["wait_quiet"] = quiet
    result["loadavg_after"] = loadavg()
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    shape = model_shape(args.shape)
    if args.plan_only:
        requests = make_workload(
            args.num_requests,
            tuple(args.prompt_len),
            tuple(args.output_len),
            shape.vocab_size,
            args.seed,
        )
        prompt = sum(len(r.prompt_token_ids) for r in requests)
        output = sum(r.max_tokens for r in requests)
        print(f"shape {args.shape}: {shape}; model folder {args.model_dir}")
        print(f"workload: {len(requests)} requests, {prompt} prompt + {output} output tokens")
        for engine in args.engines:
            print(f"engine {engine}: {RUNNER.name} --engine {engine}, {args.repeats} passes")
        probe = GPU_ROOFLINE if args.gpu_roofline else ROOFLINE
        print("roofline/floor:", "skipped" if args.skip_roofline else f"{probe.name} twice")
        return
    model_dir = ensure_model_folder(
        args.model_dir, shape=args.shape, checkpoint_dtype=args.checkpoint_dtype
    )
    requests = make_workload(
        args.num_requests,
        tuple(args.prompt_len),
        tuple(args.output_len),
        shape.vocab_size,
        args.seed,
    )
    warmup = make_workload(2, (32, 64), (4, 8), shape.vocab_size, args.seed + 1_000_003)
    totals = {
        "prompt": sum(len(r.prompt_token_ids) for r in requests),
        "output": sum(r.max_tokens for r in requests),
    }
    flops = workload_flops(requests, shape)
    spec = {
        "model": str(model_dir),
        "requests": workload_to_json(requests),
        "warmup_requests": workload_to_json(warmup),
        "repeats": args.repeats,
        "options": engine_options(args),
    }

    with tempfile.TemporaryDirectory(prefix="pdserve-bench-") as tmp_name:
        tmp = Path(tmp_name)
        spec_path = tmp / "spec.json"
        spec_path.write_text(json.dumps(spec))
        gemm = (
            [] if args.skip_roofline else [dict(measure_roofline(args, tmp, "start"), tag="start")]
        )
        results: dict[str, dict[str, Any]] = {}
        for engine in args.engines:
            results[engine] = run_engine(engine, args, spec_path, tmp)
        if not args.skip_roofline:
            gemm.append(dict(measure_roofline(args, tmp, "end"), tag="end"))

    gemm_gflops = max((g["best_layer_gflops"] for g in gemm), default=None)
    read_gbps = max((g["read_gbps"] for g in gemm), default=None)
    floor = screened = None
    if gemm_gflops is not None and read_gbps is not None:
        element = BYTES_PER_ELEMENT[args.pdserve_dtype] if args.gpu_roofline else 4
        # A bf16 checkpoint's weights need only 2 bytes each to be read exactly.
        weight_element = min(element, BYTES_PER_ELEMENT[args.checkpoint_dtype])
        probes = (requests, shape, gemm_gflops, read_gbps, element, weight_element)
        floor = physical_floor(*probes)
        screened = None if args.gpu_roofline else physical_floor(*probes, screened_head=True)
    summary = report.summarize(results, flops, gemm_gflops, floor)
    agreement: dict[str, dict[str, Any]] = {}
    if "pdserve" in results:
        ref = results["pdserve"]["output_token_ids"]
        for engine, r in results.items():
            if engine != "pdserve":
                agreement[engine] = report.compare_outputs(ref, r["output_token_ids"])
    # HF's two modes against each other: how much the oracle disagrees with itself.
    if "hf-static" in results and "hf-cb" in results:
        hf_self = report.compare_outputs(
            results["hf-static"]["output_token_ids"], results["hf-cb"]["output_token_ids"]
        )
    else:
        hf_self = None

    report.print_report(args, totals, flops, gemm, gemm_gflops, floor, results, summary, agreement)
    report.print_screened_floor(screened, summary, results)
    if hf_self is not None:
        print(f"hf-static vs hf-cb: {hf_self['num_exact']}/{hf_self['num_requests']} exact")

    if args.out:
        raw = {
            "argv": sys.argv,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": {"nproc": os.cpu_count(), "loadavg_end": loadavg()},
            "workload": {"totals": totals, "flops": flops, "requests": spec["requests"]},
            "gemm": gemm,
            "gemm_gflops_roofline": gemm_gflops,
            "read_gbps": read_gbps,
            "floor": report.floor_json(floor),
            "floor_screened_head": report.floor_json(screened),
            "summary": summary,
            "agreement_vs_pdserve": agreement,
            "agreement_hf_static_vs_hf_cb": hf_self,
            "engines": results,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(raw, indent=1))
        print(f"raw results: {args.out}")


if __name__ == "__main__":
    main()
