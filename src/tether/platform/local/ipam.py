"""Pod IP address management for the local platform: persistent, deterministic, cross-process.

Role: hand out pod addresses from a configurable IPv4 range (default ``10.213.0.0/16``; the
addresses exist only inside the pod namespaces and on the host bridge).  The first host
address is the gateway (the bridge's address); the network, broadcast and gateway addresses
are never handed out.  Each owner (a pod) holds at most one address: asking again returns
it, releasing frees it.  Addresses go round-robin after the last one handed out, so a freed
address is not reused at once (a stale endpoint does not reach the next pod) - the same
sequence of calls always yields the same addresses.

An ExternalWorkload (a VM on the platform's bridge) brings its own address: `reserve` holds a
given address of the range for it (owner `workload_owner`), so no pod is ever handed it, and
refuses (`AddressTaken`, naming the holder) an address a pod, another workload or the gateway
holds.  Addresses outside the range need no reservation (pods never get them).

State is a SQLite file (``ipam.db``) in the state directory; every change is one
``BEGIN IMMEDIATE`` transaction, so processes sharing the directory never hand out the same
address.  Callers: the local pod runner (allocate on create, release on delete), the
ExternalWorkload controller's reservations (``tether.platform.local.endpointslices``) and tests.
"""

from __future__ import annotations

import ipaddress
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

DEFAULT_POD_CIDR = ipaddress.IPv4Network("10.213.0.0/16")
DB_FILE = "ipam.db"
BUSY_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pool (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    cidr TEXT NOT NULL,
    last INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS allocation (
    address INTEGER PRIMARY KEY,
    owner TEXT NOT NULL UNIQUE
);
"""


class IpamError(RuntimeError):
    """The pod range is misconfigured or cannot serve the request; the message says which."""


class PoolExhausted(IpamError):
    """Every pod address in the range is in use."""


class AddressTaken(IpamError):
    """The address asked for is held by someone else (``holder``: a pod ``ns/name``, a workload, the gateway)."""

    def __init__(self, address: str, holder: str) -> None:
        super().__init__(f"{address} is the address of {describe_owner(holder)}")
        self.address = address
        self.holder = holder


_WORKLOAD = "externalworkload:"
_GATEWAY = "gateway:"


def workload_owner(namespace: str, name: str) -> str:
    """The owner an ExternalWorkload's reservation is held under (pods are ``<ns>/<name>``)."""
    return f"{_WORKLOAD}{namespace}/{name}"


def is_workload_owner(owner: str) -> bool:
    return owner.startswith(_WORKLOAD)


def describe_owner(owner: str) -> str:
    if is_workload_owner(owner):
        return f"ExternalWorkload {owner[len(_WORKLOAD):]}"
    if owner.startswith(_GATEWAY):
        return "the platform's gateway (its bridge)"
    return f"pod {owner}"


@dataclass(frozen=True)
class IpamConfig:
    state_dir: Path
    pod_cidr: ipaddress.IPv4Network = DEFAULT_POD_CIDR

    def __post_init__(self) -> None:
        if not isinstance(self.pod_cidr, ipaddress.IPv4Network):
            raise IpamError(f"pod_cidr: {self.pod_cidr!r} is not an IPv4 network")
        if self.pod_cidr.prefixlen > 30:
            raise IpamError(f"pod_cidr: {self.pod_cidr} is too small; it needs room for a gateway and pods (/30 or larger)")


class Ipam:
    """Allocates pod addresses from one range, backed by ``<state_dir>/ipam.db``."""

    def __init__(self, config: IpamConfig) -> None:
        self._cidr = config.pod_cidr
        self._first = int(self._cidr.network_address) + 2  # after the gateway
        self._last = int(self._cidr.broadcast_address) - 1
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self._path = config.state_dir / DB_FILE
        with closing(sqlite3.connect(self._path, timeout=BUSY_TIMEOUT_S)) as db:
            db.executescript(_SCHEMA)
        with self._transaction() as db:
            row = db.execute("SELECT cidr FROM pool").fetchone()
            if row is None:
                db.execute("INSERT INTO pool VALUES (1, ?, ?)", (str(self._cidr), self._first - 1))
            elif row[0] != str(self._cidr):
                if db.execute("SELECT COUNT(*) FROM allocation").fetchone()[0]:
                    raise IpamError(
                        f"pod_cidr: {self._path} holds addresses from {row[0]}, not {self._cidr}; "
                        "delete the pods (or purge the state) before changing the range"
                    )
                db.execute("UPDATE pool SET cidr = ?, last = ?", (str(self._cidr), self._first - 1))

    @property
    def gateway(self) -> ipaddress.IPv4Interface:
        """The host bridge's address, with the range's prefix length."""
        return self._interface(int(self._cidr.network_address) + 1)

    def allocate(self, owner: str) -> ipaddress.IPv4Interface:
        """The owner's address: the one it holds, else the next free one after the last handed out."""
        with self._transaction() as db:
            held = db.execute("SELECT address FROM allocation WHERE owner = ?", (owner,)).fetchone()
            if held:
                return self._interface(held[0])
            used = {row[0] for row in db.execute("SELECT address FROM allocation")}
            (last,) = db.execute("SELECT last FROM pool").fetchone()
            start = last + 1 if self._first <= last < self._last else self._first
            for address in [*range(start, self._last + 1), *range(self._first, start)]:
                if address not in used:
                    db.execute("INSERT INTO allocation VALUES (?, ?)", (address, owner))
                    db.execute("UPDATE pool SET last = ?", (address,))
                    return self._interface(address)
        raise PoolExhausted(f"pod range {self._cidr} is exhausted: all {self._last - self._first + 1} pod addresses are in use")

    def reserve(self, owner: str, address: str) -> bool:
        """Hold ``address`` for ``owner`` (moving a reservation it held elsewhere); False when the address is
        outside the pod range (nothing to hold). Raises `AddressTaken` when someone else holds it."""
        value = int(ipaddress.IPv4Address(address))
        if value == self._first - 1:
            raise AddressTaken(address, _GATEWAY)
        if not self._first <= value <= self._last:
            return False
        with self._transaction() as db:
            holder = db.execute("SELECT owner FROM allocation WHERE address = ?", (value,)).fetchone()
            if holder is not None and holder[0] != owner:
                raise AddressTaken(address, holder[0])
            db.execute("DELETE FROM allocation WHERE owner = ?", (owner,))
            db.execute("INSERT INTO allocation VALUES (?, ?)", (value, owner))
        return True

    def release(self, owner: str) -> ipaddress.IPv4Interface | None:
        """Free the owner's address; returns it, or None when the owner held none."""
        with self._transaction() as db:
            held = db.execute("SELECT address FROM allocation WHERE owner = ?", (owner,)).fetchone()
            if held is None:
                return None
            db.execute("DELETE FROM allocation WHERE owner = ?", (owner,))
            return self._interface(held[0])

    def allocations(self) -> dict[str, ipaddress.IPv4Interface]:
        """Owner -> address, for every address in use."""
        with self._transaction() as db:
            rows = db.execute("SELECT owner, address FROM allocation ORDER BY address").fetchall()
        return {owner: self._interface(address) for owner, address in rows}

    def _interface(self, address: int) -> ipaddress.IPv4Interface:
        return ipaddress.IPv4Interface((address, self._cidr.prefixlen))

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write-locked transaction: committed on success, rolled back on error."""
        with closing(sqlite3.connect(self._path, timeout=BUSY_TIMEOUT_S, isolation_level=None)) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
