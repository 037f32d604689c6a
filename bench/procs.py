"""A launch's worker processes, for the fault benchmarks (chaos.py, fault_matrix.py): its children, each one's rank
(the RANK variable launch gives it), and whether a process is still running."""
import subprocess


def children(pid):
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return []
    return [int(p) for p in out.split()]


def rank_of(pid):
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return None
    for kv in env:
        if kv.startswith(b"RANK="):
            return int(kv[5:])
    return None


def alive(pid):
    """Running or stopped, not a zombie nor gone."""
    try:
        return open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
