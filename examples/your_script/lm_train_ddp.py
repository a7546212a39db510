"""lm_train.py on many GPUs with PyTorch's DistributedDataParallel (DDP), by chapter 16's
checklist: `diff lm_train.py lm_train_ddp.py` shows every line that changed. There is no
DataLoader: each rank takes its own columns of the token stream. The update by hand stays:
DDP has averaged the gradients when backward() returns, so clipping and the update see the
average. It gains a resumable checkpoint that holds every rank's recurrent state.

    torchrun --standalone --nproc-per-node=2 examples/your_script/lm_train_ddp.py
"""

import argparse
import bisect
import hashlib
import itertools
import os
import random
import signal

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

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
    p.add_argument("--warmup-epochs", type=int, default=2, help="from the one-GPU lr to lr x GPUs")
    p.add_argument("--checkpoint", default="checkpoint.pt", help="saved every epoch, resumed from")
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


def stop_requested(stop, device):  # a signal to any rank stops all, at the same step
    flag = torch.tensor([float(len(stop))], device=device)
    dist.all_reduce(flag)
    return flag.item() > 0


def evaluate(model, source, columns, bptt, loss_fn):
    model.eval()
    total, state = 0.0, model.init_state(columns)
    with torch.no_grad():
        for i in range(0, len(source) - 1, bptt):
            x, y = get_batch(source, i, bptt)
            out, state = model(x, state)
            total += len(x) * loss_fn(out, y).item()
    # This rank's columns; summed over the ranks in float64, one loss that every rank shares
    sums = torch.tensor([total, len(source) - 1], dtype=torch.float64, device=source.device)
    dist.all_reduce(sums)
    return (sums[0] / sums[1]).item()


def train(model, source, args, run, loss_fn, epoch):
    model.train()
    steps = len(range(0, len(source) - 1, args.bptt))
    done = run["step"] - (epoch - 1) * steps  # resumed mid-epoch: the batches already trained
    state = run.pop("state", None) or model.module.init_state(args.batch_size)
    for batch, i in enumerate(range(0, len(source) - 1, args.bptt)):
        if batch < done:
            continue
        lr = run["lr"] * run["warmup"](run["step"])
        x, y = get_batch(source, i, args.bptt)
        model.zero_grad()
        state = detach(state)
        out, state = model(x, state)
        loss = loss_fn(out, y)
        loss.backward()  # DDP averaged the gradients: clipping and the update see the average
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():  # plain SGD, by hand
            p.data.add_(p.grad, alpha=-lr)
        if run["rank"] == 0 and batch % args.log_every == 0:
            print(f"epoch {epoch} batch {batch} step {run['step']} lr {lr:.10g} "
                  f"loss {loss.item():.4f}")
        run["step"] += 1
        # Asked every 10 steps, but not on an epoch's last: its end-of-epoch work comes first
        if run["step"] % 10 == 0 and run["step"] % steps \
                and stop_requested(run["stop"], x.device):
            run["save"](state)  # every rank's recurrent state: a resumed run goes on with it
            raise SystemExit(75)  # "requeue me", to the batch script (torchrun reports 1)


def main():
    args = parse_args()
    stop = []  # Slurm's warning before the time limit (sbatch --signal=B:USR1@600), or SIGTERM
    signal.signal(signal.SIGUSR1, lambda signum, frame: stop.append(signum))
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":  # one GPU per process; else every rank would compute on GPU 0
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    train_stream, valid_stream = make_corpus(args.seed, args.tokens)
    # No sampler to shard: all ranks' columns side by side, and this rank takes its own
    train_data = batchify(train_stream, args.batch_size * size).to(device)
    train_data = train_data[:, rank * args.batch_size:(rank + 1) * args.batch_size]
    valid_data = batchify(valid_stream, args.eval_batch_size * size).to(device)
    valid_data = valid_data[:, rank * args.eval_batch_size:(rank + 1) * args.eval_batch_size]
    model = LanguageModel().to(device)
    ddp_model = DistributedDataParallel(model)  # averages gradients; rank 0's weights to all
    loss_fn = nn.CrossEntropyLoss()
    steps = len(range(0, len(train_data) - 1, args.bptt))
    warm = args.warmup_epochs * steps

    def warmup(step):  # gradual warmup from the one-GPU lr (args.lr) to the scaled one
        return (1 + (size - 1) * step / warm) / size if step < warm else 1.0

    # The linear scaling rule: a global batch `size` times larger, a learning rate too
    run = {"step": 0, "lr": args.lr * size, "best": None, "stop": stop, "rank": rank,
           "warmup": warmup}

    def save(state=None):  # every rank's recurrent state gathered; rank 0 writes, all wait
        states = [None] * size
        dist.all_gather_object(states, state and [s.cpu() for s in state])
        if rank == 0:
            kept = {k: run[k] for k in ("step", "lr", "best")}  # the position, the plateau's
            torch.save({"model": model.state_dict(), "states": states, **kept,
                        "rng": torch.get_rng_state()}, args.checkpoint)
        dist.barrier()

    run["save"] = save
    if os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(ckpt["model"])
        run.update({k: ckpt[k] for k in ("step", "lr", "best")})
        if ckpt["states"][rank] is not None:  # stopped mid-epoch: this rank's state goes on
            run["state"] = tuple(s.to(device) for s in ckpt["states"][rank])
        torch.set_rng_state(ckpt["rng"])
        if rank == 0:
            print(f"resuming from {args.checkpoint} at step {run['step']}")
    for epoch in range(1 + run["step"] // steps, args.epochs + 1):
        train(ddp_model, train_data, args, run, loss_fn, epoch)
        val_loss = evaluate(model, valid_data, args.eval_batch_size, args.bptt, loss_fn)
        if rank == 0:
            print(f"epoch {epoch} valid loss {val_loss:.4f}")
        if run["best"] is None or val_loss < run["best"]:  # every rank decides alike
            if rank == 0:
                torch.save(model, args.save)  # the whole model, as the example saves it
            run["best"] = val_loss
        else:
            run["lr"] /= 4.0  # no better than the best so far: smaller steps
        save()
        if stop_requested(stop, device):  # warned at the epoch's end: stop now that it is done
            raise SystemExit(75)
    print(f"rank {rank} weights {weights_digest(model)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
