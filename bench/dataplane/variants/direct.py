"""direct: the load generator talks to nginx itself. The floor every other variant adds to."""

from __future__ import annotations

import subprocess

from bench.dataplane.backend import nginx_binary
from bench.dataplane.variants.base import Context, Plan, Variant


class Direct(Variant):
    name = "direct"
    description = "load generator -> nginx (no proxy): the baseline"

    @classmethod
    def version(cls) -> str:
        binary = nginx_binary()
        if binary is None:
            return ""
        out = subprocess.run([str(binary), "-v"], capture_output=True, text=True).stderr.strip()
        return out.removeprefix("nginx version: ")

    def plan(self, ctx: Context) -> Plan:
        return Plan(proxies=[], entry=ctx.backend)


class DirectH2(Direct):
    name = "direct-h2"
    description = "h2load -> nginx over h2c (HTTP/2, no proxy): the HTTP/2 baseline"
    load = "h2"


class DirectGrpc(Direct):
    name = "direct-grpc"
    description = "h2load (gRPC unary calls) -> nginx over h2c (no proxy): the gRPC baseline"
    load = "grpc"
