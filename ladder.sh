#!/usr/bin/env bash
# ladder.sh — run the paper's ladders: one arm, a range of depths, each at its own recipe (recipes live in arms.py).
#
#   bash ladder.sh demo                                   # offline CPU demo: stdlib corpus, 3 arms, fit, figure
#   bash ladder.sh vanilla                                # paper ladder on one 8-GPU node (NPROC_PER_NODE=8)
#   bash ladder.sh all --dry-run                          # the 58 paper runs, total FLOPs, GPU-hours
#   bash ladder.sh untied_grow --preset d26               # d26 on two nodes (run once per node with NODE_RANK)
#   bash ladder.sh operator_1 --preset data-constrained   # the loop x depth x weight-decay grid
#   bash ladder.sh loop_2 --depths "6 8" -- --compile     # arguments after -- go to train.py
#   bash ladder.sh gpu-check                              # one-GPU acceptance run: python bench.py --gpu-check
#   bash ladder.sh vanilla --seeds "0 1 2" --replicate-depths "16 18"   # seed replicates ARCH_dD_sS at d16, d18
#
# Environment: NPROC_PER_NODE (8 for GPU presets, 1 for cpu), NNODES (1; d26: 2), NODE_RANK, MASTER_ADDR,
# MASTER_PORT, DATA_DIR, RUNS_DIR (runs), MFU (0.4, for the dry-run GPU-hour estimate).
# SLURM: inside an allocation of several nodes (sbatch), `bash ladder.sh ...` starts itself once per node with srun;
# each copy takes NNODES, NODE_RANK and MASTER_ADDR (the first host) from SLURM_NNODES, SLURM_NODEID and
# `scontrol show hostnames $SLURM_JOB_NODELIST`. See README "Multi-node with SLURM".
# Idempotent: a run whose result.json says "complete" is skipped, any other started run is resumed (--resume-or-start);
# the first failing run stops the ladder and names its log.
# Seed replicates: --seeds "S1 S2 ..." names every run ARCH_dD_sS and passes --seed S to train.py; with
# --replicate-depths only those depths get every seed, the others get S1 only. fit.py ladders pools the replicates.
set -euo pipefail
cd "$(dirname "$0")"

die() { echo "ladder.sh: error: $*" >&2; exit 2; }

ALL_ARCHS="vanilla deep_vanilla operator_1 loop_2 untied_2 loop_grow untied_grow deep_vanilla_grow"
paper_depths() {  # the release's depths per arm
    case "$1" in
        vanilla|operator_1) echo "6 8 10 12 14 16 18 20" ;;
        *) echo "6 8 10 12 14 16 18" ;;
    esac
}
DEMO_ARCHS="vanilla operator_1 untied_grow"
CPU_DEPTHS="1 2 3 4"
# Data-constrained loop grid (paper Sec. 5, App. D): loop counts per depth; every cell in the fixed-WD and tuned-WD variant.
dc_loops() {
    case "$1" in
        6) echo "1 2 3 4 6" ;; 8|10|12) echo "1 2 3 4 6 8 12" ;; 14) echo "1 2 3 4 6 8" ;; 16) echo "1 2 3" ;; 18) echo "1" ;;
    esac
}

usage="usage: bash ladder.sh ARCH|all|demo|gpu-check [--preset paper|cpu|d26|data-constrained] [--depths \"6 8\"] [--seeds \"0 1 2\" [--replicate-depths \"16 18\"]] [--dry-run] [-- train.py args]"
target="${1:-}"
case "$target" in
    -h|--help) echo "$usage"; echo "ARCH: one of $ALL_ARCHS"; exit 0 ;;
    "") die "$usage" ;;
    -*) die "the first argument is ARCH, all or demo, got option '$target' ($usage)" ;;
esac
shift
if [ "$target" = gpu-check ]; then  # the one-GPU acceptance run; arguments go to bench.py
    exec python bench.py --gpu-check "$@"
fi
original_args=("$@")
preset=paper depths="" seeds="" replicate_depths="" dry_run=0 extra=() data_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --preset) [ $# -ge 2 ] || die "--preset needs a value"; preset="$2"; shift 2 ;;
        --depths) [ $# -ge 2 ] || die "--depths needs a value, e.g. --depths \"6 8 10\""; depths="$2"; shift 2 ;;
        --seeds) [ $# -ge 2 ] || die "--seeds needs a value, e.g. --seeds \"0 1 2\""; seeds="$2"; shift 2 ;;
        --replicate-depths) [ $# -ge 2 ] || die "--replicate-depths needs a value, e.g. --replicate-depths \"16 18\""
                            replicate_depths="$2"; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        --) shift; extra=("$@"); break ;;
        *) die "unknown option '$1' (options: --preset, --depths, --seeds, --replicate-depths, --dry-run, -- train.py args)" ;;
    esac
done
case "$preset" in paper|cpu|d26|data-constrained) ;; *) die "unknown preset '$preset' (paper, cpu, d26, data-constrained)" ;; esac
for d in $depths; do [[ "$d" =~ ^[0-9]+$ ]] || die "--depths must be whole numbers, got '$d'"; done
for s in $seeds; do [[ "$s" =~ ^[0-9]+$ ]] || die "--seeds must be whole numbers, got '$s'"; done
for d in $replicate_depths; do [[ "$d" =~ ^[0-9]+$ ]] || die "--replicate-depths must be whole numbers, got '$d'"; done
[ -z "$replicate_depths" ] || [ -n "$seeds" ] || die "--replicate-depths needs --seeds, e.g. --seeds \"0 1 2\""

if [ "$target" = demo ]; then
    export RUNS_DIR="${RUNS_DIR:-runs/demo}" DATA_DIR="${DATA_DIR:-data/stdlib}"
    python data.py prepare --corpus stdlib --tokenizer bytes --out "$DATA_DIR" --if-missing
    for arch in $DEMO_ARCHS; do
        bash "$0" "$arch" --preset cpu ${depths:+--depths "$depths"} ${seeds:+--seeds "$seeds"} \
            ${replicate_depths:+--replicate-depths "$replicate_depths"} ${extra[@]+-- "${extra[@]}"}
    done
    python fit.py ladders "$RUNS_DIR" --anchor-depth 2 --out "$RUNS_DIR/fit"
    echo "figure: $RUNS_DIR/fit/fig3_ladders.png (and .pdf, fig2_left.*)"
    exit 0
fi
if [ "$target" = all ]; then archs="$ALL_ARCHS"
elif [[ " $ALL_ARCHS " == *" $target "* ]]; then archs="$target"
else die "unknown arch '$target' (one of: $ALL_ARCHS, all, demo)"; fi

runs_dir="${RUNS_DIR:-runs}"
# A SLURM allocation of several nodes: one copy of this script per node (srun), each told its rank by SLURM.
if [ -n "${SLURM_JOB_NODELIST:-}" ] && [ "${SLURM_NNODES:-1}" -gt 1 ]; then
    if [ -z "${SLURM_STEP_ID:-}" ] && [ "$dry_run" = 0 ]; then
        exec srun --nodes "$SLURM_NNODES" --ntasks-per-node 1 bash "$0" "$target" "${original_args[@]}"
    fi
    command -v scontrol >/dev/null || die "SLURM allocation found but scontrol is not on PATH"
    export NNODES="$SLURM_NNODES" NODE_RANK="${SLURM_NODEID:-0}"
    hosts="$(scontrol show hostnames "$SLURM_JOB_NODELIST")" || die "scontrol could not list the nodes of $SLURM_JOB_NODELIST"
    export MASTER_ADDR="${hosts%%$'\n'*}"
fi
nnodes="${NNODES:-1}"
case "$preset" in
    cpu) nproc="${NPROC_PER_NODE:-1}" ;;
    d26) nproc="${NPROC_PER_NODE:-8}"; nnodes="${NNODES:-2}" ;;
    *) nproc="${NPROC_PER_NODE:-8}" ;;
esac
[[ "$nproc" =~ ^[1-9][0-9]*$ && "$nnodes" =~ ^[1-9][0-9]*$ ]] || die "NPROC_PER_NODE and NNODES must be positive integers, got '$nproc' and '$nnodes'"
command -v torchrun >/dev/null || [ "$dry_run" = 1 ] || die "torchrun not found: pip install -r requirements.txt"
launch=(torchrun --nproc_per_node "$nproc" --nnodes "$nnodes")
if [ "$nnodes" -gt 1 ]; then
    launch+=(--node_rank "${NODE_RANK:-0}" --master_addr "${MASTER_ADDR:-127.0.0.1}" --master_port "${MASTER_PORT:-29500}")
else
    launch+=(--standalone)
fi

# Each run is one line: run name, then train.py arguments.
runs=()
for arch in $archs; do
    case "$preset" in
        paper) for d in ${depths:-$(paper_depths "$arch")}; do runs+=("${arch}_d$d --arch $arch --depth $d"); done ;;
        cpu) for d in ${depths:-$CPU_DEPTHS}; do runs+=("${arch}_d$d --arch $arch --depth $d --preset cpu"); done ;;
        d26) [ "$arch" = untied_grow ] || die "the d26 preset is Untied-Grow only: bash ladder.sh untied_grow --preset d26"
             runs+=("untied_grow_d26 --arch untied_grow --depth 26")
             data_args=(--data-dir "${DATA_DIR:-data/fineweb_edu}") ;;  # kept whole: a path may hold spaces
        data-constrained)
            [ "$arch" = operator_1 ] || die "the data-constrained grid uses Operator-1's recipe: bash ladder.sh operator_1 --preset data-constrained"
            for wd in fixed-wd tuned-wd; do for d in ${depths:-6 8 10 12 14 16 18}; do for k in $(dc_loops "$d"); do
                runs+=("dc_${wd}_d${d}_k$k --arch operator_1 --depth $d --passes $k --data-constrained $wd")
            done; done; done ;;
    esac
done
if [ -n "$seeds" ]; then  # one run per seed: NAME_sS with --seed S (only the first seed off --replicate-depths)
    read -r first_seed _ <<<"$seeds"
    seeded=()
    for r in "${runs[@]}"; do
        read -r name args <<<"$r"
        depth=$(sed -E 's/.*--depth ([0-9]+).*/\1/' <<<"$args")
        run_seeds="$first_seed"
        if [ -z "$replicate_depths" ] || [[ " $replicate_depths " == *" $depth "* ]]; then run_seeds="$seeds"; fi
        for s in $run_seeds; do seeded+=("${name}_s$s $args --seed $s"); done
    done
    runs=("${seeded[@]}")
fi

if [ "$dry_run" = 1 ]; then
    for r in "${runs[@]}"; do
        read -r name args <<<"$r"
        # shellcheck disable=SC2086
        echo "${launch[*]} train.py $args$(printf ' %q' ${data_args[@]+"${data_args[@]}"} --run-name "$name" --runs-dir "$runs_dir" ${extra[@]+"${extra[@]}"})"
    done
    # One Python process plans every run (train.py's own derivation and micro-batch planner), prints each run's
    # per-rank memory, then sums FLOPs and GPU-hours.
    printf '%s\n' "${runs[@]}" | python -c '
import sys, plan as memory, train
mfu, nproc, nnodes, extra = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
flops, n, peaks = 0, 0, []
for line in sys.stdin:
    name, *args = line.split()
    try:
        args = train.parse_args(args + extra)
        plan = train.make_plan(args)
        gpu = args.gpu_memory or memory.H100_80GB_GIB
        mem = memory.plan_micro_batches(plan, int(nproc) * int(nnodes), gpu, args.device_batch_size)
    except train.UsageError as e:
        print(f"ladder.sh: error: {name}: {e}", file=sys.stderr); sys.exit(2)
    flops += plan.total_flops
    n += 1
    peak = [s.bytes["peak"] / memory.GIB for s in mem.stages]
    peaks.append((max(peak), name))
    print(f"memory {name}: micro-batch " + " -> ".join(str(s.micro_batch) for s in mem.stages) + " | peak "
          + " -> ".join(f"{p:.1f}" for p in peak) + f" GiB per rank, fits {gpu:.1f} GiB"
          + (" | gradients sharded, reduced every micro-batch (owner-sharded transport)" if mem.zero2 else ""))
hours = flops / (train.GPU_PEAK_FLOPS["H100"] * mfu) / 3600
print(f"{n} runs | {flops:.3e} FLOPs | ~{hours:,.0f} GPU-hours at {mfu:.0%} MFU of an H100 | {nproc} GPUs/node x {nnodes} nodes"
      f" | max peak {max(peaks)[0]:.1f} GiB per rank ({max(peaks)[1]})")
' "${MFU:-0.4}" "$nproc" "$nnodes" "${extra[@]}"
    exit 0
fi

for r in "${runs[@]}"; do
    read -r name args <<<"$r"
    run_dir="$runs_dir/$name"
    # train.py holds this lock while it trains the run: another ladder (or an orphaned worker) is on it
    if [ -f "$run_dir/train.lock" ] && command -v flock >/dev/null && ! flock -n "$run_dir/train.lock" true; then
        die "run $name is being trained by another process ($(head -n 1 "$run_dir/train.lock")); wait for it or stop it first"
    fi
    resume=()
    if [ -f "$run_dir/result.json" ]; then
        status=$(python -c 'import json, sys; print(json.load(open(sys.argv[1])).get("status"))' "$run_dir/result.json" \
                 2>/dev/null || echo unreadable)
        if [ "$status" = complete ]; then echo "skip $name (complete)"; continue; fi
        resume=(--resume-or-start)
    fi
    mkdir -p "$run_dir"
    log="$run_dir/train.log"
    echo "run  $name -> $log"
    # torchrun runs in the background so that a SIGTERM/SIGINT to this script reaches it (and through it the
    # workers, which torchrun starts in their own session); a worker that survives anyway holds the run's lock.
    # shellcheck disable=SC2086
    "${launch[@]}" train.py $args ${data_args[@]+"${data_args[@]}"} --run-name "$name" --runs-dir "$runs_dir" \
        ${resume[@]+"${resume[@]}"} ${extra[@]+"${extra[@]}"} >>"$log" 2>&1 &
    child=$!
    trap 'kill -TERM "$child" 2>/dev/null; wait "$child"; exit 143' TERM
    trap 'kill -INT "$child" 2>/dev/null; wait "$child"; exit 130' INT
    status=0
    wait "$child" || status=$?
    trap - TERM INT
    if [ "$status" != 0 ]; then
        echo "ladder.sh: run $name failed; see $log" >&2
        tail -n 5 "$log" >&2
        exit 1
    fi
    grep -E "^done:" "$log" | tail -n 1 || true
done
