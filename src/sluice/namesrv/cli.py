"""``sluice namesrv``: run a name server until SIGTERM/SIGINT."""
from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path
from typing import Any

import click

from sluice.errors import SluiceError
from sluice.logsetup import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES, LEVELS, configure_logging
from sluice.namesrv.server import NamesrvConfig, run_namesrv

_CONFIG_KEYS = {"listen": str, "scan_interval": float, "broker_expiry": float, "max_frame_size": int, "log_level": str,
                "frame_budget": int, "max_connections": int, "idle_timeout": float, "kv_max_entries": int,
                "kv_max_key_bytes": int, "kv_max_value_bytes": int,
                "acl": str, "tls_mode": str, "tls_cert": str, "tls_key": str,
                "tls_client_ca": str, "metrics_listen": str, "log_dir": str, "log_max_bytes": int,
                "log_backups": int}


def load_config_file(path: Path) -> dict[str, Any]:
    """Read a TOML file (top level or a ``[namesrv]`` table); unknown keys are an error, not ignored. A relative
    ``acl`` (or TLS file) path is resolved against the file's folder."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", param_hint="--config") from None
    data = data.get("namesrv", data)
    out: dict[str, Any] = {}
    for key, value in data.items():
        key = key.replace("-", "_")
        if key not in _CONFIG_KEYS:
            raise click.BadParameter(f"{path}: unknown setting {key!r} (known: {', '.join(_CONFIG_KEYS)})",
                                     param_hint="--config")
        try:
            out[key] = _CONFIG_KEYS[key](value)
        except (TypeError, ValueError):
            raise click.BadParameter(f"{path}: {key} = {value!r} is not a valid {_CONFIG_KEYS[key].__name__}",
                                     param_hint="--config") from None
    for key in ("acl", "tls_cert", "tls_key", "tls_client_ca", "log_dir"):  # a file beside the config, not in the cwd
        if out.get(key) and not Path(out[key]).is_absolute():
            out[key] = str(path.absolute().parent / out[key])
    return out


@click.command("namesrv")
@click.option("--listen", metavar="HOST:PORT", help="Address to listen on [default: 127.0.0.1:9876].")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="TOML file with any of the settings below (snake_case), log_max_bytes, log_backups; flags win.")
@click.option("--scan-interval", type=float, help="Seconds between scans for silent brokers [default: 5].")
@click.option("--broker-expiry", type=float, help="Seconds without registration before a broker is dropped [default: 120].")
@click.option("--max-frame-size", type=int, help="Largest accepted frame in bytes [default: 16 MiB].")
@click.option("--frame-budget", type=int, help="Bytes of big frames received at once, all connections [default: 64 MiB].")
@click.option("--max-connections", type=int, help="Connections kept at once; more are closed at accept [default: 4096].")
@click.option("--idle-timeout", type=float, help="Seconds without a frame before a connection is closed; 0 = never [default: 120].")
@click.option("--acl", metavar="FILE", help="RocketMQ plain_acl.yml: writes need an admin account or a white address.")
@click.option("--tls-mode", type=click.Choice(["disabled", "permissive", "enforcing"], case_sensitive=False),
              help="TLS: plain only, both on one port, or TLS only (docs/security.md) [default: disabled].")
@click.option("--tls-cert", metavar="PEM", help="The server's certificate chain (for permissive and enforcing).")
@click.option("--tls-key", metavar="PEM", help="The certificate's private key.")
@click.option("--tls-client-ca", metavar="PEM", help="Mutual TLS: TLS clients need a certificate this CA signed.")
@click.option("--metrics-listen", metavar="HOST:PORT", help="Serve Prometheus metrics at http://HOST:PORT/metrics.")
@click.option("--log-level", type=click.Choice(list(LEVELS), case_sensitive=False))
@click.option("--log-dir", metavar="DIR",
              help="Also log to DIR/namesrv.log, rotated by size (log_max_bytes, log_backups).")
def namesrv_command(config_path: Path | None, log_level: str | None, log_dir: str | None, **flags: Any) -> None:
    """Run a name server: brokers register here, clients ask it for topic routes."""
    settings = load_config_file(config_path) if config_path else {}
    settings.update({k: v for k, v in flags.items() if v is not None})
    level = log_level or settings.pop("log_level", None) or "INFO"
    settings.pop("log_level", None)
    log_dir = log_dir or settings.pop("log_dir", None)
    settings.pop("log_dir", None)
    max_bytes = settings.pop("log_max_bytes", DEFAULT_MAX_BYTES)
    backups = settings.pop("log_backups", DEFAULT_BACKUPS)
    try:
        configure_logging(level, name="namesrv", log_dir=log_dir, max_bytes=max_bytes, backups=backups)
        config = NamesrvConfig(**settings)
    except SluiceError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        asyncio.run(run_namesrv(config))
    except SluiceError as exc:  # e.g. an ACL file that cannot be used
        raise click.ClickException(f"namesrv failed: {exc}") from None
    except OSError as exc:  # typically the port is taken
        raise click.ClickException(f"cannot listen on {config.listen}: {exc}") from None
