"""train.py on many GPUs with PyTorch's DistributedDataParallel (DDP): one process per GPU.

`diff train.py train_ddp.py` shows every line that changed; chapter 16 of the guide ("Your
own script") says which chapter's evidence each rests on. One file for both launchers:
torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; under a plain srun they come from Slurm.

    torchrun --standalone --nproc-per-node=2 examples/your_script/train_ddp.py --epochs 3
    srun python examples/your_script/train_ddp.py --epochs 3      # inside a Slurm job
"""

import argparse
import hashlib
import itertools
import os
import signal

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

FEATURES, CLASSES = 32, 10


def parse_args():
    p = argparse.ArgumentParser(description="Train a small classifier on generated data.")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="samples per step (per GPU)")
    p.add_argument("--lr", type=float, default=0.05, help="the learning rate on one GPU")
    p.add_argument("--warmup-epochs", type=int, default=5, help="from the one-GPU lr to lr x GPUs")
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


def stop_requested(stop, device):  # a signal to any rank stops all, at the same step
    flag = torch.tensor([float(len(stop))], device=device)
    dist.all_reduce(flag)
    return flag.item() > 0


def main():
    args = parse_args()
    stop = []  # Slurm's warning before the time limit (sbatch --signal=B:USR1@600), or SIGTERM
    signal.signal(signal.SIGUSR1, lambda signum, frame: stop.append(signum))
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    if "RANK" not in os.environ:  # started by srun, not torchrun: ranks and rendezvous from Slurm
        os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_NTASKS"],
                          LOCAL_RANK=os.environ["SLURM_LOCALID"])
        # The step's nodes, expanded by python-hostlist: no `scontrol show hostnames`, which needs
        # Slurm's configuration and is missing inside most containers.
        import hostlist

        nodes = hostlist.expand_hostlist(os.environ["SLURM_STEP_NODELIST"])
        os.environ.setdefault("MASTER_ADDR", nodes[0])  # the first node, a port from the job id
        os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ["SLURM_JOB_ID"]) % 10000))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, size, local_rank = dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":  # one GPU per process; else every rank would compute on GPU 0
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    dataset = make_dataset(args.seed)
    sampler = SkippingSampler(dataset, size, rank, args.batch_size, seed=args.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                        drop_last=True, num_workers=args.loader_workers,
                        generator=torch.Generator())  # its own; dropout has the global one
    steps = min(len(loader), args.steps_per_epoch or len(loader))
    model = make_model().to(device)
    ddp_model = DistributedDataParallel(model)  # averages gradients; rank 0's weights to all
    # The linear scaling rule: a global batch `size` times larger, a learning rate too
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size,
                                momentum=0.9, weight_decay=1e-4)

    def lr_factor(step):  # gradual warmup from the one-GPU lr (args.lr), then tenfold drops
        if step < args.warmup_epochs * steps:
            return (1 + (size - 1) * step / (args.warmup_epochs * steps)) / size
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
        if rank == 0:
            print(f"resuming from {args.checkpoint} at step {step}")
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(step // steps, args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle every epoch (the same on every rank)
        model.train()
        totals = torch.zeros(3, device=device)  # summed loss, correct predictions, samples
        sampler.skip = step - epoch * steps  # resumed mid-epoch: the batches already trained
        for x, y in itertools.islice(loader, steps - sampler.skip):
            x, y = x.to(device), y.to(device)
            out = ddp_model(x)
            loss = loss_fn(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == 0 and step % args.log_every == 0:
                print(f"step {step} lr {scheduler.get_last_lr()[0]:.10g} loss {loss.item():.4f}")
            scheduler.step()
            step += 1
            correct = (out.argmax(1) == y).sum().item()
            totals += torch.tensor([loss.item() * len(y), correct, len(y)], device=device)
            # Asked every 10 steps, but not on an epoch's last: its end-of-epoch work comes first
            if step % 10 == 0 and step % steps and stop_requested(stop, device):
                if rank == 0:
                    save_checkpoint(args.checkpoint, model, optimizer, scheduler, step)
                dist.barrier()  # the checkpoint is written before any rank exits
                raise SystemExit(75)  # "requeue me", to the batch script
        dist.all_reduce(totals)  # summed over the ranks: the whole epoch
        if rank == 0:  # one line per epoch, one writer of the checkpoint
            print(f"epoch {epoch + 1}/{args.epochs} loss {totals[0] / totals[2]:.4f} "
                  f"accuracy {totals[1] / totals[2]:.4f}")
            save_checkpoint(args.checkpoint, model, optimizer, scheduler, step)
        if stop_requested(stop, device):  # warned at the epoch's end: stop now that it is done
            raise SystemExit(75)
    print(f"rank {rank} weights {weights_digest(model)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
