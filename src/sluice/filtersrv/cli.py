"""``sluice filtersrv``: run a filter server for one broker until SIGTERM/SIGINT.

A broker with ``filter_server_nums = N`` starts N of these itself
(broker/filter_servers.py); operators may also run them by hand. Exit status 0
after a graceful stop, 1 when the server cannot start (bad flags, port taken).
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal

import click

from sluice.acl.signature import Credentials
from sluice.errors import SluiceError
from sluice.filtersrv.heap import keep_freed_heap
from sluice.filtersrv.sandbox import WorkerLimits
from sluice.filtersrv.server import FiltersrvConfig, FilterServer
from sluice.transport.tls import ClientTls

__all__ = ["filtersrv_command", "run_filtersrv", "ACCESS_KEY_ENV", "SECRET_KEY_ENV"]

#: The filter server's account for a broker with ACL on (a broker passes its own to its children).
ACCESS_KEY_ENV, SECRET_KEY_ENV = "SLUICE_FILTERSRV_ACCESS_KEY", "SLUICE_FILTERSRV_SECRET_KEY"

log = logging.getLogger("sluice.filtersrv")


async def _watch_parent(pid: int, stop: asyncio.Event) -> None:
    while os.getppid() == pid:
        await asyncio.sleep(1.0)
    log.warning("parent process %d is gone: stopping", pid)
    stop.set()


async def run_filtersrv(config: FiltersrvConfig, parent_pid: int | None = None) -> None:
    server = FilterServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if parent_pid is not None:  # a broker's child: a broker killed with SIGKILL must not leave it behind
        loop.create_task(_watch_parent(parent_pid, stop))
    try:
        await server.start()
        await stop.wait()
    finally:
        await server.stop()


_D = WorkerLimits()


@click.command("filtersrv")
@click.option("--broker", required=True, metavar="HOST:PORT", help="The broker this filter server serves.")
@click.option("--listen", default="127.0.0.1:0", show_default=True, metavar="HOST:PORT",
              help="Address consumers connect to (registered with the broker as is; port 0 picks one).")
@click.option("--repository", metavar="DIR", help="Directory of filter-class modules ('mod:Cls' is DIR/mod.py).")
@click.option("--repository-url", metavar="URL",
              help="Base URL of filter-class modules ('mod:Cls' is URL/mod.py), where the directory has none.")
@click.option("--uploads/--no-uploads", default=False, show_default=True,
              help="Accept class source sent by consumers (uploaded code; see docs/security.md).")
@click.option("--worker-cpu-seconds", type=float, default=_D.cpu_seconds, show_default=True,
              help="CPU seconds a class may use on one batch (RLIMIT_CPU).")
@click.option("--worker-memory-mb", type=int, default=_D.memory_bytes // (1024 * 1024), show_default=True,
              help="Address space of a worker in MiB (RLIMIT_AS; 0: unlimited).")
@click.option("--batch-deadline-ms", type=int, default=int(_D.deadline_s * 1000), show_default=True,
              help="Wall time a class may take on one batch before its worker is killed.")
@click.option("--register-interval", type=float, default=10.0, show_default=True,
              help="Seconds between registrations with the broker.")
@click.option("--repository-check-interval", type=float, default=60.0, show_default=True,
              help="Seconds between re-reads of the repository's class files.")
@click.option("--acl", metavar="FILE", help="plain_acl.yml: check every request; uploading needs an admin account.")
@click.option("--tls-mode", type=click.Choice(["disabled", "permissive", "enforcing"], case_sensitive=False),
              default="disabled", show_default=True, help="TLS on the listening port, as the broker's --tls-mode.")
@click.option("--tls-cert", metavar="PEM", help="The certificate chain served (permissive and enforcing).")
@click.option("--tls-key", metavar="PEM", help="Its private key.")
@click.option("--tls-client-ca", metavar="PEM", help="Mutual TLS: TLS consumers need a certificate this CA signed.")
@click.option("--broker-tls/--no-broker-tls", default=False, show_default=True,
              help="Connect to the broker over TLS (a broker in tls_mode enforcing needs it).")
@click.option("--broker-tls-ca", metavar="PEM", help="CA file the broker's certificate is checked with "
              "[default: the system's].")
@click.option("--broker-tls-pin", is_flag=True, default=False,
              help="--broker-tls-ca is the broker's own certificate: trust exactly it, whatever names it carries.")
@click.option("--broker-tls-server-name", metavar="NAME", help="Name the broker's certificate must carry "
              "[default: the --broker host].")
@click.option("--broker-tls-verify/--no-broker-tls-verify", default=True, show_default=True,
              help="Check the broker's certificate (off: no server authentication; for tests).")
@click.option("--broker-tls-cert", metavar="PEM", help="Client certificate for a broker that requires one.")
@click.option("--broker-tls-key", metavar="PEM", help="Its private key.")
@click.option("--parent-pid", type=int, hidden=True, help="Stop when this process (the broker) is gone.")
def filtersrv_command(broker: str, listen: str, repository: str | None, repository_url: str | None, uploads: bool,
                      worker_cpu_seconds: float, worker_memory_mb: int, batch_deadline_ms: int, register_interval: float,
                      repository_check_interval: float, acl: str | None = None, tls_mode: str = "disabled",
                      tls_cert: str | None = None, tls_key: str | None = None, tls_client_ca: str | None = None,
                      broker_tls: bool = False, broker_tls_ca: str | None = None, broker_tls_pin: bool = False,
                      broker_tls_server_name: str | None = None, broker_tls_verify: bool = True,
                      broker_tls_cert: str | None = None, broker_tls_key: str | None = None,
                      parent_pid: int | None = None) -> None:
    """Run a filter server: runs consumers' filter classes (in sandboxed workers) on their broker's messages.

    With a broker that checks an ACL, the account the filter server signs with comes from the environment
    (SLUICE_FILTERSRV_ACCESS_KEY, SLUICE_FILTERSRV_SECRET_KEY), never from flags other users could read."""
    level = os.environ.get("SLUICE_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if worker_cpu_seconds <= 0 or batch_deadline_ms <= 0 or worker_memory_mb < 0 or register_interval <= 0 \
            or repository_check_interval <= 0:
        raise click.UsageError("limits and intervals must be positive (--worker-memory-mb 0: unlimited)")
    if repository is not None and not os.path.isdir(repository):
        raise click.UsageError(f"--repository {repository!r} is not a directory")
    limits = WorkerLimits(cpu_seconds=worker_cpu_seconds, memory_bytes=worker_memory_mb * 1024 * 1024,
                          deadline_s=batch_deadline_ms / 1000.0)
    ak, sk = os.environ.get(ACCESS_KEY_ENV, ""), os.environ.get(SECRET_KEY_ENV, "")
    if bool(ak) != bool(sk):
        raise click.UsageError(f"{ACCESS_KEY_ENV} and {SECRET_KEY_ENV} are set together or not at all")
    if repository_url is not None and not repository_url.startswith(("http://", "https://")):
        raise click.UsageError(f"--repository-url {repository_url!r} is not http:// or https://")
    client_tls = None
    if broker_tls:
        client_tls = ClientTls(ca=broker_tls_ca, server_name=broker_tls_server_name, verify=broker_tls_verify,
                               cert=broker_tls_cert, key=broker_tls_key, pinned=broker_tls_pin)
    elif broker_tls_ca or broker_tls_pin or broker_tls_server_name or broker_tls_cert or broker_tls_key:
        raise click.UsageError("--broker-tls-ca/-pin/-server-name/-cert/-key need --broker-tls")
    config = FiltersrvConfig(broker=broker, listen=listen, repository=repository, repository_url=repository_url,
                             uploads=uploads, limits=limits,
                             register_interval=register_interval, check_interval=repository_check_interval,
                             acl=acl, credentials=Credentials(ak, sk) if ak else None,
                             tls_mode=tls_mode, tls_cert=tls_cert, tls_key=tls_key, tls_client_ca=tls_client_ca,
                             broker_tls=client_tls)
    keep_freed_heap()  # this process's malloc: it handles a pull body per batch (filtersrv/heap.py)
    try:
        if client_tls is not None:
            client_tls.context()  # bad files fail the start, not every registration
        asyncio.run(run_filtersrv(config, parent_pid))
    except SluiceError as exc:
        raise click.ClickException(f"filter server failed: {exc}") from None
    except OSError as exc:
        raise click.ClickException(f"filter server failed: {exc}") from None
