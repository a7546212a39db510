"""A single-GPU script in the shape of PyTorch's word-language-model example: one long stream
of tokens cut into --batch-size columns (no DataLoader), truncated back-propagation through
time with the recurrent state carried from batch to batch, the parameters updated by hand
(no optimizer), gradient clipping, the learning rate divided by 4 whenever the validation
loss stops falling, and the whole model saved when it is the best so far.

It imports nothing from the guide. The text is generated from the seed (each token drawn
from a distribution the previous token picks), so it runs anywhere in seconds; put your own
corpus in make_corpus and your model in LanguageModel. lm_train_ddp.py and
lm_train_horovod.py beside it are this file changed by chapter 16's checklist ("Your own
script"): `diff lm_train.py lm_train_ddp.py`.

    python examples/your_script/lm_train.py --epochs 3
"""

import argparse
import bisect
import hashlib
import itertools
import random

import torch
from torch import nn

VOCAB = 40


def parse_args():
    p = argparse.ArgumentParser(description="An LSTM language model on generated text.")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=16, help="columns of the stream (per GPU)")
    p.add_argument("--eval-batch-size", type=int, default=8, help="columns of the validation")
    p.add_argument("--bptt", type=int, default=20, help="tokens per truncated back-propagation")
    p.add_argument("--lr", type=float, default=5.0, help="the learning rate on one GPU")
    p.add_argument("--clip", type=float, default=0.25, help="largest norm of the gradients")
    p.add_argument("--tokens", type=int, default=20000, help="training tokens generated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--save", default="model.pt", help="the best model so far, saved whole")
    p.add_argument("--log-every", type=int, default=50, help="print lr and loss every N steps")
    return p.parse_args()


def make_corpus(seed, tokens):
    """A training and a validation stream: learnable, and the same for the same seed."""
    rng = random.Random(seed)
    rows = [[rng.random() ** 4 for _ in range(VOCAB)] for _ in range(VOCAB)]
    cumulative = [[c / sum(row) for c in itertools.accumulate(row)] for row in rows]
    stream, token = [], 0
    for _ in range(tokens + tokens // 5):
        token = min(bisect.bisect(cumulative[token], rng.random()), VOCAB - 1)
        stream.append(token)
    data = torch.tensor(stream)
    return data[:tokens], data[tokens:]


class LanguageModel(nn.Module):
    """An embedding, a two-layer LSTM, and a linear map back to the vocabulary."""

    def __init__(self, hidden=64, layers=2, dropout=0.2):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(VOCAB, hidden)
        self.rnn = nn.LSTM(hidden, hidden, layers, dropout=dropout)
        self.decoder = nn.Linear(hidden, VOCAB)
        self.layers, self.hidden = layers, hidden

    def forward(self, x, state):
        out, state = self.rnn(self.drop(self.encoder(x)), state)
        return self.decoder(self.drop(out)).view(-1, VOCAB), state

    def init_state(self, columns):
        weight = next(self.parameters())
        return tuple(weight.new_zeros(self.layers, columns, self.hidden) for _ in range(2))


def batchify(stream, columns):
    """The stream cut into `columns` streams side by side: shape (length, columns)."""
    length = len(stream) // columns
    return stream[:length * columns].view(columns, length).t().contiguous()


def get_batch(source, i, bptt):
    n = min(bptt, len(source) - 1 - i)
    return source[i:i + n], source[i + 1:i + 1 + n].reshape(-1)


def detach(state):
    """The recurrent state without its history: back-propagation stops at the batch's start."""
    return tuple(s.detach() for s in state)


def weights_digest(model):
    """A fingerprint of the weights: two models with the same digest are the same model."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def evaluate(model, source, columns, bptt, loss_fn):
    model.eval()
    total, state = 0.0, model.init_state(columns)
    with torch.no_grad():
        for i in range(0, len(source) - 1, bptt):
            x, y = get_batch(source, i, bptt)
            out, state = model(x, state)
            total += len(x) * loss_fn(out, y).item()
    return total / (len(source) - 1)


def train(model, source, args, lr, loss_fn, epoch):
    model.train()
    state = model.init_state(args.batch_size)
    for batch, i in enumerate(range(0, len(source) - 1, args.bptt)):
        x, y = get_batch(source, i, args.bptt)
        model.zero_grad()
        state = detach(state)
        out, state = model(x, state)
        loss = loss_fn(out, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():  # plain SGD, by hand
            p.data.add_(p.grad, alpha=-lr)
        if batch % args.log_every == 0:
            print(f"epoch {epoch} batch {batch} lr {lr:.10g} loss {loss.item():.4f}")


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    train_stream, valid_stream = make_corpus(args.seed, args.tokens)
    train_data = batchify(train_stream, args.batch_size).to(device)
    valid_data = batchify(valid_stream, args.eval_batch_size).to(device)
    model = LanguageModel().to(device)
    loss_fn = nn.CrossEntropyLoss()
    lr, best = args.lr, None
    for epoch in range(1, args.epochs + 1):
        train(model, train_data, args, lr, loss_fn, epoch)
        val_loss = evaluate(model, valid_data, args.eval_batch_size, args.bptt, loss_fn)
        print(f"epoch {epoch} valid loss {val_loss:.4f}")
        if best is None or val_loss < best:
            torch.save(model, args.save)  # the whole model, as the example saves it
            best = val_loss
        else:
            lr /= 4.0  # no better than the best so far: smaller steps
    print(f"weights {weights_digest(model)}")


if __name__ == "__main__":
    main()
