"""The `fx` command: argument wiring only."""

from __future__ import annotations

import click


@click.group()
def main() -> None:
    """fxworker: durable agent sessions on Redis and Celery."""


@main.command()
def demo() -> None:
    """Run one turn end to end on the embedded default (no Redis, no API key)."""
    click.echo("demo: not built yet")
