"""A Fabric LLM pretraining script in the shape of public ones (LitGPT's ``pretrain.py``), written for CUDA and run
unchanged: a tiny GPT, FSDP ``HYBRID_SHARD`` with block auto-wrap on several devices, data prepared once under
``rank_zero_first``, ``torch.compile(model)`` with the default backend, ``bf16-mixed``, a full checkpoint at the end.
Nothing here names a device: ``--accelerator`` is ``auto`` unless a comparison run asks for ``cpu``. Each rank saves
its losses.
"""

import os
from argparse import ArgumentParser
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.strategies import FSDPStrategy
from torch import nn

VOCAB, SEQ, WIDTH, HEADS, LAYERS = 64, 16, 32, 4, 2
ROWS, GLOBAL_BATCH, STEPS = 40, 8, 5


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.norm_1, self.norm_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.norm_1(x)).view(batch, length, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, WIDTH))
        return x + self.mlp(self.norm_2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm, self.lm_head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def prepared_tokens(path: Path) -> torch.Tensor:
    """The "dataset": written by the first process to get here, read by all."""
    if not path.exists():
        tokens = torch.randint(0, VOCAB, (ROWS, SEQ + 1), generator=torch.Generator().manual_seed(0))
        torch.save(tokens, path)
    return torch.load(path)


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--devices", type=int, default=1)
    args = parser.parse_args()
    out = Path(args.out)
    if args.devices > 1:
        strategy = FSDPStrategy(
            auto_wrap_policy={Block},
            activation_checkpointing_policy=None,
            state_dict_type="full",
            sharding_strategy="HYBRID_SHARD",
        )
    else:
        strategy = "auto"
    fabric = L.Fabric(accelerator=args.accelerator, devices=args.devices, strategy=strategy, precision="bf16-mixed")
    fabric.launch()
    if fabric.global_rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    fabric.barrier()

    # the model is created on the CPU, so the CPU's generator gives the same initial weights everywhere
    fabric.seed_everything(42)
    model = GPT()
    model = torch.compile(model)
    model = fabric.setup(model)
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1))

    with fabric.rank_zero_first():
        tokens = prepared_tokens(out / "tokens.pt")
    loader = torch.utils.data.DataLoader(tokens, batch_size=GLOBAL_BATCH // fabric.world_size, shuffle=False)
    loader = fabric.setup_dataloaders(loader)

    losses = []
    for step, batch in zip(range(STEPS), loader):
        inputs, targets = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
        logits = model(inputs)
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1))
        fabric.backward(loss)
        fabric.clip_gradients(model, optimizer, max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        fabric.print(f"step {step} | loss {losses[-1]:.4f}")

    (out / "final").mkdir(exist_ok=True)
    fabric.save(out / "final" / "lit_model.pth", {"model": model, "optimizer": optimizer, "step": STEPS})
    device = fabric.device.type
    torch.save({"losses": losses, "device": device}, os.path.join(out, f"rank{fabric.global_rank}.pt"))


if __name__ == "__main__":
    main()
