"""The `sluice` command."""
from __future__ import annotations

import click

from sluice import __version__


@click.group()
@click.version_option(__version__, prog_name="sluice")
def main() -> None:
    """Sluice: a RocketMQ-compatible message queue with server-side filtering."""


from sluice.namesrv.cli import namesrv_command  # noqa: E402

main.add_command(namesrv_command)

from sluice.store.cli import store_group  # noqa: E402

main.add_command(store_group)

from sluice.broker.cli import broker_command  # noqa: E402

main.add_command(broker_command)

from sluice.demo import demo_command  # noqa: E402

main.add_command(demo_command)

from sluice.spark.cli import spark_group  # noqa: E402

main.add_command(spark_group)

from sluice.admin import cli_command as admin_command  # noqa: E402

main.add_command(admin_command)

from sluice.bench.command import bench_command  # noqa: E402

main.add_command(bench_command)

from sluice.filtersrv.cli import filtersrv_command  # noqa: E402

main.add_command(filtersrv_command)
