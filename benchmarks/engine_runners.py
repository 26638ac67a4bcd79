"""Run one engine over a saved workload and write its timings and generated token ids as JSON.

    python benchmarks/engine_runners.py --engine hf-static --spec spec.json --out result.json

Started as a subprocess by ``offline_throughput.py``, one process per engine, so engines never
share threads, caches or allocator state. It imports only the standard library at the top
(each engine's package is imported inside its runner), so the vLLM runner works from vLLM's
own virtual environment, which has no pdserve installed.

The spec (JSON) holds: ``model`` (folder), ``requests`` and ``warmup_requests`` (lists of
``{"prompt_token_ids": [...], "max_tokens": n}``), ``repeats``, and ``options`` (per-engine
settings). Every engine decodes greedily, ignores EOS and generates exactly ``max_tokens``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Requests = list[dict[str, Any]]

# Run as a script, this file's folder comes first on sys.path, where benchmarks/kernels.py would
# shadow the `kernels` package the engine imports. Nothing is imported from that folder.
if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
    sys.path.pop(0)


@dataclass
class Loaded:
    """A loaded engine: how long loading took, how to run requests, how to shut it down."""

    load_s: float
    # Runs a list of requests to completion; returns each one's generated token ids, in order.
    run: Callable[[Requests], list[list[int]]]
    settings: dict[str, Any]
    close: Callable[[], None] = lambda: None
    # Empties the engine's prefix cache before each timed pass, so no pass reuses the prompts
    # an earlier one computed (every pass prefills in full, as the physical floor assumes);
    # returns whether it did. None: the engine keeps no prefix cache across calls.
    reset_prefix_cache: Callable[[], bool] | None = None


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies over all cores since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _tree_cpu_jiffies() -> int:
    """CPU jiffies (user + system) of this process and all its descendants alive now (vLLM's
    engine-core and worker processes included)."""
    parent_of: dict[int, int] = {}
    cpu_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        parent_of[int(entry)] = int(fields[1])
        cpu_of[int(entry)] = int(fields[11]) + int(fields[12])  # utime + stime
    tree, frontier = {os.getpid()}, [os.getpid()]
    while frontier:
        pid = frontier.pop()
        for child, parent in parent_of.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(cpu_of.get(pid, 0) for pid in tree)


# ---------------------------------------------------------------------------------------------
# pdserve


def load_pdserve(model: str, options: dict[str, Any]) -> Loaded:
    t0 = time.perf_counter()
    from pdserve import LLM, SamplingParams

    # Unset options keep the engine's own defaults.
    kwargs: dict[str, Any] = {"dtype": options.get("dtype") or "float32"}
    keys = ("max_num_seqs", "max_num_batched_tokens", "max_prefill_tokens_with_decodes",
            "num_kv_blocks", "skip_tokenizer_init")  # fmt: skip
    for key in keys:
        if options.get(key) is not None:
            kwargs[key] = options[key]
    llm = LLM(model=model, **kwargs)
    load_s = time.perf_counter() - t0

    def run(requests: Requests) -> list[list[int]]:
        prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in requests]
        params = [
            SamplingParams(temperature=0.0, max_tokens=r["max_tokens"], ignore_eos=True)
            for r in requests
        ]
        outputs = llm.generate(prompts, params)
        return [list(o.token_ids) for o in outputs]

    # Which screen greedy rows took (engine/models/greedy_head.py; "" where the head is off or
    # the build has none). The report prices the screened floor only where one ran.
    head = getattr(llm.engine.runner.model, "lm_head", None)
    settings = {"llm_kwargs": kwargs, "greedy_head": getattr(head, "screen_kind", "")}
    return Loaded(load_s, run, settings, reset_prefix_cache=llm.reset_prefix_cache)


def load_pdserve_torch(model: str, options: dict[str, Any]) -> Loaded:
    """pdserve without its compiled CPU kernels (the torch attention backend and torch layers):
    the previous CPU path, and what a machine without a C++ compiler runs."""
    os.environ["PDSERVE_CPU_KERNELS"] = "0"
    return load_pdserve(model, options)


def load_pdserve_fp32_panels(model: str, options: dict[str, Any]) -> Loaded:
    """pdserve with every weight on float32 panels, even where bf16 holds the weights exactly
    (``PDSERVE_BF16_EXACT_WEIGHTS=0``): against ``pdserve`` on a bf16 checkpoint, what the
    bf16 panels give."""
    os.environ["PDSERVE_BF16_EXACT_WEIGHTS"] = "0"
    return load_pdserve(model, options)


def load_pdserve_fp32_head(model: str, options: dict[str, Any]) -> Loaded:
    """pdserve with greedy rows' tokens from the float32 logits (``PDSERVE_CPU_GREEDY_HEAD=0``),
    not the bf16-screened lm_head: against ``pdserve``, what the greedy head gives."""
    os.environ["PDSERVE_CPU_GREEDY_HEAD"] = "0"
    return load_pdserve(model, options)


# ---------------------------------------------------------------------------------------------
# Hugging Face transformers


def _load_hf_model(model: str, options: dict[str, Any]) -> Any:
    """The HF model in ``options["dtype"]`` (default fp32) on ``options["device"]`` (cpu)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, str(options.get("dtype") or "float32"))
    hf_model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
    hf_model.to(torch.device(str(options.get("device") or "cpu")))  # type: ignore[arg-type]
    hf_model.eval()
    return hf_model


def load_hf_static(model: str, options: dict[str, Any]) -> Loaded:
    """HF ``generate`` over static, left-padded batches taken in request order.

    A batch runs until its longest request is done; tokens past a request's own ``max_tokens``
    are computed and thrown away (that waste is what static batching costs).
    """
    t0 = time.perf_counter()
    import torch
    from transformers import GenerationConfig

    hf_model = _load_hf_model(model, options)
    device = hf_model.device
    load_s = time.perf_counter() - t0
    batch_size = int(options.get("batch_size", 8))
    pad_id = 0

    def run(requests: Requests) -> list[list[int]]:
        results: list[list[int]] = []
        for start in range(0, len(requests), batch_size):
            batch = requests[start : start + batch_size]
            max_prompt = max(len(r["prompt_token_ids"]) for r in batch)
            max_new = max(r["max_tokens"] for r in batch)
            input_ids = torch.full((len(batch), max_prompt), pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(batch), max_prompt), dtype=torch.long)
            for row, r in enumerate(batch):
                ids = r["prompt_token_ids"]
                input_ids[row, max_prompt - len(ids) :] = torch.tensor(ids)
                attention_mask[row, max_prompt - len(ids) :] = 1
            gen_config = GenerationConfig(
                do_sample=False,
                max_new_tokens=max_new,
                min_new_tokens=0,
                eos_token_id=None,  # ignore EOS: run to max_new_tokens
                pad_token_id=pad_id,
            )
            with torch.inference_mode():
                out = hf_model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=attention_mask.to(device),
                    generation_config=gen_config,
                )
            for row, r in enumerate(batch):
                gen = out[row, max_prompt:].tolist()
                if len(gen) < r["max_tokens"]:
                    raise RuntimeError(f"HF stopped early: {len(gen)} < {r['max_tokens']}")
                results.append(gen[: r["max_tokens"]])
        return results

    settings = {"batch_size": batch_size, "device": str(device), "dtype": str(hf_model.dtype)}
    return Loaded(load_s, run, settings)


def load_hf_cb(model: str, options: dict[str, Any]) -> Loaded:
    """HF continuous batching (the paged cache behind ``generate_batch``), one manager reused.

    ``generate_batch`` takes one ``max_new_tokens`` for all requests, so requests are added
    through the manager directly, each with its own ``max_new_tokens`` and EOS disabled (-1).
    On CPU ``num_blocks`` and ``max_batch_tokens`` must be given: the automatic sizing
    assumes GPU memory.
    """
    t0 = time.perf_counter()
    import torch
    from transformers import ContinuousBatchingConfig, GenerationConfig

    hf_model = _load_hf_model(model, options)
    cb_config = ContinuousBatchingConfig(
        page_size=int(options.get("page_size", 256)),
        num_blocks=int(options.get("num_blocks", 160)),
        max_batch_tokens=int(options.get("max_batch_tokens", 512)),
        use_cuda_graph=False,
        use_async_batching=False,
    )
    gen_config = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0)
    with torch.inference_mode():
        manager = hf_model.init_continuous_batching(
            generation_config=gen_config, continuous_batching_config=cb_config
        )
        manager.start()
    load_s = time.perf_counter() - t0

    def run(requests: Requests) -> list[list[int]]:
        ids = []
        for r in requests:
            req_id = manager.add_request(
                input_ids=r["prompt_token_ids"], max_new_tokens=r["max_tokens"], eos_token_id=-1
            )
            ids.append(req_id)
        done: dict[str, list[int]] = {}
        while len(done) < len(ids):
            result = manager.get_result(timeout=1)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError("HF continuous batching thread died")
                continue
            if result.is_finished():
                if result.error is not None:
                    raise RuntimeError(f"HF CB request failed: {result.error}")
                done[result.request_id] = list(result.generated_tokens)
        return [done[i] for i in ids]

    settings = {
        "page_size": cb_config.page_size,
        "num_blocks": cb_config.num_blocks,
        "max_batch_tokens": cb_config.max_batch_tokens,
    }
    return Loaded(load_s, run, settings, close=lambda: manager.stop(block=True, timeout=30))


# ---------------------------------------------------------------------------------------------
# vLLM (CPU build, in its own virtual environment)


def load_vllm(model: str, options: dict[str, Any]) -> Loaded:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(options.get("kv_cache_gib", 4)))
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams

    kwargs: dict[str, Any] = {
        "dtype": "float32",
        "enforce_eager": True,
        "skip_tokenizer_init": True,
        "seed": 0,
    }
    for key in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        if options.get(key) is not None:
            kwargs[key] = options[key]
    llm = LLM(model=model, **kwargs)
    load_s = time.perf_counter() - t0

    def run(requests: Requests) -> list[list[int]]:
        prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in requests]
        params = [
            SamplingParams(
                temperature=0.0, max_tokens=r["max_tokens"], ignore_eos=True, detokenize=False
            )
            for r in requests
        ]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]

    settings = dict(kwargs)
    settings["VLLM_CPU_KVCACHE_SPACE"] = os.environ["VLLM_CPU_KVCACHE_SPACE"]

    def close() -> None:
        # Stops the engine-core and worker processes; os._exit would leave them running.
        llm.llm_engine.engine_core.shutdown()

    return Loaded(load_s, run, settings, close, reset_prefix_cache=llm.reset_prefix_cache)


LOADERS: dict[str, Callable[[str, dict[str, Any]], Loaded]] = {
    "pdserve": load_pdserve,
    "pdserve-torch": load_pdserve_torch,
    "pdserve-fp32-panels": load_pdserve_fp32_panels,
    "pdserve-fp32-head": load_pdserve_fp32_head,
    "hf-static": load_hf_static,
    "hf-cb": load_hf_cb,
    "vllm": load_vllm,
}


def run_engine(engine: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Load, warm up, then time ``spec['repeats']`` full passes over the workload."""
    options = spec.get("options", {}).get(engine, {})
    loaded = LOADERS[engine](spec["model"], options)
    run = loaded.run

    t0 = time.perf_counter()
    run(spec["warmup_requests"])
    warmup_s = time.perf_counter() - t0

    requests = spec["requests"]
    passes = []
    outputs: list[list[int]] = []
    for _ in range(int(spec["repeats"])):
        if loaded.reset_prefix_cache is not None and not loaded.reset_prefix_cache():
            raise RuntimeError(f"{engine}: could not reset its prefix cache between passes")
        busy0, total0 = _cpu_jiffies()
        own0 = _tree_cpu_jiffies()
        t0 = time.perf_counter()
        outputs = run(requests)
        wall_s = time.perf_counter() - t0
        own1 = _tree_cpu_jiffies()
        busy1, total1 = _cpu_jiffies()
        num_output = sum(len(o) for o in outputs)
        total = max(1, total1 - total0)
        passes.append(
            {
                "wall_s": wall_s,
                "num_output_tokens": num_output,
                "output_tok_per_s": num_output / wall_s,
                # Shares of all cores' time while this pass ran: busy (everyone), this engine's
                # processes, and everyone else's (the load other jobs put on the machine).
                "system_cpu_busy": (busy1 - busy0) / total,
                "engine_cpu_share": (own1 - own0) / total,
                "others_cpu_share": max(0, (busy1 - busy0) - (own1 - own0)) / total,
                "loadavg_1m_after": os.getloadavg()[0],
            }
        )
        print(
            f"[{engine}] pass {len(passes)}: {wall_s:.1f} s, {num_output / wall_s:.1f} tok/s",
            file=sys.stderr,
            flush=True,
        )
    loaded.close()
    for r, o in zip(requests, outputs, strict=True):
        if len(o) != r["max_tokens"]:
            raise RuntimeError(f"{engine}: generated {len(o)} tokens, expected {r['max_tokens']}")
    return {
        "engine": engine,
        "settings": loaded.settings,
        "load_s": loaded.load_s,
        "warmup_s": warmup_s,
        "passes": passes,
        "output_token_ids": outputs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", required=True, choices=sorted(LOADERS))
    parser.add_argument("--spec", required=True, help="workload spec JSON")
    parser.add_argument("--out", required=True, help="where to write the result JSON")
    args = parser.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)
    result = run_engine(args.engine, spec)
    with open(args.out, "w") as f:
        json.dump(result, f)
    # vLLM's engine-core process and HF's generation thread can hold the interpreter open.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
