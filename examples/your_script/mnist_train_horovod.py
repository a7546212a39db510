"""mnist_train.py on many GPUs with Horovod, by chapter 16's checklist: `diff mnist_train.py
mnist_train_horovod.py` shows every line that changed. The script had no resumable
checkpoint and no step counter; both are added (item 10). Start it with horovodrun, mpirun
or srun (with srun's MPI plugin):

    horovodrun -np 2 python examples/your_script/mnist_train_horovod.py --epochs 3
"""

import argparse
import hashlib
import itertools
import os
import signal

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

CLASSES = 10


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, CLASSES)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(torch.flatten(x, 1))
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def make_datasets(seed, samples):
    """Training and test images: noise around one 8x8 pattern per class, the same for a seed."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(CLASSES, 1, 8, 8, generator=g)
    labels = torch.randint(CLASSES, (samples + samples // 4,), generator=g)
    images = patterns[labels] + 1.5 * torch.randn(len(labels), 1, 8, 8, generator=g)
    return (TensorDataset(images[:samples], labels[:samples]),
            TensorDataset(images[samples:], labels[samples:]))


def weights_digest(model):
    """A fingerprint of the weights: two models with the same digest are the same model."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


class SkippingSampler(DistributedSampler):
    """This rank's shard of an epoch, from `skip` batches in: a resumed run skips the batches
    it trained before it stopped without loading them (slicing the loader would load them)."""

    def __init__(self, dataset, size, rank, batch_size, **kwargs):
        super().__init__(dataset, size, rank, **kwargs)
        self.batch_size, self.skip = batch_size, 0

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.skip * self.batch_size, None)

    def __len__(self):
        return super().__len__() - self.skip * self.batch_size


def save_checkpoint(path, model, optimizer, scheduler, step):
    """Write a new file, then rename it: a job killed mid-write keeps its old checkpoint. The
    random number generator's state too: a resumed run draws the same dropout masks."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "step": step, "rng": torch.get_rng_state()}
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def stop_requested(stop):  # a signal to any rank stops all, at the same step
    return hvd.allreduce(torch.tensor(len(stop)), op=hvd.Sum) > 0


def train(args, model, device, train_loader, optimizer, epoch, scheduler, run):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            if run["rank"] == 0:  # only printing goes under the guard: every rank must break
                print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.sampler)}]"
                      f"  step {run['step']} lr {scheduler.get_last_lr()[0]:.10g}"
                      f"  Loss: {loss.item():.6f}")
            if args.dry_run:
                break
        scheduler.step()  # every step: the warmup is a ramp over steps
        run["step"] += 1
        # Asked every 10 steps, but not on an epoch's last: its end-of-epoch work comes first
        if run["step"] % 10 == 0 and run["step"] % run["steps"] and stop_requested(run["stop"]):
            if run["rank"] == 0:
                save_checkpoint(args.checkpoint, model, optimizer, scheduler, run["step"])
            hvd.barrier()  # the checkpoint is written before any rank exits
            raise SystemExit(75)  # "requeue me", to the batch script


def test(model, device, test_loader):
    model.eval()
    sums = torch.zeros(3, device=device)  # summed loss, correct predictions, images
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            loss = F.nll_loss(output, target, reduction="sum").item()
            correct = (output.argmax(dim=1) == target).sum().item()
            sums += torch.tensor([loss, correct, len(target)], device=device)
    sums = hvd.allreduce(sums, op=hvd.Sum)  # every rank tested its share: the whole test set's
    if hvd.rank() == 0:
        print(f"Test set: Average loss: {sums[0] / sums[2]:.4f}, "
              f"Accuracy: {int(sums[1])}/{int(sums[2])}")


def main():
    parser = argparse.ArgumentParser(description="An MNIST-shaped example on generated images")
    parser.add_argument("--batch-size", type=int, default=64, help="input batch size for training")
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--lr", type=float, default=1.0, help="learning rate (Adadelta)")
    parser.add_argument("--gamma", type=float, default=0.7, help="learning rate step gamma")
    parser.add_argument("--no-accel", action="store_true", help="disables the accelerator")
    parser.add_argument("--dry-run", action="store_true", help="quickly check a single pass")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10, help="batches between prints")
    parser.add_argument("--samples", type=int, default=6000, help="training images generated")
    parser.add_argument("--save-model", action="store_true", help="save the model at the end")
    parser.add_argument("--warmup-epochs", type=int, default=2, help="from the one-GPU lr up")
    parser.add_argument("--checkpoint", default="mnist_checkpoint.pt", help="saved, resumed from")
    args = parser.parse_args()

    stop = []  # Slurm's warning before the time limit (sbatch --signal=B:USR1@600), or SIGTERM
    signal.signal(signal.SIGUSR1, lambda signum, frame: stop.append(signum))
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    use_accel = not args.no_accel and torch.accelerator.is_available()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if use_accel:  # one device per process; else every rank would compute on device 0
        torch.accelerator.set_device_index(hvd.local_rank() % torch.accelerator.device_count())
    torch.manual_seed(args.seed)
    device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")

    train_kwargs = {"batch_size": args.batch_size}
    test_kwargs = {"batch_size": args.test_batch_size}
    if use_accel:  # no "shuffle": the sampler shuffles, and DataLoader refuses both
        accel_kwargs = {"num_workers": 1, "pin_memory": True}
        train_kwargs.update(accel_kwargs)
        test_kwargs.update(accel_kwargs)
    train_set, test_set = make_datasets(args.seed, args.samples)
    sampler = SkippingSampler(train_set, size, rank, args.batch_size, seed=args.seed)
    train_loader = DataLoader(train_set, sampler=sampler, **train_kwargs,
                              generator=torch.Generator())  # its own; dropout has the global one
    test_loader = DataLoader(Subset(test_set, range(rank, len(test_set), size)), **test_kwargs)
    steps = len(train_loader)

    model = Net().to(device)
    # Adadelta is not SGD: the linear rule's argument does not cover it. The square-root rule,
    # as LAMB's authors scale their Adam-like optimizer, with warmup; measure before trusting.
    peak = args.lr * size**0.5
    optimizer = torch.optim.Adadelta(model.parameters(), lr=peak)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    warm = args.warmup_epochs * steps

    def lr_factor(step):  # gradual warmup from the one-GPU lr, then StepLR's decay from its end
        if step < warm:
            return (args.lr + (peak - args.lr) * step / warm) / peak
        return args.gamma ** ((step - warm) // steps)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    run = {"step": 0, "stop": stop, "rank": rank, "steps": steps}  # step: over all epochs
    if os.path.exists(args.checkpoint):  # a resumable checkpoint: all of the run's state
        state = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        run["step"] = state["step"]
        torch.set_rng_state(state["rng"])
        if rank == 0:
            print(f"resuming from {args.checkpoint} at step {run['step']}")
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # every rank starts from rank 0's
    for epoch in range(1 + run["step"] // steps, args.epochs + 1):
        sampler.set_epoch(epoch)  # a new shuffle every epoch (the same on every rank)
        sampler.skip = run["step"] - (epoch - 1) * steps  # resumed mid-epoch: batches trained
        train(args, model, device, train_loader, optimizer, epoch, scheduler, run)
        test(model, device, test_loader)
        if rank == 0:  # one writer of the checkpoint
            save_checkpoint(args.checkpoint, model, optimizer, scheduler, run["step"])
        if stop_requested(stop):  # warned at the epoch's end: stop now that it is done
            raise SystemExit(75)

    if args.save_model and rank == 0:
        torch.save(model.state_dict(), "mnist_cnn.pt")
    print(f"rank {rank} weights {weights_digest(model)}")


if __name__ == "__main__":
    main()
