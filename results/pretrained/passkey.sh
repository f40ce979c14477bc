#!/usr/bin/env bash
# The passkey part of the reading (results/pretrained/README.md): one prompt per depth (five depths);
# each command writes its rows when done.
set -euo pipefail
export OMP_NUM_THREADS=1  # one thread per command: on cores shared with other jobs, two threads wait on each other
P="posbench probe --task pretrained --probe passkey --out results/pretrained"
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }
stamp start
# done first with two threads: $P --lengths 8192 --rope-scaling none
$P --lengths 16384 --rope-scaling self-extend; stamp 16k-self-extend
$P --lengths 16384 --rope-scaling yarn; stamp 16k-yarn
$P --lengths 16384 --rope-scaling none; stamp 16k-none
$P --lengths 16384 --rope-scaling pi; stamp 16k-pi
$P --lengths 16384 --rope-scaling rerope; stamp 16k-rerope   # these two side by side
$P --lengths 16384 --rope-scaling ntk; stamp 16k-ntk
$P --lengths 16384 --rope-scaling dynamic-ntk; stamp 16k-dynamic-ntk
$P --lengths 16384 --rope-scaling llama3; stamp 16k-llama3
$P --lengths 16384 --rope-scaling longrope; stamp 16k-longrope
