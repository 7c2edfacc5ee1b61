"""Small real models, built in code from tiny configs (no download), and a runner that trains each with the Trainer.

``python -m tests_pytorch.helpers.model_zoo --accelerator hpu --out losses.json`` trains every model in every
precision for a few optimizer steps and writes the loss of each step, ``{"<model>/<precision>": [loss, ...]}`` or
``{"<model>/<precision>": "error: ..."}``. One process runs them all, because the execution mode is fixed when the
(virtual) Gaudi is activated and because starting a process costs more than training a tiny model. Dropout is off and
the data and initial weights are the same in every process, so runs on different accelerators can be compared step
by step. ``--devices 2`` trains with data parallelism (``hpu_parallel``, or ``ddp`` on CPU); each rank writes its own
file, ``<out>.rank<r>``. ``--fabric`` trains each with a Lightning Fabric loop (one device) instead of the Trainer.
"""

import json
import math
from argparse import ArgumentParser
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

import pytorch_lightning as pl

STEPS, BATCH, SEQUENCE, VOCAB, CLASSES = 3, 4, 8, 64, 5
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true")


class Batches(Dataset):
    """``STEPS * world_size`` fixed batches of one model's inputs, made from a seeded generator."""

    def __init__(self, make: Callable[[torch.Generator], tuple], count: int) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.batches = [make(generator) for _ in range(count)]

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> tuple:
        return self.batches[index]


def _tokens(generator: torch.Generator, length: int = SEQUENCE) -> Tensor:
    return torch.randint(0, VOCAB, (BATCH, length), generator=generator)


def _labels(generator: torch.Generator) -> Tensor:
    return torch.randint(0, CLASSES, (BATCH,), generator=generator)


def _images(generator: torch.Generator, size: int = 16) -> tuple:
    return torch.randn(BATCH, 3, size, size, generator=generator), _labels(generator)


def _sequence(generator: torch.Generator) -> tuple:
    return torch.randn(BATCH, SEQUENCE, 16, generator=generator), _labels(generator)


# ---- Hugging Face transformers, random weights from tiny configs


def gpt2(width: int = 32, layers: int = 2) -> tuple:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=width, n_layer=layers, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return GPT2LMHeadModel(config), lambda model, ids: model(input_ids=ids, labels=ids).loss, _tokens


def bert() -> tuple:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip

    def loss(model: nn.Module, ids: Tensor) -> Tensor:
        # pad the last two positions so that the attention mask matters
        mask = torch.ones_like(ids)
        mask[:, -2:] = 0
        return model(input_ids=ids, attention_mask=mask, labels=ids).loss

    return BertForMaskedLM(config), loss, _tokens


def llama() -> tuple:
    from transformers import LlamaConfig, LlamaForCausalLM

    # two query heads share one key/value head: grouped-query attention
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, attention_dropout=0.0,
    )  # fmt: skip
    return LlamaForCausalLM(config), lambda model, ids: model(input_ids=ids, labels=ids).loss, _tokens


def mixtral() -> tuple:
    from transformers import MixtralConfig, MixtralForCausalLM

    # a mixture of experts: each token goes to 2 of 4 experts; on an accelerator the routing counts the tokens of
    # each expert with torch.histc on integer ids
    config = MixtralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
    )  # fmt: skip
    return MixtralForCausalLM(config), lambda model, ids: model(input_ids=ids, labels=ids).loss, _tokens


def t5() -> tuple:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip

    def loss(model: nn.Module, ids: Tensor) -> Tensor:
        return model(input_ids=ids, labels=ids.flip(1)).loss

    return T5ForConditionalGeneration(config), loss, _tokens


def vit(width: int = 32, layers: int = 2, image: int = 16) -> tuple:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=image, patch_size=4, num_channels=3, hidden_size=width, num_hidden_layers=layers,
        num_attention_heads=2, intermediate_size=2 * width, num_labels=CLASSES, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip

    def loss(model: nn.Module, pixels: Tensor, labels: Tensor) -> Tensor:
        return model(pixel_values=pixels, labels=labels).loss

    return ViTForImageClassification(config), loss, lambda generator: _images(generator, image)


# ---- torch.nn building blocks


def _classify(model: nn.Module, inputs: Tensor, labels: Tensor) -> Tensor:
    return F.cross_entropy(model(inputs).float(), labels)


def _next_token(model: nn.Module, ids: Tensor) -> Tensor:
    return F.cross_entropy(model(ids[:, :-1]).flatten(0, 1).float(), ids[:, 1:].flatten())


class _Pool(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.mean(dim=1)


def norms() -> tuple:
    """LayerNorm, RMSNorm and BatchNorm1d over a sequence of features."""

    class Transpose(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return x.transpose(1, 2)

    model = nn.Sequential(
        nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 32), nn.RMSNorm(32), nn.SiLU(),
        Transpose(), nn.BatchNorm1d(32), Transpose(), _Pool(), nn.Linear(32, CLASSES),
    )  # fmt: skip
    return model, _classify, _sequence


def convolutions() -> tuple:
    """Conv2d with GroupNorm and BatchNorm2d, a transposed convolution and pooling."""
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.ConvTranspose2d(16, 8, 2, stride=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, CLASSES),
    )  # fmt: skip
    return model, _classify, _images


def conv1d() -> tuple:
    model = nn.Sequential(
        nn.Conv1d(SEQUENCE, 16, 3, padding=1), nn.Tanh(), nn.Conv1d(16, 8, 3), nn.AvgPool1d(2), nn.Flatten(),
        nn.Linear(8 * 7, CLASSES),
    )  # fmt: skip
    return model, _classify, _sequence


class _Attention(nn.Module):
    """Embedding, then nn.MultiheadAttention with a key padding mask."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, 32)
        self.attention = nn.MultiheadAttention(32, 4, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.embedding(ids)
        padding = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
        padding[:, -1] = True
        return self.head(self.attention(x, x, x, key_padding_mask=padding, need_weights=False)[0] + x)


def multihead_attention() -> tuple:
    return _Attention(), _next_token, _tokens


class _Transformer(nn.Module):
    """nn.TransformerEncoderLayer and nn.TransformerDecoderLayer with a causal mask."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, 32)
        self.encoder = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
        self.decoder = nn.TransformerDecoderLayer(32, 2, 64, dropout=0.0, batch_first=True, norm_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.embedding(ids)
        causal = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device, dtype=x.dtype)
        return self.head(self.decoder(x, self.encoder(x), tgt_mask=causal, tgt_is_causal=True))


def transformer_layers() -> tuple:
    return _Transformer(), _next_token, _tokens


class _Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, 16)
        self.lstm = nn.LSTM(16, 32, batch_first=True)
        self.gru = nn.GRU(32, 32, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.gru(self.lstm(self.embedding(ids))[0])[0])


def lstm_gru() -> tuple:
    return _Recurrent(), _next_token, _tokens


class _Sdpa(nn.Module):
    """F.scaled_dot_product_attention: causal, and with a learned additive bias (a mask that requires grad)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, 32)
        self.qkv = nn.Linear(32, 96)
        self.bias = nn.Parameter(torch.randn(1, 2, SEQUENCE - 1, SEQUENCE - 1) * 0.1)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.embedding(ids)
        q, k, v = (t.unflatten(-1, (2, 16)).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        biased = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias.to(q.dtype))
        return self.head((causal + biased).transpose(1, 2).flatten(2) + x)


def sdpa() -> tuple:
    return _Sdpa(), _next_token, _tokens


MODELS: dict[str, Callable[[], tuple]] = {
    "gpt2": gpt2,
    "bert": bert,
    "llama": llama,
    "mixtral": mixtral,
    "t5": t5,
    "vit": vit,
    "norms": norms,
    "convolutions": convolutions,
    "conv1d": conv1d,
    "multihead_attention": multihead_attention,
    "transformer_layers": transformer_layers,
    "lstm_gru": lstm_gru,
    "sdpa": sdpa,
}


def build(name: str, **size: int) -> tuple:
    """(module, loss function of the module and a batch, batch maker) with the same weights in every process."""
    torch.manual_seed(0)
    return MODELS[name](**size)


class ZooModule(pl.LightningModule):
    """Trains one zoo model with SGD and keeps the loss of every step."""

    def __init__(self, name: str, world_size: int = 1) -> None:
        super().__init__()
        self.model, self.loss_fn, make_batch = build(name)
        self.data = Batches(make_batch, STEPS * world_size)
        self.losses: list = []

    def training_step(self, batch, batch_idx):
        inputs = batch if isinstance(batch, (tuple, list)) else (batch,)
        loss = self.loss_fn(self.model, *inputs)
        self.losses.append(loss.detach())
        return loss

    def train_dataloader(self) -> DataLoader:
        # one fixed batch per item; with data parallelism each rank takes every world_size-th batch
        return DataLoader(self.data, batch_size=None)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def _cpu_precision_plugins(precision: str) -> list:
    """On CPU, upstream scales the loss in ``16-mixed``; the HPU plugin does not (Gaudi's fp16 runs without a
    scaler), so the CPU reference autocasts to fp16 without scaling to train the same way."""
    if precision != "16-mixed":
        return []
    from lightning.pytorch.plugins.precision import MixedPrecision

    return [MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", enabled=False))]


# oneDNN's CPU LSTM refuses autocast's bf16/fp16 inputs ("could not create a primitive descriptor"); the CPU reference
# of these models uses PyTorch's own kernels, in every precision alike
_CPU_WITHOUT_ONEDNN = ("lstm_gru",)


def train(name: str, precision: str, accelerator: str, devices: int) -> tuple:
    """(rank, loss of every step) of one model trained in one precision."""
    plugins = _cpu_precision_plugins(precision) if accelerator == "cpu" else []
    onednn = accelerator != "cpu" or name not in _CPU_WITHOUT_ONEDNN
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=devices,
        strategy="ddp" if accelerator == "cpu" and devices > 1 else "auto",
        precision=None if plugins else precision,
        plugins=plugins,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    module = ZooModule(name, world_size=devices)
    with torch.backends.mkldnn.flags(enabled=onednn):
        trainer.fit(module)
    return trainer.global_rank, [float(loss) for loss in module.losses]


def train_with_fabric(name: str, precision: str, accelerator: str, devices: int) -> tuple:
    """(rank 0, loss of every step) of one model trained in one precision by a Lightning Fabric loop on one device."""
    import lightning as L
    from lightning.fabric.plugins.precision import MixedPrecision

    plugins = []
    if accelerator == "cpu" and precision == "16-mixed":
        # as for the Trainer: fp16 autocast without loss scaling, as the HPU trains
        plugins = [MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", enabled=False))]
    fabric = L.Fabric(accelerator=accelerator, devices=1, precision=None if plugins else precision, plugins=plugins)
    model, loss_fn, make_batch = build(name)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    losses = []
    onednn = accelerator != "cpu" or name not in _CPU_WITHOUT_ONEDNN
    with torch.backends.mkldnn.flags(enabled=onednn):
        for batch in Batches(make_batch, STEPS).batches:
            loss = loss_fn(model, *fabric.to_device(batch if isinstance(batch, (tuple, list)) else (batch,)))
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach())
    return 0, [float(loss) for loss in losses]


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("--accelerator", required=True, choices=("cpu", "hpu"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--fabric", action="store_true", help="train with a Lightning Fabric loop instead")
    args = parser.parse_args()
    run = train_with_fabric if args.fabric else train
    results, rank = {}, 0
    for name in args.models.split(","):
        for precision in args.precisions.split(","):
            try:
                rank, losses = run(name, precision, args.accelerator, args.devices)
                finite = all(map(math.isfinite, losses))
                results[f"{name}/{precision}"] = losses if finite else f"error: losses {losses}"
            except Exception as err:  # reported per case; the other cases still run
                results[f"{name}/{precision}"] = f"error: {type(err).__name__}: {err}"
    out = Path(args.out) if args.devices == 1 else Path(f"{args.out}.rank{rank}")
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
