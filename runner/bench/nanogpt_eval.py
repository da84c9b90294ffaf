"""nanoGPT's checkpoint scored on the runner's validation windows: run by `peers --gpt` with nanoGPT's own Python.

    <venv>/bin/python nanogpt_eval.py --checkout DIR --ckpt out/ckpt.pt --val data/NAME/val.bin --length 64
        --windows N

prints one JSON line: {"loss": ..., "windows": N, "tokens": N * length}: the mean cross-entropy over every token of
the runner's windows (the validation stream's first N consecutive windows), as the runner's final evaluation sums
it (nanoGPT's own `estimate_loss` draws random windows). Needs torch, numpy and the checkout's `model.py`: never
imported by the project.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def load_model(checkout: str, ckpt: str) -> Any:
    """nanoGPT's GPT from its checkpoint, in eval mode (a compiled run's keys carry `_orig_mod.`: stripped, as its
    train.py does when it resumes)."""
    import torch

    sys.path.insert(0, checkout)
    from model import GPT, GPTConfig  # nanoGPT's model.py

    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    model = GPT(GPTConfig(**saved["model_args"]))
    state = {k.removeprefix("_orig_mod."): v for k, v in saved["model"].items()}
    model.load_state_dict(state)
    return model.eval()


def mean_loss(model: Any, val: str, length: int, windows: int, batch: int = 256) -> float:
    """Mean next-token cross-entropy over the first `windows` consecutive windows of `length` ids of `val`."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    ids = np.fromfile(val, dtype=np.uint16).astype(np.int64)
    x = torch.from_numpy(ids[: windows * length].reshape(windows, length))
    y = torch.from_numpy(ids[1: windows * length + 1].reshape(windows, length))
    total = 0.0
    with torch.no_grad():
        for i in range(0, windows, batch):
            logits, _ = model(x[i:i + batch], y[i:i + batch])  # with targets: logits at every position
            total += F.cross_entropy(logits.flatten(0, 1), y[i:i + batch].flatten(), reduction="sum").item()
    return total / (windows * length)


def main(argv: list[str] | None = None) -> int:
    """Score the checkpoint and print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--checkout", "--ckpt", "--val"):
        parser.add_argument(name, required=True)
    parser.add_argument("--length", type=int, required=True)
    parser.add_argument("--windows", type=int, required=True)
    args = parser.parse_args(argv)
    loss = mean_loss(load_model(args.checkout, args.ckpt), args.val, args.length, args.windows)
    print(json.dumps({"loss": loss, "windows": args.windows, "tokens": args.windows * args.length}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
