#!/usr/bin/env bash
# A `lumos sweep` across the nodes of a Slurm allocation: one MPI process per node, each using all
# of its node's cores with threads; rank 0 gathers and writes the same output a single process
# would. Submit with:  sbatch scripts/slurm_sweep.sh   (adjust nodes, time and the sweep below)
#SBATCH --job-name=lumos-sweep
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=32
#SBATCH --time=00:30:00
#SBATCH --output=lumos-sweep-%j.out
set -euo pipefail

# lumos built with LUMOS_WITH_MPI against the cluster's MPI (the one srun's PMI speaks to):
#   cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build/release --target lumos
LUMOS=${LUMOS:-build/release/examples/lumos}

# One process per node and --threads = the cores Slurm gave it (lumos would otherwise divide the
# node's cores by the processes on the node, which is the same here).
srun --mpi=pmix "$LUMOS" sweep --model gpt3-175b --gpus 1024 --global-batch 1536 \
  --tp 1,2,4,8 --pp 1,2,4,8,16,32 --vp 1,2,4 --micro-batch 1,2,4 --schedule 1f1b,interleaved \
  --threads "${SLURM_CPUS_PER_TASK}" --top 20 --csv "lumos-sweep-${SLURM_JOB_ID}.csv"
