#!/usr/bin/env bash
# ladder.sh — run the paper's ladders: one arm, a range of depths, each at its own recipe. The runs (arms, depths,
# grids, names: `python train.py --ladder`) and recipes come from arms.py; this script launches them.
#
#   bash ladder.sh demo                                   # offline CPU demo: stdlib corpus, 3 arms, fit, figure
#   bash ladder.sh vanilla                                # paper ladder on one 8-GPU node (NPROC_PER_NODE=8)
#   bash ladder.sh all --dry-run                          # the 58 paper runs, total FLOPs, GPU-hours
#   bash ladder.sh user --preset cpu                      # every arm of USER_ARMS in arms.py (docs/your_own_arm.md)
#   bash ladder.sh untied_grow --preset d26               # d26 on two nodes (run once per node with NODE_RANK)
#   bash ladder.sh operator_1 --preset data-constrained   # the loop x depth x weight-decay grid
#   bash ladder.sh loop_2 --depth 6 8 -- --compile        # arguments after -- go to train.py
#   bash ladder.sh vanilla --seed 0 1 2 --replicate-depths 16 18   # seed replicates ARCH_dD_sS at d16, d18
#
# Options take train.py's names: --depth and --seed (one or many), --runs-dir. Environment: NPROC_PER_NODE (8 for GPU
# presets, 1 for cpu), NNODES (1; d26: 2), NODE_RANK, MASTER_ADDR (needed when NNODES > 1), MASTER_PORT, DATA_DIR,
# RUNS_DIR (runs), MFU (unset: the dry run's GPU-hours are at the MFU the release measured at each run's width; set:
# at that MFU); a relative DATA_DIR or RUNS_DIR is taken from the directory ladder.sh is run in, the defaults lie under
# the repository.
# SLURM: inside an allocation of several nodes (sbatch), `bash ladder.sh ...` starts itself once per node with srun;
# each copy takes NNODES, NODE_RANK and MASTER_ADDR (the first host) from SLURM_NNODES, SLURM_NODEID and
# `scontrol show hostnames $SLURM_JOB_NODELIST`. See README "Multi-node with SLURM".
# Idempotent: a run whose result.json says "complete" is skipped, any other started run is resumed (--resume-or-start);
# the first failing run stops the ladder and names its log.
# Seed replicates: --seed S1 S2 ... names every run ARCH_dD_sS and passes --seed S to train.py; with
# --replicate-depths only those depths get every seed, the others get S1 only. fit.py ladders pools the replicates.
set -euo pipefail
caller="$PWD"
cd "$(dirname "$0")"
script="$PWD/$(basename "$0")"
# RUNS_DIR, DATA_DIR and a --data-dir after -- are the user's: a relative one names a folder under the directory
# ladder.sh was started from. Run from the repository they stay as given (DATA_DIR=data/stdlib is still train.py's
# default, which it prepares); the defaults (runs/, data/...) are under the repository, where train.py runs.
from_caller() {
    if [[ "$1" == /* || -z "$1" ]] || [ "$caller" -ef . ]; then printf '%s\n' "$1"; else printf '%s\n' "$caller/$1"; fi
}
[ -z "${RUNS_DIR:-}" ] || RUNS_DIR=$(from_caller "$RUNS_DIR")
[ -z "${DATA_DIR:-}" ] || DATA_DIR=$(from_caller "$DATA_DIR")

die() { echo "ladder.sh: error: $*" >&2; exit 2; }
# Ctrl-C or SIGTERM: stop the run in flight (train.py saves a checkpoint and records "stopped"), then one
# line and exit 128 + n. Python runs as a background job (py), so a Ctrl-C reaches this script alone.
child="" current=""
stopped() {
    trap '' INT TERM
    if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null || true; fi
    echo "ladder.sh: stopped by SIG$1${current:+ during run $current (log: $run_dir/train.log)}; run the same" \
        "command again to continue" >&2
    exit "$2"
}
trap 'stopped INT 130' INT
trap 'stopped TERM 143' TERM
py() {  # python "$@" as a background job, which ignores the terminal's Ctrl-C (no KeyboardInterrupt traceback while
    # it imports): the signal reaches this script alone, and stopped() ends the job with a SIGTERM
    local status=0
    python "$@" <&0 &  # explicitly the script's stdin: a background job's is /dev/null (--ladder-dry-run reads it)
    child=$!
    wait "$child" || status=$?
    child=""
    return "$status"
}
# train.py --ladder-dry-run's flags that ladder.sh fills from the environment: an error about one names the variable
declare -A env_of_flag=([--gpus-per-node]=NPROC_PER_NODE [--nodes]=NNODES [--mfu]=MFU)
python_or_die() {  # python "$@"; its one-line error becomes ladder.sh's own
    local err status=0
    err=$(mktemp)
    py "$@" 2>"$err" || status=$?
    if [ "$status" = 141 ]; then  # the reader of our output went away (`| head`): stop quietly, as python did
        rm -f "$err"
        exit 141
    fi
    if [ "$status" != 0 ]; then
        local message
        message=$(sed -E '1s/^[a-z_.]+( --[a-z-]+)?: error: //' "$err")
        rm -f "$err"
        for flag in "${!env_of_flag[@]}"; do
            message="${message/#"argument $flag: "/"environment variable ${env_of_flag[$flag]} "}"
        done
        die "$message"
    fi
    cat "$err" >&2
    rm -f "$err"
}
whole_number() {  # NAME VALUE LOW HIGH: the environment variable NAME holds VALUE, a whole number in [LOW, HIGH]
    [[ "$2" =~ ^(0|[1-9][0-9]{0,8})$ ]] && (( $2 >= $3 && $2 <= $4 )) ||
        die "environment variable $1 must be a whole number in [$3, $4], got '$2'"
}

usage="usage: bash ladder.sh ARCH|all|user|demo [--preset paper|cpu|d26|data-constrained] [--depth 6 8 ...] [--seed 0 1 2 ... [--replicate-depths 16 18 ...]] [--runs-dir DIR (or RUNS_DIR; default runs, demo: runs/demo)] [--dry-run] [-- train.py args]"
target="${1:-}"
case "$target" in
    -h|--help) echo "$usage"; echo "ARCH: one of $(python arms.py arms)"; exit 0 ;;
    "") die "$usage" ;;
    -*) die "the first argument is ARCH, all, user or demo, got option '$target' ($usage)" ;;
esac
shift
original_args=("$@")
preset="" dry_run=0 lists=() extra=() data_args=()
while [ $# -gt 0 ]; do
    case "$1" in  # --depth, --seed, --replicate-depths: one or many values, as train.py's nargs="+" takes them
        --preset) [ $# -ge 2 ] || die "--preset needs a value"; preset="$2"; shift 2 ;;
        --depth|--seed|--replicate-depths)
            lists+=("$1"); flag=$1; shift
            while [ $# -gt 0 ] && [[ "$1" != -* ]]; do lists+=("$1"); shift; done
            [ "${lists[-1]}" != "$flag" ] || die "$flag needs one or more values, e.g. $flag 6 8 10" ;;
        --runs-dir) [ $# -ge 2 ] || die "--runs-dir needs a folder"; RUNS_DIR=$(from_caller "$2"); shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        --) shift; extra=("$@"); break ;;
        *) die "unknown option '$1' (options: --preset, --depth, --seed, --replicate-depths, --runs-dir, --dry-run, -- train.py args)" ;;
    esac
done
[ "$target" != demo ] || preset="${preset:-cpu}"  # the demo is the cpu preset's ladders (arms.py refuses others)
preset="${preset:-paper}"
# The runs, one "NAME ARGS..." line each (train.py --ladder also checks the options and the arch)
listing=$(python_or_die train.py --ladder "$target" --preset "$preset" ${lists[@]+"${lists[@]}"}) || exit $?
mapfile -t runs <<<"$listing"
[ "$preset" != d26 ] || data_args=(--data-dir "${DATA_DIR:-data/fineweb_edu}")  # kept whole: a path may hold spaces
runs_dir="${RUNS_DIR:-runs}"
[ "$target" != demo ] || runs_dir="${RUNS_DIR:-runs/demo}"
resume_flag=--resume-or-start
# NAME ARGS...: train.py's arguments for run NAME (ARGS: its line from arms.py), less the resume flag and the -- ones
train_args() {
    local name=$1
    shift
    train_args=("$@" ${data_args[@]+"${data_args[@]}"} --run-name "$name" --runs-dir "$runs_dir")
}
instead() {  # FLAG: how to set with the ladder what train.py's FLAG sets
    case "$1" in
        --arch) echo "name the arch as the first argument (bash ladder.sh ARCH)" ;;
        --depth|--seed) echo "use ladder.sh's own $1, before --" ;;
        --preset) echo "use ladder.sh's own --preset, before --" ;;
        --passes|--data-constrained) echo "use --depth to pick cells of the data-constrained grid" ;;
        --data-dir) echo "use DATA_DIR" ;;
        --runs-dir) echo "use RUNS_DIR or ladder.sh's own --runs-dir, before --" ;;
        --run-name) echo "use RUNS_DIR to keep ladders apart (runs are named ARCH_dDEPTH, _sSEED with --seed)" ;;
        "$resume_flag") echo "re-run the same command: the ladder resumes started runs itself" ;;
        *) echo "see bash ladder.sh -h" ;;
    esac
}
# Arguments after -- come last, so one naming a flag the ladder gives a run (or abbreviating it, as argparse
# allows: --dep, --resume) would train another run under this run's name, or outside RUNS_DIR.
ladder_flags=("$resume_flag")
for r in "${runs[@]}"; do
    read -r name args <<<"$r"
    # shellcheck disable=SC2086
    train_args "$name" $args
    for word in "${train_args[@]}"; do [[ "$word" != --* ]] || ladder_flags+=("$word"); done
done
for i in ${extra[@]+"${!extra[@]}"}; do
    word="${extra[i]}" flag="${extra[i]%%=*}"
    [[ "$flag" == --?* ]] || continue
    for own in "${ladder_flags[@]}"; do
        [[ "$own" != "$flag"* ]] || die "'$word' after --$([ "$flag" = "$own" ] || echo " clashes with $own"):" \
            "ladder.sh sets $own itself; $(instead "$own")"
    done
    if [[ --data-dir == "$flag"* ]]; then  # the user's folder, as DATA_DIR (or an abbreviation, as argparse takes)
        if [[ "$word" == *=* ]]; then extra[i]="$flag=$(from_caller "${word#*=}")"
        elif [ $((i + 1)) -lt ${#extra[@]} ]; then extra[i + 1]=$(from_caller "${extra[i + 1]}"); fi
    fi
done

# A SLURM allocation of several nodes: one copy of this script per node (srun), each told its rank by SLURM.
if [ -n "${SLURM_JOB_NODELIST:-}" ]; then
    whole_number SLURM_NNODES "${SLURM_NNODES:-1}" 1 65536
fi
if [ -n "${SLURM_JOB_NODELIST:-}" ] && [ "${SLURM_NNODES:-1}" -gt 1 ]; then
    if [ -z "${SLURM_STEP_ID:-}" ] && [ "$dry_run" = 0 ]; then
        cd "$caller"  # each copy resolves the user's relative paths as this one did
        exec srun --nodes "$SLURM_NNODES" --ntasks-per-node 1 bash "$script" "$target" "${original_args[@]}"
    fi
    whole_number SLURM_NODEID "${SLURM_NODEID:-0}" 0 $((SLURM_NNODES - 1))
    command -v scontrol >/dev/null || die "SLURM allocation found but scontrol is not on PATH"
    hosts="$(scontrol show hostnames "$SLURM_JOB_NODELIST")" || die "scontrol could not list the nodes of $SLURM_JOB_NODELIST"
    host_count=$(grep -c . <<<"$hosts" || true)
    [ "$host_count" = "$SLURM_NNODES" ] || die "scontrol show hostnames $SLURM_JOB_NODELIST listed $host_count" \
        "hosts but SLURM_NNODES is $SLURM_NNODES; every node takes the first host as MASTER_ADDR: check the allocation"
    export NNODES="$SLURM_NNODES" NODE_RANK="${SLURM_NODEID:-0}" MASTER_ADDR="${hosts%%$'\n'*}"
fi
# Processes and nodes: the ranges train.py declares for NPROC_PER_NODE and NNODES (common.py)
nnodes="${NNODES:-1}"
case "$preset" in
    cpu) nproc="${NPROC_PER_NODE:-1}" ;;
    d26) nproc="${NPROC_PER_NODE:-8}"; nnodes="${NNODES:-2}" ;;
    *) nproc="${NPROC_PER_NODE:-8}" ;;
esac
whole_number NPROC_PER_NODE "$nproc" 1 1024
whole_number NNODES "$nnodes" 1 65536
command -v torchrun >/dev/null || [ "$dry_run" = 1 ] || die "torchrun not found: pip install -r requirements.txt"
launch=(torchrun --nproc_per_node "$nproc" --nnodes "$nnodes")
if [ "$nnodes" -gt 1 ]; then
    node_rank="${NODE_RANK:-0}" master_port="${MASTER_PORT:-29500}"
    whole_number NODE_RANK "$node_rank" 0 $((nnodes - 1))
    whole_number MASTER_PORT "$master_port" 1 65535
    [ -n "${MASTER_ADDR:-}" ] || [ "$dry_run" = 1 ] ||
        die "NNODES=$nnodes needs MASTER_ADDR, the address of node 0 that every node can reach"
    launch+=(--node_rank "$node_rank" --master_addr "${MASTER_ADDR:-127.0.0.1}" --master_port "$master_port")
else
    launch+=(--standalone)
fi

if [ "$target" = demo ] && [ "$dry_run" = 0 ]; then
    export DATA_DIR="${DATA_DIR:-data/stdlib}"
    py data.py prepare --corpus stdlib --tokenizer bytes --out "$DATA_DIR"
fi

if [ "$dry_run" = 1 ]; then
    for r in "${runs[@]}"; do
        read -r name args <<<"$r"
        # shellcheck disable=SC2086
        train_args "$name" $args
        echo "${launch[*]} train.py$(printf ' %q' "${train_args[@]}" ${extra[@]+"${extra[@]}"})"
    done
    # train.py's derivation for every run: its micro-batch, FLOPs and GPU-hours, then the ladder's
    python_or_die train.py --ladder-dry-run --gpus-per-node "$nproc" --nodes "$nnodes" ${MFU:+--mfu "$MFU"} \
        -- ${extra[@]+"${extra[@]}"} <<<"$listing"
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
        status=$(py -c 'import json, sys; print(json.load(open(sys.argv[1])).get("status"))' "$run_dir/result.json" \
                 2>/dev/null || echo unreadable)
        if [ "$status" = complete ]; then echo "skip $name (complete)"; continue; fi
        resume=("$resume_flag")
    fi
    made=$(mkdir -p "$run_dir" 2>&1) || die "environment variable RUNS_DIR: cannot create the run folder $run_dir" \
        "(${made##*: }); set RUNS_DIR to a folder you can write to"
    # one ladder.sh per run: it holds $run_dir/ladder.lock (fd 8, inherited by torchrun) from here to the run's end,
    # so the second of two identical commands stops here, before it appends anything to the first one's train.log
    # (train.lock is taken only once train.py has started, seconds later)
    if command -v flock >/dev/null; then
        exec 8>>"$run_dir/ladder.lock"
        holder="another ladder.sh ($(head -n 1 "$run_dir/ladder.lock" | grep . || echo 'starting'))"
        flock -n 8 || die "run $name is being trained by $holder; wait for it or stop it first"
        printf 'PID %s on %s\n' "$$" "$(uname -n)" >"$run_dir/ladder.lock"
    fi
    log="$run_dir/train.log"
    echo "run  $name -> $log"
    # torchrun runs in the background so that a SIGTERM/SIGINT to this script reaches it (and through it the
    # workers, which torchrun starts in their own session); a worker that survives anyway holds the run's lock.
    # shellcheck disable=SC2086
    train_args "$name" $args
    # NCCL's flight recorder: every rank keeps its last
    # 2000 collectives and dumps them on a timeout to RUN_DIR/nccl_trace_rank_<rank>; a failed collective ends the
    # process instead of hanging. The user's own settings win.
    trace="$(cd "$run_dir" && pwd)/nccl_trace_rank_"
    TORCH_NCCL_TRACE_BUFFER_SIZE="${TORCH_NCCL_TRACE_BUFFER_SIZE:-2000}" TORCH_FR_BUFFER_SIZE="${TORCH_FR_BUFFER_SIZE:-2000}" \
    TORCH_NCCL_DUMP_ON_TIMEOUT="${TORCH_NCCL_DUMP_ON_TIMEOUT:-1}" TORCH_NCCL_DEBUG_INFO_TEMP_FILE="${TORCH_NCCL_DEBUG_INFO_TEMP_FILE:-$trace}" \
    TORCH_FR_DUMP_TEMP_FILE="${TORCH_FR_DUMP_TEMP_FILE:-$trace}" TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}" \
        "${launch[@]}" train.py "${train_args[@]}" ${resume[@]+"${resume[@]}"} ${extra[@]+"${extra[@]}"} >>"$log" 2>&1 &
    child=$! current=$name
    # torchrun exits 1 when stopped; the ladder exits as its signal says (128 + n), in stopped()
    status=0
    wait "$child" || status=$?
    child="" current=""
    if [ "$status" != 0 ]; then
        echo "ladder.sh: run $name failed; see $log" >&2
        tail -n 5 "$log" >&2
        exit 1
    fi
    grep -E "^done:" "$log" | tail -n 1 || true
    exec 8>&-  # the run is done: its lock goes (a worker that outlived torchrun still holds it)
done
# The ladder's report: every run's report.md, and RUNS_DIR/report.md with the runs, the fit of every arm with >= 3
# complete depths (bootstrap CIs; figures in RUNS_DIR/fit) and the curves. `python fit.py report --runs-dir RUNS_DIR` rebuilds it.
# Node 0 writes it (the runs folder is shared), once a run has a result.json.
if [ "${NODE_RANK:-0}" = 0 ] && compgen -G "$runs_dir/*/result.json" >/dev/null; then
    py fit.py report --runs-dir "$runs_dir" | { grep -v "^wrote .*/report.md$" || true; }
    echo "report: $runs_dir/report.md"
fi
