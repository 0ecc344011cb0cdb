"""What the scripts share, importable without torch: `cli_main(run, "x.py", argv)` (a UsageError, Parser's bad flags
too, becomes one line "x.py: error: ...", exit 2), flag types, atomic writes, a run's process setup (torchrun, device).
"""
import argparse, contextlib, ctypes, datetime, hashlib, json, math, os, signal, sys


class UsageError(Exception):
    """Bad flags or inputs: one line on stderr, exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised where the program is (as Python raises KeyboardInterrupt for SIGINT): `with` blocks clean up."""


def raise_interrupted(signum, frame):
    raise Interrupted()


def cli_main(run, prog, argv=None):
    """run(argv) -> exit code: a UsageError is one line and 2; Ctrl-C or SIGTERM one line and 128 + n."""
    previous = signal.signal(signal.SIGTERM, raise_interrupted)
    try:
        code = run(argv)
        sys.stdout.flush()  # a closed pipe (`... | head -1`) surfaces here
    except UsageError as e:
        print(f"{prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt as e:
        term = isinstance(e, Interrupted)
        print(f"{prog}: stopped by {'SIGTERM' if term else 'SIGINT (Ctrl-C)'}; run the same command again",
              file=sys.stderr)
        code = 128 + (signal.SIGTERM if term else signal.SIGINT)
    except BrokenPipeError:  # the reader went away: stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 141
    finally:
        signal.signal(signal.SIGTERM, previous)
        if os.environ.get("WORLD_SIZE", "1") not in ("", "1"):  # a torchrun rank leaves its process group
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
    return 0 if code is None else code


def answer_help(parser_of, argv=None):
    """-h/--help before any `--`: print parser_of()'s help and exit, before the script loads torch."""
    argv = sys.argv[1:] if argv is None else argv
    ours = argv[:argv.index("--")] if "--" in argv else argv
    if "-h" in ours or "--help" in ours:
        with contextlib.suppress(UsageError):
            parser_of().parse_args(ours)


def integer(low, high):
    """argparse type: a whole number in [low, high]."""
    def whole_number(text):
        with contextlib.suppress(ValueError):
            if low <= int(text) <= high:
                return int(text)
        raise argparse.ArgumentTypeError(f"must be a whole number in [{low}, {high}], got {text!r}")
    return whole_number


def number(interval):
    """argparse type: a finite float in `interval`, written as in mathematics: "(0, 1]", "[0, inf)"."""
    low, high = (float(bound) for bound in interval[1:-1].split(","))
    expected = "a finite number" + ("" if (low, high) == (-math.inf, math.inf) else f" in {interval}")

    def finite_number(text):
        with contextlib.suppress(ValueError):
            value = float(text)
            above = low < value if interval[0] == "(" else low <= value
            if math.isfinite(value) and above and (value < high if interval[-1] == ")" else value <= high):
                return value
        raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}")
    return finite_number


def env_integer(name, default, low, high):
    """The whole number in environment variable `name` (unset or empty: default) in [low, high]."""
    text = os.environ.get(name, "")
    try:
        return default if text == "" else integer(low, high)(text)
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"environment variable {name} {e}") from None


MAX_PROCESSES_PER_NODE, MAX_NODES = 1024, 65536  # NPROC_PER_NODE, NNODES (ladder.sh declares the same ranges)


def exit_process(code):
    """Exit; under torchrun with several ranks via os._exit: gloo can abort at interpreter shutdown (pytorch#190489)."""
    if os.environ.get("WORLD_SIZE", "1") not in ("", "1"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def clock(seconds):
    """H:MM:SS, or — for no time."""
    s = None if seconds is None else round(seconds)
    return "—" if s is None else f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def write_text(path, text):
    """Write to a temporary name, then rename: a reader never sees half a file, a failed write leaves `path` as was."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def write_json(path, obj, allow_nan=True):
    write_text(path, json.dumps(obj, indent=2, allow_nan=allow_nan) + "\n")


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def keep_freed_cpu_memory():
    """glibc keeps freed blocks below 32 MiB for reuse (the CPU counterpart of CUDA's caching allocator) instead of
    unmapping a step's activations and faulting them in again next step. -> whether glibc took both settings."""
    with contextlib.suppress(OSError):  # not glibc
        libc, m_trim_threshold, m_mmap_threshold = ctypes.CDLL("libc.so.6"), -1, -3  # malloc.h
        return bool(libc.mallopt(m_mmap_threshold, 32 * 2 ** 20) and libc.mallopt(m_trim_threshold, 2 ** 31 - 1))
    return False


DIST_TIMEOUT_MINUTES = 30  # NCCL's default 10 can pass while ranks build, load and compile a large model


def uses_cuda(device_flag):
    import torch
    return torch.cuda.is_available() if device_flag == "auto" else device_flag == "cuda"


def torchrun_env():
    """-> (world size, rank, local rank) from torchrun's environment, each checked (one line when a value is off)."""
    world = env_integer("WORLD_SIZE", 1, 1, MAX_PROCESSES_PER_NODE * MAX_NODES)
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if world > 1 and not os.environ.get(name)]
    if missing:
        raise UsageError(f"WORLD_SIZE={world} needs {' and '.join(missing)} in the environment; start the processes "
                         "with torchrun, or set them")
    if world > 1:
        env_integer("MASTER_PORT", None, 1, 65535)
        per_node = env_integer("LOCAL_WORLD_SIZE", world, 1, MAX_PROCESSES_PER_NODE)
        if world % per_node:
            raise UsageError(f"LOCAL_WORLD_SIZE={per_node} does not divide the world size {world}: every node must "
                             "run as many processes (torchrun --nproc_per_node)")
    return world, env_integer("RANK", 0, 0, world - 1), env_integer("LOCAL_RANK", 0, 0, MAX_PROCESSES_PER_NODE - 1)


def setup_distributed(device_flag="auto", timeout_minutes=DIST_TIMEOUT_MINUTES):
    """-> (rank, world size, device) from torchrun's environment: NCCL on CUDA, gloo on CPU, none for one process."""
    import torch
    import torch.distributed as dist
    # before the first CUDA allocation; a user's own setting wins
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink SHARP binds ~1 GiB per rank outside the allocator
    use_cuda = uses_cuda(device_flag)
    if use_cuda and not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA device is visible")
    world, rank, local_rank = torchrun_env()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(local_rank)
    else:
        keep_freed_cpu_memory()
    if world > 1:
        dist.init_process_group("nccl" if use_cuda else "gloo", device_id=device if use_cuda else None,
                                timeout=datetime.timedelta(minutes=timeout_minutes))
    return rank, world, device
