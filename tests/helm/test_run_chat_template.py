"""A chat template shipped as a ConfigMap, the way a model without one gets it on Kubernetes:
the ConfigMap mounted into the router through ``router.extraVolumes`` /
``router.extraVolumeMounts`` and named by ``router.flags.chatTemplate``. The rendered router
runs as a local process (tests/helm/local_pod.py) and renders chats with that file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import kubernetes_validate
import pytest
from transformers import AutoTokenizer

from protos.pdserve.v1 import generate_pb2 as pb
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.helm.chart import containers, example_values, objects, render
from tests.helm.local_pod import LOOPBACK
from tests.helm.local_release import LocalRelease, port_values
from tests.helm.probes import wait_probe
from tests.helm.test_render import CUSTOM_RESOURCES, KUBE_VERSIONS

pytestmark = pytest.mark.timeout(300)

TEMPLATE = (
    "{% for m in messages %}<<{{ m['role'] | upper }}>> {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<<ASSISTANT>> {% endif %}"
)
MOUNT = "/etc/pdserve/chat"


def _values() -> dict[str, Any]:
    values = example_values("cpu-tiny")
    for role, ports in port_values().items():
        values.setdefault(role, {}).update(ports)
    router = values.setdefault("router", {})
    router["extraVolumes"] = [
        {
            "name": "chat-template",
            "configMap": {
                "name": "demo-chat-template",
                "items": [{"key": "template", "path": "chat.jinja"}],
            },
        }
    ]
    router["extraVolumeMounts"] = [{"name": "chat-template", "mountPath": MOUNT, "readOnly": True}]
    router.setdefault("flags", {})["chatTemplate"] = f"{MOUNT}/chat.jinja"
    return values


def test_a_chat_template_from_a_config_map_renders_chats(tmp_path: Path) -> None:
    objs = objects(render(_values()))
    for obj in objs:  # the mount is valid Kubernetes, not only what the local runner accepts
        if obj["kind"] not in CUSTOM_RESOURCES:
            kubernetes_validate.validate(obj, KUBE_VERSIONS[-1], strict=True)
    (router,) = [c for c in containers(objs) if c.role == "router" and not c.init]
    args = router.spec["args"]
    assert args[args.index("--chat-template") + 1] == f"{MOUNT}/chat.jinja"
    rel = LocalRelease(objs, tmp_path)
    rel.cluster.config_maps["demo-chat-template"] = {"template": TEMPLATE}
    try:
        rel.start(["router"])
        pod = rel.pods["router"]
        assert wait_probe(pod, "startupProbe")[-1].ok, rel.logs()
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
        chat = pb.ChatPrompt(
            messages=[pb.ChatMessage(role=m["role"], content=m["content"]) for m in messages]
        )
        with grpc.insecure_channel(f"{LOOPBACK}:{pod.ports['grpc']}") as channel:
            stub = pb_grpc.GenerationServiceStub(channel)
            got = list(stub.Tokenize(pb.TokenizeRequest(chat=chat), timeout=60).token_ids)
        folder = pod.mounts["/var/cache/pdserve"] / "demo-llama-v1"
        tokenizer: Any = AutoTokenizer.from_pretrained(str(folder))
        text = "<<SYSTEM>> be brief\n<<USER>> hi\n<<ASSISTANT>> "
        assert got == tokenizer.encode(text, add_special_tokens=False), rel.logs()
        # The file's template, not the tokenizer's own.
        own = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert own != text
    finally:
        rel.stop()
