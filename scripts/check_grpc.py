"""The Open Inference Protocol over gRPC against a running service with the default models, through
Triton's own client: health, metadata of every model, and one answer per task checked for sense.

    .venv/bin/python scripts/check_grpc.py 127.0.0.1:8001

Used by scripts/newcomer_check.sh after `make serve` (which sets GRPC_PORT=8001).
"""

from __future__ import annotations

import sys

import numpy as np
import tritonclient.grpc as grpcclient

TEXT = "The Eiffel Tower is a wrought-iron lattice tower in Paris, France."
# model -> (inputs, the check of the answer's outputs)
CHECKS = {
    "sst2-minilm": (
        {"text": ["A wonderful, moving film with a brilliant cast.", "Dull, lifeless and far too long."]},
        lambda out: out["label"].tolist() == [b"positive", b"negative"],
    ),
    "conll03-minilm": (
        {"text": ["Angela Merkel met Emmanuel Macron in Paris."]},
        lambda out: b"Paris" in out["entities"][0],
    ),
    "squad-minilm": (
        {"question": ["Where is the Eiffel Tower?"], "context": [TEXT]},
        lambda out: out["answer"][0].decode().startswith("Paris"),
    ),
    "all-minilm-l6-v2": (
        {"inputs": ["What is deep learning?"]},
        lambda out: (
            out["embedding"].shape == (1, 384) and abs(np.linalg.norm(out["embedding"][0]) - 1) < 1e-3
        ),
    ),
    "rerank-minilm": (
        {"text": ["Where is the Eiffel Tower?"] * 2, "text_pair": [TEXT, "A woman is slicing an onion."]},
        lambda out: out["label"].tolist() == [b"relevant", b"not_relevant"],
    ),
    "codah-minilm": (
        {
            "context": ["The child dropped the glass on the floor and it"],
            "choices": [
                ["shattered into pieces.", "sang a song.", "flew away like a bird.", "became a tree."]
            ],
        },
        lambda out: out["best"].tolist() == [0] and out["scores"].shape == (1, 4),
    ),
}


def problems(target: str) -> list[str]:
    client = grpcclient.InferenceServerClient(target)
    found = []
    if not (client.is_server_live() and client.is_server_ready()):
        found.append("ServerLive/ServerReady: not live and ready")
    for model, (inputs, holds) in CHECKS.items():
        try:
            tensors = []
            for name, rows in inputs.items():
                data = np.array(rows, dtype=object)
                tensor = grpcclient.InferInput(name, list(data.shape), "BYTES")
                tensor.set_data_from_numpy(data)
                tensors.append(tensor)
            meta = client.get_model_metadata(model)
            result = client.infer(model, tensors)
            out = {
                o.name: result.as_numpy(o.name) for o in meta.outputs if result.as_numpy(o.name) is not None
            }
        except Exception as error:  # noqa: BLE001 - any failure is a finding, with its reason
            found.append(f"ModelInfer {model}: {error}")
            continue
        print(f"ModelInfer {model} -> {', '.join(f'{k}: {str(v.tolist())[:80]}' for k, v in out.items())}")
        if not holds(out):
            found.append(f"ModelInfer {model}: unexpected answer {out}")
    client.close()
    return found


if __name__ == "__main__":
    failed = problems(sys.argv[1])
    print("\n".join(failed) or "gRPC answered sensibly")
    sys.exit(1 if failed else 0)
