"""``sluice broker``: run a broker until SIGTERM/SIGINT, then stop gracefully.

Flags win over the TOML file given with ``--config`` (BrokerConfig.load).
Logs go to stderr, and to a rotated DIR/broker.log with ``--log-dir``. Exit status
0 after a graceful stop, 1 when the broker cannot start (bad settings, store
locked or damaged, port taken, metrics port taken).
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from pathlib import Path

import click

from sluice.broker.config import BrokerConfig
from sluice.errors import SluiceError
from sluice.logsetup import LEVELS, configure_logging

log = logging.getLogger("sluice.broker")

SWITCH_INTERVAL_S = 0.0005


async def run_broker(config: BrokerConfig) -> None:
    """Start a broker, wait for SIGTERM or SIGINT, stop it gracefully."""
    from sluice.broker.controller import BrokerController

    # The event loop gives up the GIL at every socket call; CPU-bound store threads (dispatch, appends)
    # then keep it for a whole switch interval (5 ms by default), which stalls every connection. A short
    # interval hands it back sooner: lower latency and more throughput (benchmarks/produce_pull.py).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    broker = BrokerController(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await broker.start()
    except BaseException:
        await broker.stop()
        raise
    # What starting built (modules, settings, the tables loaded from disk) lives as long as the broker: frozen
    # out of the collector's generations, a full collection no longer walks it, and its pause (which the
    # messages in flight wait out) stays proportional to what the broker allocated since.
    gc.freeze()
    try:
        await stop.wait()
    finally:
        await broker.stop()


@click.command("broker")
@click.option("--listen", metavar="HOST:PORT", help="Address to listen on [default: 127.0.0.1:10911].")
@click.option("--namesrv", metavar="HOST:PORT[;HOST:PORT...]", help="Namesrvs to register with.")
@click.option("--store", metavar="DIR", help="Store directory [default: ./sluice-store].")
@click.option("--broker-name", help="Broker name [default: broker-a].")
@click.option("--cluster-name", help="Cluster name [default: DefaultCluster].")
@click.option("--flush", type=click.Choice(["sync", "async"]), help="Acknowledge sends after fsync (sync) or not.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="TOML file with any broker setting (see docs/broker.md); flags win.")
@click.option("--auto-create-topic/--no-auto-create-topic", default=None,
              help="Create unknown topics on first send [default: on].")
@click.option("--acl", metavar="FILE", help="RocketMQ plain_acl.yml: check every request (docs/security.md).")
@click.option("--tls-mode", type=click.Choice(["disabled", "permissive", "enforcing"], case_sensitive=False),
              help="TLS: plain only, both on one port, or TLS only (docs/security.md) [default: disabled].")
@click.option("--tls-cert", metavar="PEM", help="The broker's certificate chain (for permissive and enforcing).")
@click.option("--tls-key", metavar="PEM", help="The certificate's private key.")
@click.option("--namesrv-tls/--no-namesrv-tls", default=None, help="Register with the namesrvs over TLS [default: off].")
@click.option("--namesrv-tls-ca", metavar="PEM", help="CA file the namesrvs' certificates are checked with.")
@click.option("--tls-client-ca", metavar="PEM", help="Mutual TLS: TLS clients need a certificate this CA signed.")
@click.option("--metrics-listen", metavar="HOST:PORT", help="Serve Prometheus metrics at http://HOST:PORT/metrics.")
@click.option("--log-level", type=click.Choice(list(LEVELS), case_sensitive=False),
              help="Root log level [default: INFO, or $SLUICE_LOG_LEVEL].")
@click.option("--log-dir", metavar="DIR",
              help="Also log to DIR/broker.log, rotated by size (log_max_bytes, log_backups).")
def broker_command(config_path: Path | None, listen: str | None, namesrv: str | None, store: str | None,
                   broker_name: str | None, cluster_name: str | None, flush: str | None,
                   auto_create_topic: bool | None, acl: str | None = None, tls_mode: str | None = None,
                   tls_cert: str | None = None, tls_key: str | None = None, namesrv_tls: bool | None = None,
                   namesrv_tls_ca: str | None = None, tls_client_ca: str | None = None,
                   metrics_listen: str | None = None, log_level: str | None = None, log_dir: str | None = None) -> None:
    """Run a broker: stores messages, serves sends and (long-polling) pulls, registers with namesrvs."""
    try:
        config = BrokerConfig.load(config_path, listen=listen, namesrv=namesrv, store=store,
                                   broker_name=broker_name, cluster_name=cluster_name, flush=flush,
                                   auto_create_topic=auto_create_topic, acl=acl, tls_mode=tls_mode,
                                   tls_cert=tls_cert, tls_key=tls_key, namesrv_tls=namesrv_tls,
                                   namesrv_tls_ca=namesrv_tls_ca, tls_client_ca=tls_client_ca,
                                   metrics_listen=metrics_listen, log_level=log_level, log_dir=log_dir)
        configure_logging(config.log_level or os.environ.get("SLUICE_LOG_LEVEL", "INFO"), name="broker",
                          log_dir=config.log_dir or None, max_bytes=config.log_max_bytes, backups=config.log_backups)
    except SluiceError as exc:
        raise click.UsageError(str(exc)) from None
    if not config.namesrv:  # legal (RocketMQ allows it), but clients find brokers only through a namesrv
        log.warning("no namesrv given (--namesrv, or namesrv in the TOML file): this broker registers nowhere, "
                    "so producers and consumers will not find it")
    try:
        asyncio.run(run_broker(config))
    except SluiceError as exc:
        raise click.ClickException(f"broker failed: {exc}") from None
    except OSError as exc:  # typically the port is taken
        raise click.ClickException(f"cannot start the broker on {config.listen}: {exc}") from None
