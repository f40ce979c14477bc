#!/usr/bin/env bash
# The GPU checks of posbench/docs/gpu.md, in parts, each meant to end within ten minutes on one GPU
# (on an H200, compiled, speed took 144 s for five schemes at one length, both passes: speed takes
# LENGTHS and SCHEMES, standard SCHEMES, to split a part over calls; loan runs a prepared plan).
# Run from the repository root, with posbench importable (installed, or PYTHONPATH set to the root
# on a machine with no package index):
#
#   bash scripts/gpu_session.sh check    OUT   # environment; the CUDA, compile and flex tests,
#                                              # then the whole suite (FULL=0 leaves it out)
#   bash scripts/gpu_session.sh speed    OUT [LENGTHS]   # posbench speed, bfloat16, compiled, 11
#                                                       # schemes (or SCHEMES=a,b), 4096 and 16384
#                                                       # (or LENGTHS); speed.csv into OUT and
#                                                       # results/speed/, gpu.md's table rewritten
#   bash scripts/gpu_session.sh train    OUT   # the quick task compiled and eager, recompiles logged
#   bash scripts/gpu_session.sh standard OUT [SCHEMES]   # the standard task, seed 0 (none,rope)
#   bash scripts/gpu_session.sh probes   OUT [SECONDS]   # the probe-seeds grid on --workers auto,
#                                                       # eager, stopped after SECONDS (default 540);
#                                                       # a later call goes on (--resume) where it stopped
#   bash scripts/gpu_session.sh ensemble OUT   # seeds of the quick task alone (SOLO_SEEDS), then
#                                              # stacked (SEEDS, --ensemble)
#   bash scripts/gpu_session.sh loan     OUT   # one loan: the CUDA tests, ensemble, then speed
#                                              # steps (PLAN), within BUDGET seconds
#
# Each part writes a log and one tar.gz of its results into OUT (a few files: what a remote
# command can hand back) and prints the tables. SMOKE=1 runs every part on CPU at toy sizes: it
# checks the commands, not the GPU (speed then runs eager and leaves results/speed/ alone). Where
# flash-linear-attention cannot be installed (no package index), FLA=FOLDER puts a folder made by
# `pip install --target FOLDER flash-linear-attention==0.6.0 fla-core==0.6.0 einops` on the path.
set -euo pipefail
part="${1:?part: check | speed | train | standard | probes | ensemble | loan}"
out="${2:?output folder}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$out/$part"
mkdir -p "$work"
exec > >(tee "$out/$part.log") 2>&1
export PYTHONUNBUFFERED=1
[ -n "${FLA:-}" ] && export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(cd "$FLA" && pwd)"
pb() { python3 -m posbench "$@"; }
# The steady rate of a run, for the summaries below (piped ahead of their code): tokens/s over the
# steps after the first tenth, from its log.csv, so neither compilation nor the first step counts.
steady_rate='
import csv
def steady(run_dir):
    log = list(csv.DictReader(open(run_dir / "log.csv")))
    k = len(log) // 10
    return (float(log[-1]["tokens"]) - float(log[k]["tokens"])) / max(
        float(log[-1]["seconds"]) - float(log[k]["seconds"]), 1e-9)
'

smoke="${SMOKE:-0}"
if [ "$smoke" = 1 ]; then
    device=cpu dtype=float32 lengths=128,256 repeats=2 compile=auto
else
    device=cuda dtype=bfloat16 lengths=4096,16384 repeats=20 compile=on
fi
speed_schemes="${SCHEMES:-none,rope,alibi,t5,kerple,fire,fox,stickbreaking,path,rope@w,rnope-swa}"

# A task file made from a shipped one with some [section] keys replaced (smoke sizes).
shrink() {  # shrink SRC DST key=value ...
    python3 - "$@" <<'EOF'
import re, sys
src, dst, *pairs = sys.argv[1:]
text = open(src).read()
for pair in pairs:
    key, value = pair.split("=", 1)
    text, n = re.subn(rf"(?m)^{key}\s*=.*$", f"{key} = {value}", text, count=1)
    assert n == 1, key
open(dst, "w").write(text)
EOF
}

pack() { tar -czf "$out/$part.tar.gz" -C "$work" --exclude='*.safetensors' --exclude='*.pt' . ; }

start=$(date +%s)
case "$part" in
check)
    python3 - <<'EOF'
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, f"{p.total_memory / 2**30:.0f} GiB", p.multi_processor_count, "SMs")
from posbench import fla_path
print("flash-linear-attention:", "installed" if fla_path.available() else "not installed (the fla path is off)")
EOF
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    # The tests that skip or shrink without a GPU first, then the whole suite (in 8 processes
    # where pytest-xdist is there), within the part's time. Without `datasets` (a machine where
    # posbench runs from its source folder), the hf: loader's tests are left out.
    keep=()
    python3 -c "import datasets" 2>/dev/null || { keep=(-k "not hf"); echo "no datasets: hf tests left out"; }
    # side by side where pytest-xdist is there, else in one process (the ini's -n needs it)
    few=(-o addopts=-q) spread=(-o addopts=-q)
    python3 -c "import xdist" 2>/dev/null && few=(-n 4) spread=(-n 8)
    python3 -m pytest -q -p no:cacheprovider "${few[@]}" -k "cuda or compile or flex or fla" --junitxml="$work/gpu-tests.xml" || true
    [ "${FULL:-1}" = 0 ] && { echo "FULL=0: the whole suite left out"; pack; exit 0; }
    timeout 420 python3 -m pytest -q -p no:cacheprovider "${spread[@]}" "${keep[@]}" -m "not slurm" \
        --junitxml="$work/all-tests.xml" || true
    ;;
speed)
    # The standard task's settings (batch 1, 8 heads of 64; rope@w's window is train_len / 4),
    # each layer compiled as training compiles it. Compilation takes place once per scheme, length
    # and pass: LENGTHS and SCHEMES split the table over calls (speed.csv merges the rows).
    lengths="${3:-$lengths}"
    keep="$PWD/results/speed/speed.csv"
    [ "$smoke" != 1 ] && [ -f "$keep" ] && cp "$keep" "$work/speed.csv"  # rows of earlier calls
    pb speed --device "$device" --dtype "$dtype" --compile "$compile" --schemes "$speed_schemes" \
        --lengths "$lengths" --repeats "$repeats" --task standard --out "$work" \
        || { rc=$?; [ "$rc" = 1 ] || exit "$rc"; echo "speed: a cell failed (a row of speed.csv); the others are kept"; }
    cp "$work/speed.csv" "$out/speed.csv"
    if [ "$smoke" != 1 ]; then  # a GPU's rows: the results folder and gpu.md's table
        cp "$work/speed.csv" "$keep"
        python3 -m posbench.gpu_table
        cp posbench/docs/gpu.md "$out/gpu.md"
    fi
    ;;
train)
    task=quick
    if [ "$smoke" = 1 ]; then
        shrink tasks/quick.toml "$work/quick-smoke.toml" steps=6 eval_interval=3 checkpoint_interval=3 \
            tokens=2048 batch_tokens=2048 lengths='[64, 128]'
        task="$work/quick-smoke.toml"
    fi
    for mode in on off; do
        TORCH_LOGS=recompiles pb run "$task" --device "$device" --compile "$mode" --no-speed \
            --out "$work/compile-$mode" 2>&1 | tee "$work/compile-$mode.log"
    done
    # Each run compiles its forward once (a fresh cache per run); any line here is a recompile.
    echo "recompilations logged (compile on): $(grep -c 'Recompiling function' "$work/compile-on.log" || true)"
    # tokens_per_second and mfu in runs.csv count the first step, compilation included; the
    # steady rate is read from log.csv over the steps after the first tenth.
    { echo "$steady_rate"; cat <<'EOF'
import sys
from pathlib import Path
work = Path(sys.argv[1])
print("mode scheme compile backend | first step s | tokens/s whole, steady | mfu whole, steady of peak | final train loss")
for mode in ("on", "off"):
    for row in csv.DictReader(open(work / f"compile-{mode}" / "runs.csv")):
        run_dir = work / f"compile-{mode}" / row["run_id"]
        rate, whole = steady(run_dir), float(row["tokens_per_second"])
        first = float(next(csv.DictReader(open(run_dir / "log.csv")))["seconds"])
        mfu = (f"{float(row['mfu']):.3f}, {float(row['mfu']) * rate / whole:.3f} of {row.get('mfu_peak') or '?'}"
               if row.get("mfu") else "-")
        print(mode, row["scheme"], row["compile"], row["backend"], "|", f"{first:.1f}", "|",
              f"{whole:,.0f}, {rate:,.0f}", "|", mfu, "|", row["final_train_loss"])
EOF
    } | python3 - "$work"
    ;;
standard)
    schemes="${3:-none,rope}"
    task=standard
    if [ "$smoke" = 1 ]; then
        shrink tasks/standard.toml "$work/standard-smoke.toml" steps=4 eval_interval=2 \
            checkpoint_interval=2 d_model=64 n_layers=2 batch_size=2 vocab_size=512 tokens=2048 \
            batch_tokens=2048 lengths='[512, 1024]'
        task="$work/standard-smoke.toml"
    fi
    pb run "$task" --device "$device" --seeds 0 --schemes "$schemes" --no-speed --resume --out "$work/standard"
    ;;
probes)
    # Probe runs are small: one CPU thread each drives the GPU, so runs go side by side on worker
    # processes (`posbench run --workers auto`: as many as the GPU's free memory holds at about 8 GB
    # each, the longest expected run first). SEEDS (default the task's, 0-15) chooses the seeds; PROBE_SCHEMES
    # the scheme labels (default all); WORKERS a number instead of auto; ENSEMBLE the --ensemble
    # setting (default off: each run alone, as results/probes/seeds). Without PROBE_SCHEMES the
    # runs results/probes/seeds already holds are merged first and not trained again; with it the
    # runs are trained here whatever trained them elsewhere (a machine-against-machine check).
    # Runs cut short keep their checkpoints in $out/probes/probes (kept between calls on one
    # machine) and a later call continues them (--resume).
    limit="${3:-540}"
    task=probe-seeds workers="${WORKERS:-auto}"
    only=() seeds=()
    [ -n "${SEEDS:-}" ] && seeds=(--seeds "$SEEDS")
    [ -n "${PROBE_SCHEMES:-}" ] && only=(--schemes "$PROBE_SCHEMES")
    if [ "$smoke" = 1 ]; then
        shrink tasks/probe-seeds.toml "$work/probe-seeds-smoke.toml" steps=4 eval_interval=2 \
            checkpoint_interval=2 trials=2
        task="$work/probe-seeds-smoke.toml" workers="${WORKERS:-2}"
    fi
    [ "$smoke" != 1 ] && [ -z "${PROBE_SCHEMES:-}" ] \
        && pb report "$work/probes" --merge results/probes/seeds >/dev/null
    finished() { grep -c ',ok,' "$work/probes/runs.csv" 2>/dev/null || echo 0; }
    before=$(finished)
    TORCHINDUCTOR_COMPILE_THREADS=1 timeout --signal=INT --kill-after=90 "$limit" \
        python3 -m posbench run "$task" --workers "$workers" "${seeds[@]}" --device "$device" \
            --compile off --ensemble "${ENSEMBLE:-off}" "${only[@]}" --no-speed --resume --out "$work/probes" || true
    echo "probe-seeds: $(( $(finished) - before )) runs finished in this call"
    [ -f "$work/probes/runs.csv" ] && pb report "$work/probes"
    ;;
ensemble)
    # The seeds SEEDS (default 0-7) of SCHEME (default rope) on the quick task, STEPS steps (default
    # 200): SOLO_SEEDS of them (default all) trained one after another as solo runs (compiled on
    # CUDA, as by default), then SEEDS as one stacked model (--ensemble, eager); the wall time of
    # each and every run's tokens/s, whole (first step and compilation included) and steady (the
    # steps after the first tenth, from log.csv). The run_ids are the same: each mode writes its
    # own folder.
    seeds="${SEEDS:-0-7}" scheme="${SCHEME:-rope}" steps="${STEPS:-200}" task=quick
    solo="${SOLO_SEEDS:-$seeds}"
    members=$(python3 -c "from posbench.config import parse_seeds; print(len(parse_seeds('$seeds')))")
    if [ "$smoke" = 1 ]; then
        shrink tasks/quick.toml "$work/quick-smoke.toml" d_model=32 n_layers=1 eval_interval=3 \
            checkpoint_interval=3 eval_windows=4
        task="$work/quick-smoke.toml" steps=6
    fi
    for mode in off "$members"; do
        began=$(date +%s.%N)
        which="$seeds"; [ "$mode" = off ] && which="$solo"
        pb train --scheme "$scheme" --task "$task" --seeds "$which" --ensemble "$mode" --steps "$steps" \
            --device "$device" --runs-dir "$work/ensemble-$mode"
        echo "ensemble $mode: wall $(python3 -c "print(f'{$(date +%s.%N) - $began:.1f}')") s"
    done
    { echo "$steady_rate"; cat <<'EOF'
import sys
from pathlib import Path
work, members = Path(sys.argv[1]), sys.argv[2]
# Training seconds: the solo runs' add up; an ensemble's members share theirs (each counts every step).
print("mode | runs | ensemble | compile | tokens/s per run (mean) | tokens/s of all runs, whole | "
      "steady | final train loss (mean)")
steady_of = {}
for mode in ("off", members):
    rows = list(csv.DictReader(open(work / f"ensemble-{mode}" / "runs.csv")))
    rate = sum(float(r["tokens_per_second"]) for r in rows) / len(rows)
    seconds = [float(r["train_seconds"]) for r in rows]
    whole = sum(float(r["tokens"]) for r in rows) / (sum(seconds) if mode == "off" else max(seconds))
    rates = [steady(work / f"ensemble-{mode}" / r["run_id"]) for r in rows]
    # Solo runs go one after another: their rates are each one process's. Stacked members share
    # their steps: all of them together move members times one member's rate. An ensemble that
    # fell back (its rows' ensemble column empty) trained its members one after another too.
    stacked = mode != "off" and all(r["ensemble"] == members for r in rows)
    if mode != "off" and not stacked:
        print(f"ensemble {members}: fell back, its members trained one after another (see the note above)")
    steady_of[mode] = sum(rates) / len(rates) * (len(rows) if stacked else 1)
    loss = sum(float(r["final_train_loss"]) for r in rows) / len(rows)
    print(mode, "|", len(rows), "|", {r["ensemble"] for r in rows}, "|", {r["compile"] for r in rows}, "|",
          f"{rate:,.0f}", "|", f"{whole:,.0f}", "|", f"{steady_of[mode]:,.0f}", "|", f"{loss:.4f}")
print(f"stacked / one solo process, steady tokens/s: {steady_of[members] / steady_of['off']:.2f}x")
EOF
    } | python3 - "$work" "$members"
    ;;
loan)
    # One device loan's worth in one call, each step under its own time limit so that a slow step
    # costs only itself: the CUDA tests alone (-k cuda), the ensemble part (SEEDS=0-9, two solo
    # runs), the probes part for PROBE_SECONDS (default 240: fox's seeds PROBE_SEEDS, default 3-15,
    # trained here against their rows from a CPU in results/probes/seeds), then the
    # speed steps of PLAN ("SCHEMES:LENGTH ...", default the rows results/speed still lacks),
    # within BUDGET seconds (default 540) in all. A step starts only with at least 60 s left.
    # OUT receives six files (a remote call hands back eight at most): loan.log with the end of
    # every step's output, tests.xml, ensemble.tar.gz, the probe runs' runs.csv and probes.csv,
    # and speed.csv with every row measured so far.
    budget="${BUDGET:-540}" probe_seconds="${PROBE_SECONDS:-240}"
    plan="${PLAN:-none,kerple,fire,fox,path,rope@w,rnope-swa:4096 none,rope,alibi,t5,stickbreaking:16384}"
    scratch="${TMPDIR:-/tmp}/posbench-loan-$$"  # outside OUT: only the files below travel back
    mkdir -p "$scratch"
    step() {  # step NAME CAP COMMAND...: run under min(CAP, what is left) seconds
        local name=$1 cap=$2 left
        shift 2
        left=$(( budget - ($(date +%s) - start) ))
        (( left < 60 )) && { echo "step $name: not started, $left s left"; return; }
        (( cap > left )) && cap=$left
        echo "step $name: up to $cap s"
        timeout -k 5 "$cap" "$@" > "$scratch/$name.log" 2>&1 || echo "step $name: exit $? (timeout: 124)"
        tail -25 "$scratch/$name.log"
    }
    # in one process, pytest-xdist or not
    step tests 90 python3 -m pytest -o addopts=-q -p no:cacheprovider -k cuda --junitxml="$out/tests.xml"
    SEEDS=0-9 SOLO_SEEDS=0-1 step ensemble 120 bash "$0" ensemble "$scratch/e"
    [ -f "$scratch/e/ensemble.tar.gz" ] && cp "$scratch/e/ensemble.tar.gz" "$out/"
    if (( probe_seconds > 0 )); then
        SEEDS="${PROBE_SEEDS:-3-15}" PROBE_SCHEMES="${PROBE_SCHEMES-fox}" \
            step probes $(( probe_seconds + 100 )) \
            bash "$0" probes "$scratch/p" "$probe_seconds"
        for table in runs probes; do
            [ -f "$scratch/p/probes/probes/$table.csv" ] && cp "$scratch/p/probes/probes/$table.csv" "$out/"
        done
    fi
    n=0
    for item in $plan; do
        n=$((n + 1))
        SCHEMES="${item%%:*}" step "speed$n" 240 bash "$0" speed "$scratch/s$n" "${item##*:}"
    done
    [ -f results/speed/speed.csv ] && cp results/speed/speed.csv "$out/"
    echo "loan: $(( $(date +%s) - start )) s of $budget"
    exit 0
    ;;
*)
    echo "unknown part: $part (check | speed | train | standard | probes | ensemble | loan)" >&2
    exit 2
    ;;
esac
pack
echo "part $part: $(( $(date +%s) - start )) s; results in $out/$part.tar.gz"
