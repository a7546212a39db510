"""keras_train.py on many GPUs with Horovod: one process per GPU, gradients averaged.

`diff keras_train.py keras_train_horovod.py` shows every line that changed; chapter 16 of
the guide ("Your own script") says which chapter's evidence each rests on. Start it with
horovodrun, mpirun or srun (with srun's MPI plugin, e.g. --mpi=pmix):

    horovodrun -np 2 python examples/your_script/keras_train_horovod.py --epochs 3
    srun python examples/your_script/keras_train_horovod.py --epochs 3      # in a Slurm job
"""

import argparse
import hashlib
import os
import signal

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

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
    p.add_argument("--checkpoint", default="checkpoint", help="saved every epoch, resumed from")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50, help="print the lr every N steps")
    return p.parse_args()


def make_dataset(seed, samples=4096):
    """Noisy points around one centre per class: learnable, and the same for the same seed."""
    rng = np.random.default_rng(seed)
    centres = 0.4 * rng.standard_normal((CLASSES, FEATURES))
    labels = rng.integers(CLASSES, size=samples)
    return (centres[labels] + rng.standard_normal((samples, FEATURES))).astype("float32"), labels


def make_model():
    return tf.keras.Sequential([tf.keras.Input((FEATURES,)),
                                tf.keras.layers.Dense(64, activation="relu"),
                                tf.keras.layers.Dense(CLASSES)])


def weights_digest(model):
    """A fingerprint of the weights: two models with the same digest are the same model."""
    h = hashlib.sha256()
    for w in model.weights:
        h.update(w.numpy().tobytes())
    return h.hexdigest()[:16]


class LearningRatePerStep(tf.keras.callbacks.Callback):
    """Sets the learning rate before every step to lr(step), as PyTorch's LambdaLR does, and
    prints it every `every` steps (0: never). The step is the optimizer's own count, which
    the checkpoint keeps."""

    def __init__(self, lr, every):
        super().__init__()
        self.lr, self.every = lr, every

    def on_train_batch_begin(self, batch, logs=None):
        step = int(self.model.optimizer.iterations)
        tf.keras.backend.set_value(self.model.optimizer.learning_rate, self.lr(step))
        if self.every and step % self.every == 0:
            print(f"step {step} lr {self.lr(step):.10g}")


def main():
    args = parse_args()
    stop = []  # Slurm's warning before the time limit (sbatch --signal=B:USR1@600), or SIGTERM
    signal.signal(signal.SIGUSR1, lambda signum, frame: stop.append(signum))
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:  # one GPU per process; else every rank would compute on GPU 0
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
    tf.keras.utils.set_random_seed(args.seed)
    x, y = make_dataset(args.seed)
    steps = min(len(x) // size // args.batch_size, args.steps_per_epoch or len(x))
    model = make_model()
    # Keras's legacy SGD: the optimizer that Horovod 0.28.1 wraps reliably
    optimizer = tf.keras.optimizers.legacy.SGD(args.lr, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer)  # gradients averaged over the ranks
    model.compile(optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

    def lr_factor(step):  # gradual warmup from the one-GPU lr (args.lr), then tenfold drops
        if step < args.warmup_epochs * steps:
            return (1 + (size - 1) * step / (args.warmup_epochs * steps)) / size
        return 0.1 ** sum(step >= m * steps for m in args.milestones)

    def check_stop(batch, logs):  # every 10 steps, not on an epoch's last: any rank signalled?
        step = int(optimizer.iterations)
        if step % 10 == 0 and step % steps and hvd.allreduce(len(stop), op=hvd.Sum) > 0:
            model.stop_training = True

    # The linear scaling rule: a global batch `size` times larger, a learning rate too
    callbacks = [LearningRatePerStep(lambda step: args.lr * size * lr_factor(step),
                                     args.log_every if rank == 0 else 0),
                 hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # rank 0's weights to all
                 hvd.callbacks.MetricAverageCallback(),  # the epoch's metrics, averaged
                 tf.keras.callbacks.LambdaCallback(on_train_batch_end=check_stop)]
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    if os.path.exists(args.checkpoint + ".index"):
        checkpoint.read(args.checkpoint)  # the weights, the momentum and the step count
        if rank == 0:
            print(f"resuming from {args.checkpoint} at step {int(optimizer.iterations)}")
    for epoch in range(int(optimizer.iterations) // steps, args.epochs):
        order = np.random.default_rng([args.seed, epoch]).permutation(len(x))  # this epoch's
        done = int(optimizer.iterations) - epoch * steps  # steps a resumed run has done
        order = order[rank::size][done * args.batch_size:steps * args.batch_size]  # this rank's
        history = model.fit(x[order], y[order], batch_size=args.batch_size, shuffle=False,
                            verbose=0, callbacks=callbacks).history
        if model.stop_training:  # a signal: save where all ranks stopped
            if rank == 0:
                checkpoint.write(args.checkpoint)
            hvd.allreduce(0, name="saved")  # a barrier: the checkpoint is written before any exit
            raise SystemExit(75)  # "requeue me", to the batch script
        if rank == 0:  # one line per epoch, one writer of the checkpoint
            print(f"epoch {epoch + 1}/{args.epochs} loss {history['loss'][-1]:.4f} "
                  f"accuracy {history['accuracy'][-1]:.4f}")
            checkpoint.write(args.checkpoint)
        if hvd.allreduce(len(stop), op=hvd.Sum) > 0:  # warned at the epoch's end: stop after it
            raise SystemExit(75)
    print(f"rank {rank} weights {weights_digest(model)}")


if __name__ == "__main__":
    main()
