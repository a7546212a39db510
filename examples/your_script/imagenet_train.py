"""A single-GPU script in the shape of PyTorch's ImageNet example: train() and validate()
functions, AverageMeter and ProgressMeter, a StepLR drop every --lr-step epochs, a checkpoint
every epoch (--resume) and a copy of the best one by validation accuracy.

It imports nothing from the guide. The images are generated from the seed (3x16x16 noise
around one pattern per class), so it runs anywhere in seconds; put your own dataset in
make_datasets and your model in make_model. imagenet_train_ddp.py and
imagenet_train_horovod.py beside it are this file changed by chapter 16's checklist ("Your
own script"): `diff imagenet_train.py imagenet_train_ddp.py`.

    python examples/your_script/imagenet_train.py --epochs 3
"""

import argparse
import hashlib
import os
import shutil

import torch
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

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


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    """Write a new file, then rename it (a job killed mid-write keeps the old one); keep a copy
    of the best."""
    torch.save(state, filename + ".tmp")
    os.replace(filename + ".tmp", filename)
    if is_best:
        shutil.copyfile(filename, filename + ".best")


def train(train_loader, model, criterion, optimizer, epoch, device, args):
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
        if i % args.print_freq == 0:
            progress.display(i)


def validate(val_loader, model, criterion, device, args):
    top1 = AverageMeter("Acc@1", ":6.2f")
    model.eval()
    with torch.no_grad():
        for images, target in val_loader:
            images, target = images.to(device), target.to(device)
            top1.update(accuracy(model(images), target), images.size(0))
    print(f" * Acc@1 {top1.avg:.3f}")
    return top1.avg


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
    args = parser.parse_args()

    use_accel = torch.accelerator.is_available()
    torch.manual_seed(args.seed)
    device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
    train_set, val_set = make_datasets(args.seed, args.samples)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                              num_workers=args.workers, pin_memory=use_accel)
    val_loader = DataLoader(val_set, batch_size=args.batch_size, shuffle=False,
                            num_workers=args.workers, pin_memory=use_accel)
    model = make_model().to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    scheduler = StepLR(optimizer, step_size=args.lr_step, gamma=0.1)
    start_epoch, best_acc1 = 0, 0.0
    if os.path.isfile(args.resume):
        checkpoint = torch.load(args.resume, map_location=device)
        start_epoch, best_acc1 = checkpoint["epoch"], checkpoint["best_acc1"]
        model.load_state_dict(checkpoint["state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        print(f"=> loaded checkpoint '{args.resume}' (epoch {start_epoch})")
    for epoch in range(start_epoch, args.epochs):
        train(train_loader, model, criterion, optimizer, epoch, device, args)
        acc1 = validate(val_loader, model, criterion, device, args)
        scheduler.step()
        is_best, best_acc1 = acc1 > best_acc1, max(acc1, best_acc1)
        save_checkpoint({"epoch": epoch + 1, "state_dict": model.state_dict(),
                         "best_acc1": best_acc1, "optimizer": optimizer.state_dict(),
                         "scheduler": scheduler.state_dict()}, is_best, args.resume)
    print(f"weights {weights_digest(model)}")


if __name__ == "__main__":
    main()
