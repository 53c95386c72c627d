"""A char-level transformer trained on the CPU, shaped like nanoGPT's ``train.py``: settings are
module globals a ``--key=value`` flag overrides (its configurator: the value parsed as a Python
literal, of the global's own type), batches come from ``get_batch('train')`` slicing one long
tensor (no DataLoader), and every ``eval_interval`` iterations training pauses for
``estimate_loss()`` (``eval_iters`` batches of each split under ``torch.no_grad``).

The corpus is generated in-process (words of a small made-up language), so no file is needed.
Every ``log_interval`` iterations it prints its own clock, as nanoGPT does, with the throughput
the benches read::

    iter 40: loss 2.3012, time 123.45ms, 97.2 samples/s

``time`` is the mean training iteration since the previous line and ``samples/s`` the sequences
(``batch_size x gradient_accumulation_steps`` per iteration) trained on per second of it;
evaluation is off that clock (nanoGPT prints the last iteration's ``dt``; the mean keeps every
iteration on the clock). Runs until stopped (SIGINT) or ``max_iters``.

    python bench/scripts/nanogpt_shape.py --batch_size=12 --eval_interval=50 --max_iters=200
"""

import ast
import random
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

# -- defaults, overridden by --key=value ------------------------------------------------------
batch_size = 12
block_size = 64
n_layer = 4
n_head = 4
n_embd = 128
learning_rate = 1e-3
gradient_accumulation_steps = 1
eval_interval = 100
eval_iters = 20
log_interval = 10
max_iters = 600_000
corpus_chars = 200_000
seed = 1337

for arg in sys.argv[1:]:  # nanoGPT's configurator, without its config files
    if not arg.startswith("--") or "=" not in arg:
        sys.exit(f"expected --key=value, but got {arg!r}")
    key, value = arg[2:].split("=", 1)
    if key not in globals() or key.startswith("_"):
        sys.exit(f"unknown config key: {key}")
    try:
        parsed = ast.literal_eval(value)
    except (SyntaxError, ValueError):
        parsed = value
    if type(parsed) is not type(globals()[key]):
        sys.exit(f"--{key} must be a {type(globals()[key]).__name__}, but got {value!r}")
    globals()[key] = parsed

torch.manual_seed(seed)
rng = random.Random(seed)
syllables = [a + b for a in "bdfgklmnprstvz" for b in "aeiou"]
words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(300)]
text, length = [], 0
while length < corpus_chars:
    sentence = " ".join(rng.choice(words) for _ in range(rng.randint(3, 9)))
    text.append(sentence.capitalize() + rng.choice(".!?") + "\n")
    length += len(text[-1])
text = "".join(text)
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
n = int(0.9 * len(data))
splits = {"train": data[:n], "val": data[n:]}


def get_batch(split):
    d = splits[split]
    ix = torch.randint(len(d) - block_size, (batch_size,))
    return (torch.stack([d[i:i + block_size] for i in ix]),
            torch.stack([d[i + 1:i + 1 + block_size] for i in ix]))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(self.ln_1(x)).split(n_embd, dim=2)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.ln_f(self.blocks(self.wte(idx) + self.wpe(pos)))
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


@torch.no_grad()
def estimate_loss():
    model.eval()
    out = {}
    for split in ("train", "val"):
        out[split] = sum(model(*get_batch(split))[1].item() for _ in range(eval_iters)) / eval_iters
    model.train()
    return out


model = GPT(len(chars))
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, vocab "
      f"{len(chars)}, {len(data)} chars, {torch.get_num_threads()} threads", flush=True)

iter_num, train_s, iters = 0, 0.0, 0
try:
    while iter_num <= max_iters:
        if eval_interval and iter_num % eval_interval == 0:
            losses = estimate_loss()  # off the clock: t0 is taken after it
            print(f"step {iter_num}: train loss {losses['train']:.4f}, "
                  f"val loss {losses['val']:.4f}", flush=True)
        t0 = time.perf_counter()
        for _ in range(gradient_accumulation_steps):
            X, Y = get_batch("train")
            _, loss = model(X, Y)
            (loss / gradient_accumulation_steps).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        lossf = loss.item()
        train_s += time.perf_counter() - t0
        iters += 1
        if iter_num % log_interval == 0:
            samples = iters * batch_size * gradient_accumulation_steps
            print(f"iter {iter_num}: loss {lossf:.4f}, time {train_s * 1000 / iters:.2f}ms, "
                  f"{samples / train_s:.1f} samples/s", flush=True)
            train_s, iters = 0.0, 0
        iter_num += 1
except KeyboardInterrupt:
    print(f"interrupted at iter {iter_num}", flush=True)
