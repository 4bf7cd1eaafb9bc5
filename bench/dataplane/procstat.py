"""What the harness reads from /proc: a process's RSS (now and peak) and CPU time, the machine's busy time."""

from __future__ import annotations

import os
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK")
MIB = 1 << 20


def rss_bytes(pid: int) -> int:
    """Resident set size now (VmRSS), 0 if the process is gone."""
    return _status_bytes(pid, "VmRSS:")


def peak_rss_bytes(pid: int) -> int:
    """The highest resident set size the process has had (VmHWM), 0 if it is gone."""
    return _status_bytes(pid, "VmHWM:")


def _status_bytes(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the whole process (all threads), from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return parse_stat_cpu(stat)


def parse_stat_cpu(stat: str) -> float:
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of the full line
    return (utime + stime) / _TICK


@dataclass(frozen=True)
class MachineTimes:
    busy: float  # CPU seconds spent in processes (user, nice, system, steal), over all CPUs
    total: float

    @classmethod
    def read(cls) -> "MachineTimes":
        with open("/proc/stat") as f:
            return cls.parse(f.readline())

    @classmethod
    def parse(cls, cpu_line: str) -> "MachineTimes":
        values = [int(v) for v in cpu_line.split()[1:]] + [0] * 10
        # user nice system idle iowait irq softirq steal guest guest_nice; guest time is already in user.
        # irq and softirq are left out of busy: much of it is the benchmark's own loopback traffic,
        # which no process is charged for.
        user, nice, system, _idle, _iowait, _irq, _softirq, steal = values[:8]
        return cls((user + nice + system + steal) / _TICK, sum(values[:8]) / _TICK)
