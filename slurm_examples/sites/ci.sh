# shellcheck shell=bash disable=SC2034  # every value is read by slurm_examples/lib/guide.sh
# This repository's CI and any laptop with a Slurm: CPUs only, Horovod over Gloo/MPI, the
# smoke training profile, a real (tiny) image archive staged like ImageNet would be. The
# tests start a two-node Slurm on the machine and submit every example with this profile.
GUIDE_ACCOUNT=""
GUIDE_PARTITION=""
GUIDE_TASKS_PER_NODE=2
GUIDE_CPUS_PER_TASK=1
GUIDE_GPU_REQUEST=""
GUIDE_SCRATCH=${GUIDE_CI_SCRATCH:-}  # the tests' "node-local" disk; empty: $TMPDIR, else /tmp
GUIDE_SOFTWARE=venv
GUIDE_VENV=$GUIDE_ROOT/.venv
# python -m guide_utils pack-dataset digits data/digits.tar
GUIDE_DATASET_ARCHIVE=${GUIDE_DATASET_ARCHIVE:-$GUIDE_ROOT/data/digits.tar}
GUIDE_DATASET_NAME=digits
GUIDE_TRAIN_PROFILE=smoke
GUIDE_TRAIN_ARGS=(--model small_resnet --image-size 16)  # an image model for the image archive
GUIDE_SRUN_MPI=pmix
GUIDE_SBATCH_EXTRA=()
GUIDE_HOROVOD=yes  # the venv's Horovod (Gloo and MPI): CPUs only, no NCCL needed
# The doctor's framework probes import PyTorch, TensorFlow and Horovod in fresh interpreters:
# about 7 CPU-seconds a job, and the tests submit some thirty jobs on two cores. The tests'
# jobs that check the doctor's verdict set GUIDE_DOCTOR=full; the stack itself is checked
# once per run by tests/test_doctor.py.
GUIDE_DOCTOR=${GUIDE_DOCTOR:-quick}
# Two cores: one thread per process, and MPI ranks that wait yield the core instead of
# spinning on it (the tests run several jobs at once); CI runs as root, which OpenMPI
# refuses unless told.
export OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# A rank that dies of a fatal signal prints its threads' Python stacks; Open MPI, finding the
# handler in place, leaves it there (its own printed one C frame). The CI's rare segmentation
# fault of a rank under srun's PMIx (docs/setup.md) should say where it happened.
export PYTHONFAULTHANDLER=1
# The tests' two Slurm "nodes" are one host: OpenMPI's shared-memory transport would mix
# up the same local ranks of both nodes, so MPI talks over TCP (and self) only, and only on
# the loopback interface the two "nodes" share (other interfaces here may not route).
export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
# The same for the other launchers: nothing a test job starts should be reachable from the
# network. The rendezvous host (DDP under srun) and the interfaces of Gloo (PyTorch's and
# Horovod's) and of PyTorch's TensorPipe; the node names resolve to 127.0.0.1 in the test
# Slurm's hosts file, which covers torchrun's rendezvous host and TensorFlow's workers.
export MASTER_ADDR=127.0.0.1 GLOO_SOCKET_IFNAME=lo TP_SOCKET_IFNAME=lo HOROVOD_GLOO_IFACE=lo
