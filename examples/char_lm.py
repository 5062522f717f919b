"""A small GPT-style character-level language model built from qrecipe modules, its corpus
and one training run under a recipe: the model that examples/char_lm_demo.py (the demo of
`bash tools/demo.sh`) trains and that CI trains a few steps under every shipped recipe.

Each block is pre-norm attention then a pre-norm MLP:
    attn.qkv   qrecipe.nn.LayerNormLinear  norm + the q, k, v projections in one GEMM
    attn.proj  qrecipe.nn.Linear           the attention output projection
    mlp        qrecipe.nn.LayerNormMLP     norm -> fc1 -> GELU -> fc2
and the head is a torch LayerNorm followed by ``lm_head`` (qrecipe.nn.Linear). Embeddings,
attention scores and the softmax stay in high precision (they are no linear-layer GEMMs).
The recipe sees these role names (what a rule's ``name`` glob matches):
    layers.<i>.attn.qkv, layers.<i>.attn.proj, layers.<i>.mlp.fc1, layers.<i>.mlp.fc2, lm_head
Outside ``qrecipe.autocast`` the model is plain PyTorch, bit for bit: that is the baseline.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F

import qrecipe

CORPUS = Path(__file__).resolve().parent / "data" / "shakespeare.txt"

# Token counts stay multiples of 16 and widths multiples of 32: NVFP4's Hadamard transform
# needs token counts divisible by 16, and such shapes are the ones GPUs multiply natively.
VOCAB_MULTIPLE = 32
TOKEN_MULTIPLE = 16


# ------------------------------------------------------------------------------------ data
class CharCorpus:
    """A text as character ids: a sorted vocabulary of the characters it holds, the first
    90% for training and the rest for validation."""

    def __init__(self, text: str):
        if len(text) < 1000:
            raise ValueError(f"the corpus holds {len(text)} characters; the demo needs at "
                             f"least 1000")
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}
        ids = torch.tensor([self.index[c] for c in text], dtype=torch.long)
        split = int(0.9 * len(ids))
        self.train, self.val = ids[:split], ids[split:]

    @classmethod
    def load(cls, path: Path = CORPUS) -> "CharCorpus":
        try:
            return cls(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"corpus {path} not found: it ships with the repository "
                                    f"(examples/data/shakespeare.txt)") from None

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> List[int]:
        unknown = sorted(set(text) - set(self.index))
        if unknown:
            raise ValueError(f"characters {unknown!r} are not in the corpus vocabulary")
        return [self.index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)

    def batches(self, split: str, batch: int, context: int, count: int,
                seed: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """`count` batches of (input, target) ids [batch, context], targets shifted by one,
        at offsets drawn on the CPU from `seed`: the same batches on every device."""
        data = self.train if split == "train" else self.val
        if len(data) <= context + 1:
            raise ValueError(f"the {split} split ({len(data)} characters) is shorter than "
                             f"the context ({context})")
        g = torch.Generator().manual_seed(seed)
        for _ in range(count):
            start = torch.randint(0, len(data) - context - 1, (batch,), generator=g)
            rows = torch.stack([data[s:s + context + 1] for s in start.tolist()])
            yield rows[:, :-1], rows[:, 1:]


# ----------------------------------------------------------------------------------- model
@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int        # the corpus's characters; the head is padded to VOCAB_MULTIPLE
    context: int = 64      # characters the model sees
    width: int = 128       # d_model
    layers: int = 4
    heads: int = 4

    @property
    def padded_vocab(self) -> int:
        return -(-self.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE

    def check(self) -> None:
        problems = []
        if self.width % self.heads:
            problems.append(f"width {self.width} is not divisible by heads {self.heads}")
        if self.width % 32:
            problems.append(f"width {self.width} is not a multiple of 32")
        if self.context % TOKEN_MULTIPLE:
            problems.append(f"context {self.context} is not a multiple of {TOKEN_MULTIPLE}")
        if min(self.context, self.width, self.layers, self.heads) <= 0:
            problems.append("context, width, layers and heads must be positive")
        if problems:
            raise ValueError("model config: " + "; ".join(problems))


class Attention(torch.nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = qrecipe.nn.LayerNormLinear(cfg.width, 3 * cfg.width)
        self.proj = qrecipe.nn.Linear(cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(torch.nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn = Attention(cfg)
        self.mlp = qrecipe.nn.LayerNormMLP(cfg.width, 4 * cfg.width, activation="gelu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.mlp(x)


class CharLM(torch.nn.Module):
    """The GPT-style model; ``qrecipe.convert`` (called by :func:`build_model`) names its
    qrecipe modules by path, which is what recipe rules match."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.check()
        self.cfg = cfg
        self.tok_emb = torch.nn.Embedding(cfg.padded_vocab, cfg.width)
        self.pos_emb = torch.nn.Embedding(cfg.context, cfg.width)
        self.layers = torch.nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = torch.nn.LayerNorm(cfg.width)
        self.lm_head = qrecipe.nn.Linear(cfg.width, cfg.padded_vocab, bias=False)
        for emb in (self.tok_emb, self.pos_emb):  # GPT-2's embedding scale
            torch.nn.init.normal_(emb.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        if t > self.cfg.context:
            raise ValueError(f"{t} tokens exceed the model's context of {self.cfg.context}")
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(t, device=ids.device))
        for block in self.layers:
            x = block(x)
        return self.lm_head(self.norm(x))

    def loss(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self(ids)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def build_model(cfg: ModelConfig, seed: int, device: torch.device,
                dtype: torch.dtype) -> CharLM:
    """The model with the weights of `seed` (drawn on the CPU in FP32, so every run and every
    device starts from the same values), its qrecipe modules named by path."""
    torch.manual_seed(seed)
    model = CharLM(cfg)
    return qrecipe.convert(model).to(device=device, dtype=dtype)


def needs_bf16(recipe: "qrecipe.Recipe", model: CharLM) -> bool:
    """Whether the recipe asks for NVFP4's Hadamard transform on some role of `model`: that
    transform takes BF16 inputs only, so such a recipe trains the model in BF16."""
    for module in model.modules():
        if isinstance(module, qrecipe.nn.QuantizedModule):
            for key in module.gemms():
                name = module.role_name(key)
                for tensor_type in ("input", "weight", "grad_output"):
                    if "hadamard=true" in recipe.resolve(module.MODULE_TYPE, tensor_type,
                                                          name):
                        return True
    return False


# -------------------------------------------------------------------------------- training
def _autocast_of(recipe: Optional["qrecipe.Recipe"]) -> Callable[[], contextlib.AbstractContextManager]:
    """The context a step runs in: the recipe's autocast, or nothing (plain PyTorch)."""
    if recipe is None:
        return contextlib.nullcontext
    return lambda: qrecipe.autocast(recipe)


@dataclass
class TrainConfig:
    steps: int
    batch: int = 16
    lr: float = 3e-3
    warmup: int = 10
    seed: int = 0
    eval_batches: int = 4


@dataclass
class RunResult:
    label: str
    dtype: torch.dtype
    losses: List[float]
    val_loss: float
    seconds: float
    tokens: int
    model: CharLM

    @property
    def fell(self) -> bool:
        """The mean loss of the last tenth of the steps is below that of the first tenth
        (one step each in a run of under 20 steps), and every loss is finite."""
        w = max(1, len(self.losses) // 10)
        head, tail = self.losses[:w], self.losses[-w:]
        return (all(math.isfinite(v) for v in self.losses) and math.isfinite(self.val_loss)
                and sum(tail) / w < sum(head) / w)

    @property
    def final_loss(self) -> float:
        w = max(1, len(self.losses) // 10)
        return sum(self.losses[-w:]) / w


def learning_rate(step: int, tc: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    progress = (step - tc.warmup) / max(1, tc.steps - tc.warmup)
    return tc.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train(label: str, model: CharLM, corpus: CharCorpus, tc: TrainConfig,
          recipe: Optional["qrecipe.Recipe"],
          on_step: Callable[[int, float, float], None] = lambda step, loss, tok_s: None
          ) -> RunResult:
    """Trains `model` for tc.steps steps on the training batches of tc.seed; under
    ``qrecipe.autocast(recipe)`` when a recipe is given, in plain PyTorch when not. Calls
    ``on_step(step, loss, tokens_per_second)`` after each step. Then the validation loss,
    under the same recipe, on tc.eval_batches fixed batches."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, betas=(0.9, 0.95),
                            weight_decay=0.1)
    context = model.cfg.context
    autocast = _autocast_of(recipe)
    losses: List[float] = []
    t0 = time.perf_counter()
    for step, (x, y) in enumerate(corpus.batches("train", tc.batch, context, tc.steps,
                                                 tc.seed)):
        x, y = x.to(device), y.to(device)
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, tc)
        with autocast():
            loss = model.loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())  # .item() synchronises: the timing below is honest
        elapsed = time.perf_counter() - t0
        on_step(step, losses[-1], (step + 1) * tc.batch * context / elapsed)
    seconds = time.perf_counter() - t0
    model.eval()
    with torch.no_grad(), autocast():
        val = [model.loss(x.to(device), y.to(device)).item()
               for x, y in corpus.batches("val", tc.batch, context, tc.eval_batches,
                                          tc.seed + 1)]
    model.train()
    return RunResult(label, dtype, losses, sum(val) / len(val), seconds,
                     tc.steps * tc.batch * context, model)


@torch.no_grad()
def generate(model: CharLM, corpus: CharCorpus, prompt: str, chars: int, seed: int,
             recipe: Optional["qrecipe.Recipe"], temperature: float = 0.8) -> str:
    """`chars` characters sampled after `prompt` (under the recipe when given). The window
    is right-padded to a multiple of TOKEN_MULTIPLE tokens: attention is causal, so the
    padding never reaches the logits of the last real position."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    ids = corpus.encode(prompt)
    context = model.cfg.context
    autocast = _autocast_of(recipe)
    model.eval()
    for _ in range(chars):
        window = ids[-context:]
        padded = window + [0] * (-len(window) % TOKEN_MULTIPLE)
        with autocast():
            logits = model(torch.tensor([padded], device=device))[0, len(window) - 1]
        logits = logits.float().cpu()[:corpus.vocab_size] / temperature
        ids.append(int(torch.multinomial(torch.softmax(logits, -1), 1, generator=g)))
    model.train()
    return corpus.decode(ids)
