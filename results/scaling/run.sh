#!/usr/bin/env bash
# How results/scaling was made, from the repository root (posbench installed). The learning-rate
# sweep first (rope, seed 0, 500 steps, one thread each), then the grid of tasks/scaling.toml in the
# background on both cores, its rows merged into results/scaling as they arrive:
#   bash results/scaling/run.sh sweep            # the sweep's runs under runs/scaling-lr
#   bash results/scaling/run.sh grid             # the grid under runs/scaling (resumes)
#   bash results/scaling/run.sh merge            # its finished rows into results/scaling
set -euo pipefail
export OMP_NUM_THREADS=1
case "${1:-}" in
sweep)
    for lr in 2e-3 4e-3 8e-3 1.6e-2 3.2e-2 6.4e-2 1e-3; do
        posbench train --scheme rope --task quick --seed 0 --d-model 64 --layers 2 --heads 2 --lr $lr \
            --runs-dir runs/scaling-lr --resume
    done
    for lr in 2e-3 4e-3 8e-3 1.6e-2; do  # 2e-3: the quick task's own rope run
        posbench train --scheme rope --task quick --seed 0 --lr $lr --runs-dir runs/scaling-lr --resume
    done
    for lr in 1e-3 2e-3 4e-3 8e-3; do
        posbench train --scheme rope --task quick --seed 0 --d-model 256 --layers 8 --heads 8 --lr $lr \
            --runs-dir runs/scaling-lr --resume
    done ;;
grid)
    nice -n 10 posbench run scaling --workers 2 --no-speed --out runs/scaling --resume ;;
merge)
    posbench report results/scaling --merge runs/scaling
    posbench table scaling results/scaling --figure results/scaling/scaling.png ;;
*)
    echo "usage: bash results/scaling/run.sh sweep|grid|merge" >&2; exit 2 ;;
esac
