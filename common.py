"""What the scripts share: the one-line error path and the flag types, atomic writes and file hashes, and the
process setup of a run (torchrun process group, device, autocast, CPU allocator). SIGINT and SIGTERM are one
exception, KeyboardInterrupt (Interrupted for SIGTERM).
Importable without torch (arms.py and fit.py are torch-free): the device functions import it when called. A script's
main is `cli_main(run, "x.py", argv)`: a UsageError (Parser's bad flags too) becomes "x.py: error: <one line>", exit 2.
"""
import argparse
import contextlib
import ctypes
import hashlib
import json
import math
import os
import signal
import socket
import sys



# ----------------------------------------------------------------------------------------------------------------------
# Command lines: one-line errors, exit codes

class UsageError(Exception):
    """Bad flags or inputs: reported as one line on stderr with exit code 2, never as a traceback."""


class Parser(argparse.ArgumentParser):
    """argparse whose errors (and its subcommands' errors) raise UsageError instead of printing the usage block."""

    def error(self, message):
        raise UsageError(message)


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised where the program is (as Python raises KeyboardInterrupt for SIGINT), so that `with` blocks
    clean up (data.py's tokenising pool ends its workers) instead of the process vanishing mid-write."""


def raise_interrupted(signum, frame):
    raise Interrupted()


def cli_main(run, prog, argv=None):
    """Call run(argv) and return its exit code (None counts as 0); a UsageError becomes one line
    '<prog>: error: <message>' on stderr and exit code 2; Ctrl-C or SIGTERM one line and exit code 128 + n."""
    previous = signal.signal(signal.SIGTERM, raise_interrupted)  # train.py's loop defers it to its next logged step
    try:
        code = run(argv)
        sys.stdout.flush()  # a closed pipe (`... | head -1`) surfaces here, inside the handler below
    except UsageError as e:
        print(f"{prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt as e:  # one line, as a UsageError, not a traceback
        name = "SIGTERM" if isinstance(e, Interrupted) else "SIGINT (Ctrl-C)"
        print(f"{prog}: stopped by {name}; run the same command again", file=sys.stderr)
        code = 128 + (signal.SIGTERM if isinstance(e, Interrupted) else signal.SIGINT)
    except BrokenPipeError:  # the reader went away: stop quietly, as Unix tools do (128 + SIGPIPE)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        code = 141
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0 if code is None else code


def answer_help(parser_of, argv=None):
    """-h or --help (before any `--`): print parser_of()'s help and exit 0. The scripts that load torch, scipy or
    pyarrow call it first, so that their help is instant instead of 2-3 s on 2 cores (they define their parser from
    torch-free modules). Any other command line, or a bad flag in front of --help, is left to the script's own parse."""
    argv = sys.argv[1:] if argv is None else argv
    ours = argv[:argv.index("--")] if "--" in argv else argv
    if "-h" in ours or "--help" in ours:
        with contextlib.suppress(UsageError):
            parser_of().parse_args(ours)


# Every numeric flag declares its range where it is parsed, with one of these two argparse types; a value outside is
# "argument --flag: must be ... in RANGE, got 'VALUE'" (exit 2) before any work starts.

def integer(low, high):
    """argparse type: a whole number in [low, high]."""
    def whole_number(text):
        value = whole_number_in(text, low, high)
        if value is None:
            raise argparse.ArgumentTypeError(f"must be a whole number in [{low}, {high}], got {text!r}")
        return value
    return whole_number


def whole_number_in(text, low, high):
    """int(text) when text is a whole number in [low, high], else None."""
    try:
        value = int(text)
    except ValueError:
        return None
    return value if low <= value <= high else None


def number(interval):
    """argparse type: a finite float in `interval`, written as in mathematics: "(0, 1]", "[0, inf)", "(-inf, inf)"."""
    low, high = (float(bound) for bound in interval[1:-1].split(","))
    low_open, high_open = interval[0] == "(", interval[-1] == ")"
    expected = "a finite number" + ("" if (low, high) == (-math.inf, math.inf) else f" in {interval}")

    def finite_number(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and low <= value <= high) or (low_open and value == low) \
                or (high_open and value == high):
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}")
        return value
    return finite_number


def env_integer(name, default, low, high):
    """The whole number in environment variable `name` (unset or empty: default), checked to lie in [low, high]."""
    text = os.environ.get(name, "")
    if text == "":
        return default
    value = whole_number_in(text, low, high)
    if value is None:
        raise UsageError(f"environment variable {name} must be a whole number in [{low}, {high}], got {text!r}")
    return value


MAX_PROCESSES_PER_NODE, MAX_NODES = 1024, 65536  # NPROC_PER_NODE, NNODES (ladder.sh declares the same ranges)


def torchrun_ranks():
    """(rank, local rank, world size) from torchrun's environment; one process (0, 0, 1) without it. Several
    processes need the rendezvous address too (else torch's ValueError once the process group starts)."""
    world = env_integer("WORLD_SIZE", 1, 1, MAX_PROCESSES_PER_NODE * MAX_NODES)
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if world > 1 and not os.environ.get(name)]
    if missing:
        raise UsageError(f"WORLD_SIZE={world} needs {' and '.join(missing)} in the environment (torchrun sets them); "
                         "start the processes with torchrun, or set them")
    if world > 1:
        env_integer("MASTER_PORT", None, 1, 65535)
        ranks_per_node(world)
    return (env_integer("RANK", 0, 0, world - 1), env_integer("LOCAL_RANK", 0, 0, MAX_PROCESSES_PER_NODE - 1),
            world)


def ranks_per_node(world):
    """Processes per node: torchrun's LOCAL_WORLD_SIZE (unset: one node of `world`), a divisor of the world size."""
    per_node = env_integer("LOCAL_WORLD_SIZE", world, 1, MAX_PROCESSES_PER_NODE)
    if world % per_node:
        raise UsageError(f"LOCAL_WORLD_SIZE={per_node} does not divide the world size {world}: every node must run "
                         "as many processes (torchrun --nproc_per_node)")
    return per_node


def exit_process(code):
    """Exit a script. Under torchrun with several ranks, leave with os._exit: gloo can abort in its worker thread
    during interpreter shutdown (pytorch#190489)."""
    if os.environ.get("WORLD_SIZE", "1") not in ("", "1"):  # read as written: a bad value was the script's error
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


# ----------------------------------------------------------------------------------------------------------------------
# Files: atomic writes, hashes

def clock(seconds):
    """Seconds as h:mm:ss (wall or training time: say which where it is printed)."""
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def write_text(path, text):
    """`path` holds `text`, written to a temporary name and renamed in one step: a reader never sees half of it, and a
    write that fails (a full disk) leaves `path` as it was and no temporary file behind."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_json(path, obj, allow_nan=True):
    write_text(path, json.dumps(obj, indent=2, allow_nan=allow_nan) + "\n")


# ----------------------------------------------------------------------------------------------------------------------
# Records read back (a checkpoint's meta.json, result.json, trajectory.jsonl, a pool's corpus.json and verified.json,
# core_eval's eval.json): each declares its schema where it is read (checkpoint.py, data.py, core_eval.py) as a table
# {field: rule}, and check_record checks a record against it before any field is used. A rule is (what, test), a
# nested table for an object, each(rule) for a list, nullable(rule) for rule or null; a field named "name?" may be
# absent. Extra fields pass.

def rule(what, test):
    return what, test


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def whole(low=0, high=None):
    return rule(f"a whole number >= {low}" if high is None else f"a whole number in [{low}, {high}]",
                lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v <= high))


def real(low=0.0):
    return rule(f"a finite number >= {low:g}", lambda v: is_number(v) and math.isfinite(v) and v >= low)


def nullable(r):
    return ("nullable", r)


ANY_NUMBER = rule("a number (nan allowed)", is_number)
TEXT, OBJECT = rule("text", lambda v: isinstance(v, str)), rule("an object", lambda v: isinstance(v, dict))


def each(r):
    return ("each", r)


def shown(v):
    if isinstance(v, (dict, list)):
        return f"{'an object' if isinstance(v, dict) else 'a list'} of {len(v)}"
    text = json.dumps(v) if v is None or isinstance(v, (bool, int, float, str)) else type(v).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def record_error(value, schema, where=""):
    """The first field of `value` that breaks `schema` as "field F must be ..., got ..." (None when all hold)."""
    name = where or "the record"
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return f"{name} must be an object, got {shown(value)}"
        for key, r in schema.items():
            field = key.rstrip("?")
            if field not in value:
                if key.endswith("?"):
                    continue
                return f"field {where + '.' if where else ''}{field} is missing"
            error = record_error(value[field], r, f"{where}.{field}" if where else field)
            if error:
                return error
        return None
    if schema[0] == "nullable":
        return None if value is None else record_error(value, schema[1], where)
    if schema[0] == "each":
        if not isinstance(value, list):
            return f"field {name} must be a list, got {shown(value)}"
        return next(filter(None, (record_error(v, schema[1], f"{where}[{i}]") for i, v in enumerate(value))), None)
    return None if schema[1](value) else f"field {name} must be {schema[0]}, got {shown(value)}"


def check_record(path, value, schema, fix, error_class=UsageError):
    """Refuse (UsageError, one line naming the file and the field) a record that breaks its declared schema."""
    error = record_error(value, schema)
    if error:
        raise error_class(f"{path} {error[len('the record '):]}; {fix}" if error.startswith("the record ") else
                         f"{path}: {error}; {fix}")
    return value


# The run records as fit.py's readers check them (watch.py's runs and curves, laws.py's ladders); train.py writes them
# and reads back nothing but its own checkpoints.
EVAL_RECORD = {"step": whole(0), "epoch?": whole(0), "val_loss": ANY_NUMBER, "val_bpb?": nullable(ANY_NUMBER),
               "passes?": whole(1), "when?": TEXT}
RESULT_SCHEMA = {  # a run's result.json (train.write_result), as far as anything reads it
    "status": TEXT, "arch?": TEXT, "depth?": whole(1), "data_dir?": nullable(TEXT), "data_manifest?": nullable(OBJECT),
    "plan?": {"arch?": TEXT, "depth?": whole(1), "steps?": whole(1), "total_flops?": real(0),
              "warmdown_ratio?": real(0), "seed?": whole(0)},
    "completed_steps?": whole(0), "evals?": each(EVAL_RECORD), "growth_events?": each({"step": whole(0)}),
    "estimated_training_flops?": real(0), "final_val_loss?": nullable(ANY_NUMBER),
    "total_training_time_seconds?": real(0), "error?": nullable(TEXT)}
TRAJECTORY_LINE = {  # each line of trajectory.jsonl (docs/trajectory.md); more keys pass
    "step": whole(1), "loss": nullable(ANY_NUMBER), "tokens?": whole(0), "flops?": real(0), "lr_multiplier?": real(0),
    "passes?": whole(1), "stage?": whole(0), "epoch?": whole(0), "tokens_per_second?": nullable(ANY_NUMBER),
    "grad_norm?": nullable(ANY_NUMBER), "scalars?": OBJECT, "wall_seconds?": real(0), "train_seconds?": real(0),
    "eta_seconds?": nullable(real(0)), "val_loss?": nullable(ANY_NUMBER), "val_bpb?": nullable(ANY_NUMBER),
    "val_passes?": whole(1), "val_loss_after_growth?": nullable(ANY_NUMBER),
    "val_bpb_after_growth?": nullable(ANY_NUMBER), "passes_after_growth?": whole(1)}


def check_regular_file(path, fix):
    """Refuse a path that exists but is no regular file: open() of a FIFO waits forever for a writer."""
    if os.path.lexists(path) and not os.path.isfile(path):
        raise UsageError(f"{path} is not a regular file; {fix}")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------------------------------
# Processes and devices (train.py, bench.py, core_eval.py); torch is imported here, not at the top

GLIBC_M_TRIM_THRESHOLD, GLIBC_M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers (malloc.h)
GLIBC_MMAP_THRESHOLD_MAX = 32 * 2 ** 20                  # the largest M_MMAP_THRESHOLD glibc accepts on 64-bit


def keep_freed_cpu_memory():
    """Make glibc keep freed blocks below 32 MiB for reuse instead of handing them back to the kernel, the CPU
    counterpart of CUDA's caching allocator: by default glibc mmaps a step's activations of a few MB (or trims the
    freed heap top, as its thresholds move), so a training step can fault their pages in again. -> whether glibc
    took both settings (False without glibc)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(GLIBC_M_MMAP_THRESHOLD, GLIBC_MMAP_THRESHOLD_MAX)
                and libc.mallopt(GLIBC_M_TRIM_THRESHOLD, 2 ** 31 - 1))


def memory_in_use(device):
    """This process's memory since the previous call, which resets the peaks (result.json's memory_measured). CUDA:
    the caching allocator's peaks, and from mem_get_info what the device holds beyond the allocator's reserve (the
    CUDA context, NCCL's buffers). CPU: the resident set, its peak reset where the kernel allows (clear_refs)."""
    import torch
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        out = dict(max_memory_allocated=torch.cuda.max_memory_allocated(device),
                   max_memory_reserved=torch.cuda.max_memory_reserved(device), device_used=total - free,
                   outside_allocator=total - free - torch.cuda.memory_reserved(device))
        torch.cuda.reset_peak_memory_stats(device)
        return out
    try:
        with open("/proc/self/status") as f:
            kib = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f) if k in ("VmHWM", "VmRSS")}
    except OSError:  # no procfs (macOS): the process's peak, never reset
        import resource
        return dict(max_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, rss=None)
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    return dict(max_rss=kib["VmHWM"] * 1024, rss=kib["VmRSS"] * 1024)


DIST_TIMEOUT_MINUTES = 30  # NCCL's default 10 can pass while ranks build, load and compile a large model at start-up


def uses_cuda(device_flag):
    """Whether --device (auto|cpu|cuda) means CUDA: auto does where a CUDA device is visible."""
    import torch
    return torch.cuda.is_available() if device_flag == "auto" else device_flag == "cuda"


def setup_distributed(device_flag="auto", timeout_minutes=DIST_TIMEOUT_MINUTES):
    """-> (rank, world size, device) from the torchrun environment: NCCL on CUDA, gloo on CPU, none for one process.
    timeout_minutes: how long a collective may wait for the slowest rank before the process group gives up."""
    import datetime

    import torch
    import torch.distributed as dist
    # Before the first CUDA allocation: the planner packs a GPU to its margin, and growth halves the micro-batch;
    # expandable segments let the caching allocator grow blocks instead of fragmenting. A user's setting wins.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    # NVLS (NVLink SHARP on NVSwitch nodes) binds ~1 GiB per rank outside the allocator; off unless the user sets it.
    # The planner reads the same variable (plan.nvls_enabled), so a run and its dry run count the same buffers.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    use_cuda = uses_cuda(device_flag)
    if use_cuda and not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA device is visible")
    rank, local_rank, world = torchrun_ranks()
    if use_cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if not use_cuda:
        keep_freed_cpu_memory()
    if world > 1:
        dist.init_process_group("nccl" if use_cuda else "gloo", device_id=device if use_cuda else None,
                                timeout=datetime.timedelta(minutes=timeout_minutes))
    return rank, world, device


def cli_main_distributed(run, prog, argv=None):
    """cli_main for a script that may join a torchrun process group; the group is left on the way out."""
    import torch.distributed as dist
    try:
        return cli_main(run, prog, argv)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now (a launch's rendezvous)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        return listener.getsockname()[1]


def autocast(device):
    """bf16 autocast on CUDA; plain fp32 on CPU."""
    import torch
    return torch.autocast("cuda", torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
