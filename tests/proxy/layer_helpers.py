"""Drive a connection layer without sockets: feed it replies, collect the commands it yields."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tether.proxy.core import commands as cmd


def drive(layer: cmd.Layer, answer: Callable[[cmd.Command], Any]) -> list[cmd.Command]:
    """Run ``layer`` to its end; ``answer(command)`` gives each blocking command's reply."""
    seen: list[cmd.Command] = []
    reply: Any = None
    for _ in range(1000):
        try:
            command = layer.send(reply)
        except StopIteration:
            return seen
        seen.append(command)
        reply = answer(command) if command.blocking else None
    raise AssertionError(f"the layer did not end: {seen[-5:]}")


def replies(table: dict[type, Any]) -> Callable[[cmd.Command], Any]:
    """Answer by command type; a list answers successive commands of that type in turn."""
    queues = {k: list(v) if isinstance(v, list) else None for k, v in table.items()}

    def answer(command: cmd.Command) -> Any:
        kind = type(command)
        if kind not in table:
            raise AssertionError(f"unexpected command {command!r}")
        queue = queues[kind]
        if queue is None:
            value = table[kind]
        else:
            assert queue, f"no more replies for {command!r}"
            value = queue.pop(0)
        return value(command) if callable(value) and not isinstance(value, type) else value

    return answer


def kinds(commands: list[cmd.Command]) -> list[str]:
    return [type(c).__name__ for c in commands]
