"""Joining a ``jax.distributed`` job on loopback (local multi-process runs
and tests) and picking a free port for its coordinator."""

from __future__ import annotations

import socket

__all__ = ["free_port", "initialize_loopback"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def initialize_loopback(rank: int, world: int, port: int, timeout_s: int = 120) -> None:
    """Join a ``jax.distributed`` job of ``world`` CPU processes on this
    machine: coordinator on 127.0.0.1:``port`` (bound to loopback only), gloo
    collectives. How tests, benchmarks and the local launcher start ranks."""
    import jax

    if getattr(jax.config, "jax_cpu_collectives_implementation", "gloo") is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        coordinator_bind_address=f"127.0.0.1:{port}",
        num_processes=world,
        process_id=rank,
        initialization_timeout=timeout_s,
    )
