"""A word-level LSTM language model shaped like PyTorch's word_language_model example: the corpus
is one long tensor cut into ``--batch_size`` columns (no DataLoader), each step a BPTT window,
and every ``--log-interval`` batches it prints its own clock:
``| epoch 1 |   200/ 2983 batches | ms/batch 52.31 | samples/s 382.4 | loss 6.52``.

The step is real compute (embedding, LSTM, decoder, clipped SGD), so its time grows with the
batch and with the threads torch gets. ``--pad-ms`` and ``--pad-ms-per-sample`` add a wait to
each step (standing for a slower device), for tests that need long steps without busy cores;
``--first-step-s`` makes the first step slow, as a lazy first batch would.
"""

import argparse
import sys
import time

import torch
from torch import nn


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp=64, nhid=64, nlayers=1):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(out), hidden


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch_size", type=int, default=20)
    p.add_argument("--bptt", type=int, default=35)
    p.add_argument("--epochs", type=int, default=1000)
    p.add_argument("--tokens", type=int, default=400_000)
    p.add_argument("--vocab", type=int, default=2000)
    p.add_argument("--lr", type=float, default=20.0)
    p.add_argument("--log-interval", type=int, default=20)
    p.add_argument("--pad-ms", type=float, default=0.0)
    p.add_argument("--pad-ms-per-sample", type=float, default=0.0)
    p.add_argument("--first-step-s", type=float, default=0.0)
    p.add_argument("--max-seconds", type=float, default=None, help="stop after this long")
    args = p.parse_args()

    torch.manual_seed(1111)
    corpus = torch.randint(0, args.vocab, (args.tokens,))
    train = batchify(corpus, args.batch_size)
    model = RNNModel(args.vocab)
    crit = nn.CrossEntropyLoss()
    t_start = time.perf_counter()
    step = 0
    for epoch in range(1, args.epochs + 1):
        hidden = None
        t0, total = time.perf_counter(), 0.0
        nbatches = (train.size(0) - 1) // args.bptt
        for batch, i in enumerate(range(0, train.size(0) - 1, args.bptt)):
            t_step = time.perf_counter()
            seq = min(args.bptt, train.size(0) - 1 - i)
            x, y = train[i:i + seq], train[i + 1:i + 1 + seq].reshape(-1)
            if hidden is not None:
                hidden = tuple(h.detach() for h in hidden)
            model.zero_grad()
            out, hidden = model(x, hidden)
            loss = crit(out.view(-1, args.vocab), y)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            with torch.no_grad():
                for prm in model.parameters():
                    prm.add_(prm.grad, alpha=-args.lr)
            pad = (args.pad_ms + args.pad_ms_per_sample * args.batch_size) / 1000
            if step == 0:
                pad += args.first_step_s
            time.sleep(max(0.0, pad - (time.perf_counter() - t_step) if pad else 0.0))
            step += 1
            total += loss.item()
            if batch % args.log_interval == 0 and batch > 0:
                ms = (time.perf_counter() - t0) * 1000 / args.log_interval
                print(f"| epoch {epoch:3d} | {batch:5d}/{nbatches:5d} batches | "
                      f"ms/batch {ms:5.2f} | samples/s {args.batch_size * 1000 / ms:.1f} | "
                      f"loss {total / args.log_interval:5.2f}", flush=True)
                t0, total = time.perf_counter(), 0.0
            if args.max_seconds is not None and time.perf_counter() - t_start > args.max_seconds:
                return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
