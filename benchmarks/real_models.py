"""Training-step time of real models on the virtual HPU divided by the same step on the CPU, side by side.

The models are Hugging Face ``transformers`` GPT-2 and ViT built from configs (random weights, no download), sized
so that a step takes over 20 ms on one CPU thread (bf16 matmuls on CPUs without bf16 units take many times longer).
A step is forward, backward and an AdamW update, in ``32-true`` and in ``bf16-mixed`` (``torch.autocast`` on the
step's device). Each execution mode is fixed per process, so lazy and eager each run in a child process of this
script, which times the CPU and the HPU step alternately in the same process. The virtual device computes with the
host's CPU kernels; what the ratio measures is the price of its faithfulness (dtype rules, autocast lists,
accounting), which must stay small: target ratio <= 1.15.

Each of a case's repetitions is one step on each device, taken one after the other (the order flips every
repetition); per case the table gives the median milliseconds per step on each, and the ratio hpu ÷ cpu is the median
over repetitions of each repetition's ratio, with min and max. The last line, ``ratio_max=<float>``, is the largest
median ratio. On a real Gaudi the ratio compares two different machines and says nothing about this; the script runs
anyway.

    python benchmarks/real_models.py [--fast] [--repeats N]
"""

import json
import statistics
import time
from argparse import SUPPRESS, ArgumentParser

from _common import print_table, run_in_mode, summarize, use_gaudi_or_virtual

use_gaudi_or_virtual()

MODES = ("lazy", "eager")
PRECISIONS = ("32-true", "bf16-mixed")
WARMUP = 2
TARGET = 1.15


def _gpt2():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=512, n_positions=64, n_embd=128, n_layer=2, n_head=4)
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    tokens = torch.randint(0, 512, (8, 64), generator=torch.Generator().manual_seed(0))
    return GPT2LMHeadModel(config), {"input_ids": tokens, "labels": tokens}


def _vit():
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=32, patch_size=4, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=256, num_labels=10, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(16, 3, 32, 32, generator=generator)
    return ViTForImageClassification(config), {"pixel_values": images, "labels": torch.randint(0, 10, (16,))}


MODELS = {"GPT-2": _gpt2, "ViT": _vit}


def child(repeats: int) -> None:
    """Time each (model, precision) on CPU and HPU, alternating; print one JSON line of milliseconds per step."""
    import torch

    torch.manual_seed(0)
    results = {}
    for name, build in MODELS.items():
        model, batch = build()
        runs = {}
        for device in ("cpu", "hpu"):
            replica = build()[0].to(device)
            replica.load_state_dict(model.state_dict())
            runs[device] = (
                replica,
                {k: v.to(device) for k, v in batch.items()},
                torch.optim.AdamW(replica.parameters()),
            )
        for precision in PRECISIONS:
            samples = {"cpu": [], "hpu": []}
            for repeat in range(WARMUP + repeats):
                for device in ("cpu", "hpu") if repeat % 2 == 0 else ("hpu", "cpu"):
                    replica, inputs, optimizer = runs[device]
                    started = time.perf_counter()
                    with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
                        loss = replica(**inputs).loss
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()
                    if device == "hpu":
                        import habana_frameworks.torch.core as htcore

                        htcore.mark_step()
                    float(loss)  # wait for the step, as a training loop that reads its loss does
                    if repeat >= WARMUP:
                        samples[device].append((time.perf_counter() - started) * 1000)
            results[f"{name}/{precision}"] = samples
    print(json.dumps(results))


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="few repeats (format smoke test)")
    parser.add_argument("--repeats", type=int, default=15, help="timed steps per device and case")
    parser.add_argument("--child", choices=MODES, help=SUPPRESS)
    args = parser.parse_args()
    repeats = 1 if args.fast else args.repeats
    if args.child:
        import pytorch_lightning  # noqa: F401  (activates the virtual Gaudi in lazy mode too)

        child(repeats)
        return
    rows, lines = [], []
    for mode in MODES:
        for case, ms in run_in_mode(__file__, mode, "--repeats", str(repeats)).items():  # type: ignore[union-attr]
            ratios = [hpu / cpu for hpu, cpu in zip(ms["hpu"], ms["cpu"])]
            rows.append([case, mode, f"{statistics.median(ms['cpu']):.1f}", f"{statistics.median(ms['hpu']):.1f}"])
            lines.append((f"{case}, {mode}: hpu ÷ cpu", ratios))
    print(f"median training-step time over {repeats} steps per case, CPU and HPU alternating in one process")
    print_table(["model/precision", "mode", "cpu ms", "hpu ms"], rows)
    medians = [summarize(name, ratios, TARGET).median for name, ratios in lines]
    print(f"ratio_max={max(medians):.3f}")


if __name__ == "__main__":
    main()
