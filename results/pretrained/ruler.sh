#!/usr/bin/env bash
# The RULER part of the reading (results/pretrained/README.md): RULER's niah single (noise and
# essay haystacks), multikey with distractors, multivalue, multiquery, vt, cwe and fwe at 8k (the
# model's context) and 16k, under none, yarn, self-extend and longrope, 10 prompts a cell, the model
# in bfloat16 as RULER runs models (on a Xeon with AMX, a 16k prompt takes a minute on one thread).
# Two shards side by side, one thread each:
#     bash results/pretrained/ruler.sh 1 & bash results/pretrained/ruler.sh 2; wait
# A policy's rows are written as each length finishes and each prompt's verdicts as it is judged
# (prompts.csv), and --resume keeps the cells and prompts that the output folder
# (results/pretrained, or the one named after the shard) holds already, so a stopped shard, started
# again, goes on from the prompt where it stopped. A third argument reads only those policies
# (e.g. none,yarn,longrope first: a Self-Extend prompt takes three to four times as long).
#     bash results/pretrained/ruler.sh 1|2 [OUT] [POLICIES]
set -euo pipefail
export OMP_NUM_THREADS=1  # one thread per command: on cores shared with other jobs, two threads wait on each other
case "${1:-}" in
  1) tasks="niah_single_1 niah_multikey_1 niah_multiquery cwe" ;;
  2) tasks="niah_single_2 niah_multivalue vt fwe" ;;
  *) echo "usage: bash results/pretrained/ruler.sh 1|2 [OUT] [POLICIES] (the shard; OUT: results/pretrained)" >&2; exit 2 ;;
esac
out="${2:-results/pretrained}"
policies="${3:-none,yarn,self-extend,longrope}"
mkdir -p "$out"
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }
stamp "start shard $1 into $out: $policies"
for task in $tasks; do
  posbench probe --task pretrained --probe "ruler:$task" --lengths 8192,16384 --trials 10 \
    --rope-scaling "$policies" --dtype bfloat16 --resume --out "$out"
  stamp "$task"
done
