"""A single-GPU script in the shape of PyTorch's MNIST example: train() and test() functions
that take the model, a settings dict for the loaders, Adadelta, a StepLR decay per epoch, a
--dry-run that stops after one batch, and a model saved only at the end (--save-model).

It imports nothing from the guide. The images are generated from the seed (8x8 noise around
one pattern per class), so it runs anywhere in seconds; put your own dataset in
make_datasets. mnist_train_ddp.py and mnist_train_horovod.py beside it are this file changed
by chapter 16's checklist ("Your own script"): `diff mnist_train.py mnist_train_ddp.py`.

    python examples/your_script/mnist_train.py --epochs 3
"""

import argparse
import hashlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

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


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]"
                  f"  lr {optimizer.param_groups[0]['lr']:.10g}  Loss: {loss.item():.6f}")
            if args.dry_run:
                break


def test(model, device, test_loader):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += (output.argmax(dim=1) == target).sum().item()
    test_loss /= len(test_loader.dataset)
    print(f"Test set: Average loss: {test_loss:.4f}, "
          f"Accuracy: {correct}/{len(test_loader.dataset)}")


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
    args = parser.parse_args()

    use_accel = not args.no_accel and torch.accelerator.is_available()
    torch.manual_seed(args.seed)
    device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")

    train_kwargs = {"batch_size": args.batch_size}
    test_kwargs = {"batch_size": args.test_batch_size}
    if use_accel:
        accel_kwargs = {"num_workers": 1, "pin_memory": True, "shuffle": True}
        train_kwargs.update(accel_kwargs)
        test_kwargs.update(accel_kwargs)
    train_set, test_set = make_datasets(args.seed, args.samples)
    train_loader = DataLoader(train_set, **train_kwargs)
    test_loader = DataLoader(test_set, **test_kwargs)

    model = Net().to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()

    if args.save_model:
        torch.save(model.state_dict(), "mnist_cnn.pt")
    print(f"weights {weights_digest(model)}")


if __name__ == "__main__":
    main()
