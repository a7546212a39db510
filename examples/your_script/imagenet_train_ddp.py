"""imagenet_train.py on many GPUs with PyTorch's DistributedDataParallel (DDP), by chapter
16's checklist: `diff imagenet_train.py imagenet_train_ddp.py` shows every line that changed.
Its checkpoint was resumable at epoch ends; it gains the position within an epoch and the
random number generator's state, so that a job stopped by Slurm's warning resumes exactly.

    torchrun --standalone --nproc-per-node=2 examples/your_script/imagenet_train_ddp.py
"""

import argparse
import hashlib
import itertools
import os
import shutil
import signal

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

CLASSES = 10


def make_datasets(seed, samples):
    """Training and validation images: noise around one pattern per class, the same for a seed."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(CLASSES, 3, 16, 16, generator=g)
    labels = torch.randint(CLASSES, (samples + samples // 4,), generator=g)
    images = patterns[labels] + 2.0 * torch.randn(len(labels), 3, 16, 16, generator=g)
    return (TensorDataset(images[:samples], labels[:samples]),
            TensorDataset(images[samples:], labels[samples:]))


def make_model():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, CLASSES))


def weights_digest(model):
    """A fingerprint of the weights: two models with the same digest are the same model."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


class AverageMeter:
    """The current value and the running average of a quantity."""

    def __init__(self, name, fmt=":f"):
        self.name, self.fmt = name, fmt
        self.val = self.sum = self.count = self.avg = 0

    def update(self, val, n=1):
        self.val, self.sum, self.count = val, self.sum + val * n, self.count + n
        self.avg = self.sum / self.count

    def __str__(self):
        return ("{name} {val" + self.fmt + "} ({avg" + self.fmt + "})").format(**self.__dict__)


class ProgressMeter:
    def __init__(self, num_batches, meters, prefix=""):
        self.num_batches, self.meters, self.prefix = num_batches, meters, prefix

    def display(self, batch):
        entries = [f"{self.prefix}[{batch}/{self.num_batches}]"] + [str(m) for m in self.meters]
        print("  ".join(entries))


def accuracy(output, target):
    """Top-1 accuracy (%) of a batch."""
    with torch.no_grad():
        return (output.argmax(1) == target).float().mean().item() * 100


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


def stop_requested(stop, device):  # a signal to any rank stops all, at the same step
    flag = torch.tensor([float(len(stop))], device=device)
    dist.all_reduce(flag)
    return flag.item() > 0


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    """Write a new file, then rename it (a job killed mid-write keeps the old one); keep a copy
    of the best."""
    torch.save(state, filename + ".tmp")
    os.replace(filename + ".tmp", filename)
    if is_best:
        shutil.copyfile(filename, filename + ".best")


def train(train_loader, model, criterion, optimizer, epoch, device, args, run):
    losses, top1 = AverageMeter("Loss", ":.4e"), AverageMeter("Acc@1", ":6.2f")
    progress = ProgressMeter(len(train_loader), [losses, top1], prefix=f"Epoch: [{epoch}]")
    model.train()
    for i, (images, target) in enumerate(train_loader):
        images, target = images.to(device), target.to(device)
        output = model(images)
        loss = criterion(output, target)
        losses.update(loss.item(), images.size(0))
        top1.update(accuracy(output, target), images.size(0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if run["rank"] == 0 and i % args.print_freq == 0:
            progress.display(i)
            print(f"step {run['step']} lr {run['scheduler'].get_last_lr()[0]:.10g}")
        run["scheduler"].step()  # every step: the warmup is a ramp over steps
        run["step"] += 1
        # Asked every 10 steps, but not on an epoch's last: its end-of-epoch work comes first
        if run["step"] % 10 == 0 and run["step"] % run["steps"] \
                and stop_requested(run["stop"], device):
            if run["rank"] == 0:
                run["save"](epoch)
            dist.barrier()  # the checkpoint is written before any rank exits
            raise SystemExit(75)  # "requeue me", to the batch script (torchrun reports 1)


def validate(val_loader, model, criterion, device, args):
    correct = torch.zeros(2, device=device)  # correct predictions, images: this rank's share
    model.eval()
    with torch.no_grad():
        for images, target in val_loader:
            images, target = images.to(device), target.to(device)
            correct += torch.tensor([(model(images).argmax(1) == target).sum().item(),
                                     len(target)], device=device)
    dist.all_reduce(correct)  # every rank validated its share: the whole set's accuracy
    acc1 = (100 * correct[0] / correct[1]).item()
    if dist.get_rank() == 0:
        print(f" * Acc@1 {acc1:.3f}")
    return acc1


def main():
    parser = argparse.ArgumentParser(description="An ImageNet-shaped example on generated images")
    parser.add_argument("--epochs", default=90, type=int)
    parser.add_argument("-b", "--batch-size", default=256, type=int)
    parser.add_argument("--lr", default=0.1, type=float, help="initial learning rate")
    parser.add_argument("--lr-step", default=30, type=int, help="epochs between tenfold drops")
    parser.add_argument("--momentum", default=0.9, type=float)
    parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    parser.add_argument("-p", "--print-freq", default=10, type=int)
    parser.add_argument("--resume", default="checkpoint.pth.tar", help="saved every epoch")
    parser.add_argument("--seed", default=0, type=int)
    parser.add_argument("--samples", default=2560, type=int, help="training images generated")
    parser.add_argument("--workers", default=0, type=int, help="data loading workers")
    parser.add_argument("--warmup-epochs", default=5, type=int, help="from the one-GPU lr up")
    args = parser.parse_args()

    stop = []  # Slurm's warning before the time limit (sbatch --signal=B:USR1@600), or SIGTERM
    signal.signal(signal.SIGUSR1, lambda signum, frame: stop.append(signum))
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    use_accel = torch.accelerator.is_available()
    if use_accel:  # one device per process; else every rank would compute on device 0
        local_rank = int(os.environ["LOCAL_RANK"])  # torchrun sets it
        torch.accelerator.set_device_index(local_rank % torch.accelerator.device_count())
    dist.init_process_group()  # the device's backend: Gloo on CPUs, NCCL on NVIDIA GPUs
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
    train_set, val_set = make_datasets(args.seed, args.samples)
    sampler = SkippingSampler(train_set, size, rank, args.batch_size, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler,
                              num_workers=args.workers, pin_memory=use_accel,
                              generator=torch.Generator())  # its own; dropout has the global one
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), size)),
                            batch_size=args.batch_size, shuffle=False,
                            num_workers=args.workers, pin_memory=use_accel)
    steps, warm = len(train_loader), args.warmup_epochs * len(train_loader)
    model = make_model().to(device)
    ddp_model = DistributedDataParallel(model)  # averages gradients; rank 0's weights to all
    criterion = nn.CrossEntropyLoss().to(device)
    # The linear scaling rule: a global batch `size` times larger, a learning rate too
    optimizer = torch.optim.SGD(model.parameters(), args.lr * size, momentum=args.momentum,
                                weight_decay=args.weight_decay)

    def lr_factor(step):  # gradual warmup from the one-GPU lr, then the drops of StepLR
        if step < warm:
            return (1 + (size - 1) * step / warm) / size
        return 0.1 ** (step // steps // args.lr_step)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    best_acc1 = 0.0
    run = {"step": 0, "stop": stop, "rank": rank, "scheduler": scheduler, "steps": steps}

    def save(epoch, is_best=False):  # the unwrapped model: DDP's wrapper would add "module."
        save_checkpoint({"epoch": epoch, "step": run["step"], "state_dict": model.state_dict(),
                         "best_acc1": best_acc1, "optimizer": optimizer.state_dict(),
                         "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state()},
                        is_best, args.resume)

    run["save"] = save
    if os.path.isfile(args.resume):
        checkpoint = torch.load(args.resume, map_location=device)
        run["step"], best_acc1 = checkpoint["step"], checkpoint["best_acc1"]
        model.load_state_dict(checkpoint["state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        torch.set_rng_state(checkpoint["rng"])
        if rank == 0:
            print(f"resuming from {args.resume} at step {run['step']}")
    for epoch in range(run["step"] // steps, args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle every epoch (the same on every rank)
        sampler.skip = run["step"] - epoch * steps  # resumed mid-epoch: the batches trained
        train(train_loader, ddp_model, criterion, optimizer, epoch, device, args, run)
        acc1 = validate(val_loader, model, criterion, device, args)
        is_best, best_acc1 = acc1 > best_acc1, max(acc1, best_acc1)
        if rank == 0:  # one writer of the checkpoint
            save(epoch + 1, is_best)
        if stop_requested(stop, device):  # warned at the epoch's end: stop now that it is done
            raise SystemExit(75)
    print(f"rank {rank} weights {weights_digest(model)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
