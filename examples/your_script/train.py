"""A plain single-GPU PyTorch training script: the kind a research project starts from.

It imports nothing from the guide. The data are generated from the seed (a few Gaussian
blobs, one per class), so it runs anywhere in seconds; put your own dataset and model in
make_dataset and make_model. train_horovod.py and train_ddp.py beside it are this file plus
the lines that scale it out to many GPUs: `diff train.py train_ddp.py` shows exactly those,
and chapter 16 of the guide ("Your own script") explains each.

    python examples/your_script/train.py --epochs 3
"""

import argparse
import hashlib
import itertools
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES, CLASSES = 32, 10


def parse_args():
    p = argparse.ArgumentParser(description="Train a small classifier on generated data.")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="samples per step (per GPU)")
    p.add_argument("--lr", type=float, default=0.05, help="the learning rate on one GPU")
    p.add_argument("--milestones", type=int, nargs="*", default=[30, 60, 80],
                   help="epochs at which the learning rate drops tenfold")
    p.add_argument("--steps-per-epoch", type=int, default=0, help="0: every batch")
    p.add_argument("--checkpoint", default="checkpoint.pt", help="saved every epoch, resumed from")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--loader-workers", type=int, default=0, help="DataLoader processes")
    p.add_argument("--log-every", type=int, default=50, help="print lr and loss every N steps")
    return p.parse_args()


def make_dataset(seed, samples=4096):
    """Noisy points around one centre per class: learnable, and the same for the same seed."""
    g = torch.Generator().manual_seed(seed)
    centres = 0.4 * torch.randn(CLASSES, FEATURES, generator=g)
    labels = torch.randint(CLASSES, (samples,), generator=g)
    return TensorDataset(centres[labels] + torch.randn(samples, FEATURES, generator=g), labels)


def make_model():
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(64, CLASSES))


def weights_digest(model):
    """A fingerprint of the weights: two models with the same digest are the same model."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def save_checkpoint(path, model, optimizer, scheduler, step):
    """Write a new file, then rename it: a job killed mid-write keeps its old checkpoint. The
    random number generator's state too: a resumed run draws the same dropout masks."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "step": step, "rng": torch.get_rng_state()}
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    dataset = make_dataset(args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                        drop_last=True, num_workers=args.loader_workers)
    steps = min(len(loader), args.steps_per_epoch or len(loader))
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr,
                                momentum=0.9, weight_decay=1e-4)

    def lr_factor(step):  # the learning rate is args.lr times this: tenfold drops at milestones
        return 0.1 ** sum(step >= m * steps for m in args.milestones)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    step = 0  # optimizer steps done, over all epochs
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step = state["step"]
        torch.set_rng_state(state["rng"])
        print(f"resuming from {args.checkpoint} at step {step}")
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(step // steps, args.epochs):
        model.train()
        totals = torch.zeros(3, device=device)  # summed loss, correct predictions, samples
        for x, y in itertools.islice(loader, steps):
            x, y = x.to(device), y.to(device)
            out = model(x)
            loss = loss_fn(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % args.log_every == 0:
                print(f"step {step} lr {scheduler.get_last_lr()[0]:.10g} loss {loss.item():.4f}")
            scheduler.step()
            step += 1
            correct = (out.argmax(1) == y).sum().item()
            totals += torch.tensor([loss.item() * len(y), correct, len(y)], device=device)
        print(f"epoch {epoch + 1}/{args.epochs} loss {totals[0] / totals[2]:.4f} "
              f"accuracy {totals[1] / totals[2]:.4f}")
        save_checkpoint(args.checkpoint, model, optimizer, scheduler, step)
    print(f"weights {weights_digest(model)}")


if __name__ == "__main__":
    main()
