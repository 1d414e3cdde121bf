"""The ``sluice admin`` command group: ``main(argv, env) -> ExitStatus`` and how commands plug in.

A command family is one module (topics, cluster, consumers, messages,
deadletters, ...) listed in FAMILIES; each command is an ``async def`` taking an
:class:`AdminSession` first and returning a :class:`Result`::

    @admin_command("topicList", aliases=["topic-list"])
    async def topic_list(s: AdminSession) -> Result: ...

The decorator adds the common options (``-n/--namesrv``, ``--json``,
``--timeout``), opens the session, runs the command on a fresh event loop and
renders its result. Errors are turned into exit statuses in one place
(:func:`sluice.admin.status.exit_status_for`), here in :func:`main`.
"""
from __future__ import annotations

import asyncio
import functools
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Coroutine, Mapping, Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TextIO

import click

from sluice.acl.signature import Credentials
from sluice.admin.output import Result, render, write_json
from sluice.admin.session import AdminSession
from sluice.admin.status import ExitStatus, exit_status_for
from sluice.errors import SluiceError
from sluice.protocol.codes import ResponseCode
from sluice.transport.tls import ClientTls

__all__ = ["FAMILIES", "AdminEnv", "admin_command", "admin_group", "cli_command", "current_env", "main"]

#: Modules of sluice.admin that define commands; a new family is one module and one name here.
FAMILIES = ("topics", "cluster", "consumers", "messages", "deadletters", "explain", "backfill", "brokers", "queues",
            "subgroups", "trace")
#: Where the namesrv address comes from when -n is not given, in this order.
NAMESRV_ENV = ("SLUICE_NAMESRV", "NAMESRV_ADDR")
#: Where the ACL account comes from when --access-key / --secret-key are not given.
ACCESS_KEY_ENV, SECRET_KEY_ENV = "SLUICE_ACCESS_KEY", "SLUICE_SECRET_KEY"
#: Where TLS settings come from when --tls / --tls-ca are not given (SLUICE_TLS: 1/true/yes turns TLS on).
TLS_ENV, TLS_CA_ENV = "SLUICE_TLS", "SLUICE_TLS_CA"
#: A client certificate and key for servers that require one (mutual TLS).
TLS_CERT_ENV, TLS_KEY_ENV = "SLUICE_TLS_CERT", "SLUICE_TLS_KEY"
#: Per-request timeout in seconds (RocketMQ's admin default is 3 s as well).
DEFAULT_TIMEOUT = 3.0


@dataclass
class AdminEnv:
    """Everything a command may touch outside itself: injected so tests run commands in-process."""

    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    stdin: BinaryIO = field(default_factory=lambda: sys.stdin.buffer)
    namesrv: str | None = None
    json: bool = False
    timeout: float = DEFAULT_TIMEOUT
    traceback: bool = False
    access_key: str | None = None
    secret_key: str | None = None
    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def client_tls(self) -> ClientTls | None:
        """TLS to namesrvs and brokers: --tls / --tls-ca first, then SLUICE_TLS / SLUICE_TLS_CA; None: plain.
        A CA file or a client certificate alone turns TLS on (they are only used by TLS)."""
        ca = self.tls_ca or self.env.get(TLS_CA_ENV, "").strip() or None
        cert = self.tls_cert or self.env.get(TLS_CERT_ENV, "").strip() or None
        key = self.tls_key or self.env.get(TLS_KEY_ENV, "").strip() or None
        if bool(cert) != bool(key):
            raise click.UsageError(f"a TLS client certificate needs both --tls-cert and --tls-key (or {TLS_CERT_ENV} "
                                   f"and {TLS_KEY_ENV})")
        on = (self.tls or self.env.get(TLS_ENV, "").strip().lower() in ("1", "true", "yes", "on") or ca is not None
              or cert is not None)
        return ClientTls(ca=ca, cert=cert, key=key) if on else None

    def credentials(self) -> Credentials | None:
        """The ACL account to sign with: flags first, then SLUICE_ACCESS_KEY / SLUICE_SECRET_KEY; None for none."""
        ak = self.access_key or self.env.get(ACCESS_KEY_ENV, "").strip() or None
        sk = self.secret_key or self.env.get(SECRET_KEY_ENV, "").strip() or None
        if ak is None and sk is None:
            return None
        if ak is None or sk is None:
            raise click.UsageError("an ACL account needs both --access-key and --secret-key (or "
                                   f"{ACCESS_KEY_ENV} and {SECRET_KEY_ENV})")
        return Credentials(ak, sk)

    def namesrv_addr(self) -> str:
        if self.namesrv:
            return self.namesrv
        for name in NAMESRV_ENV:
            value = self.env.get(name, "").strip()
            if value:
                return value
        raise click.UsageError("no namesrv address: pass -n/--namesrv HOST:PORT or set SLUICE_NAMESRV "
                               "(or NAMESRV_ADDR)")


def current_env() -> AdminEnv:
    """The AdminEnv of the command running now (its injected streams and environment)."""
    return click.get_current_context().ensure_object(AdminEnv)


class AliasGroup(click.Group):
    """Commands answer to mqadmin's names and to aliases (kebab-case); help lists each command once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aliases: dict[str, str] = {}

    def add_alias(self, alias: str, name: str) -> None:
        if alias in self.commands or self.aliases.get(alias, name) != name:
            raise ValueError(f"admin command alias {alias!r} is already taken")
        self.aliases[alias] = name

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, self.aliases.get(cmd_name, cmd_name))

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                             list[str]]:
        _, cmd, rest = super().resolve_command(ctx, args)
        return (cmd.name if cmd else None), cmd, rest


def _set(attr: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    """Option callback storing a given value on the AdminEnv (group-level and command-level both work)."""
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is not None and value is not False:
            setattr(ctx.ensure_object(AdminEnv), attr, value)
    return callback


_COMMON = frozenset({"namesrv", "as_json", "timeout", "traceback", "access_key", "secret_key", "tls", "tls_ca",
                     "tls_cert", "tls_key"})


def common_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("-n", "--namesrv", metavar="HOST:PORT[;HOST:PORT]", expose_value=False, callback=_set("namesrv"),
                     help="Name server address(es) [env: SLUICE_NAMESRV, NAMESRV_ADDR]."),
        click.option("--json", "as_json", is_flag=True, default=None, expose_value=False, callback=_set("json"),
                     help="Print one JSON document instead of tables."),
        click.option("--timeout", type=click.FloatRange(min=0.1), expose_value=False, callback=_set("timeout"),
                     help=f"Seconds per request [default: {DEFAULT_TIMEOUT:g}]."),
        click.option("--traceback", is_flag=True, default=None, expose_value=False, callback=_set("traceback"),
                     help="Show the Python traceback of an error."),
        click.option("--access-key", metavar="AK", expose_value=False, callback=_set("access_key"),
                     help=f"ACL account to sign requests with [env: {ACCESS_KEY_ENV}]."),
        click.option("--secret-key", metavar="SK", expose_value=False, callback=_set("secret_key"),
                     help=f"The account's secret key [env: {SECRET_KEY_ENV}]."),
        click.option("--tls", is_flag=True, default=None, expose_value=False, callback=_set("tls"),
                     help=f"Connect over TLS (servers in tls_mode permissive or enforcing) [env: {TLS_ENV}=1]."),
        click.option("--tls-ca", metavar="PEM", expose_value=False, callback=_set("tls_ca"),
                     help=f"CA file the servers' certificates are checked with; implies --tls [env: {TLS_CA_ENV}]."),
        click.option("--tls-cert", metavar="PEM", expose_value=False, callback=_set("tls_cert"),
                     help=f"Client certificate for servers requiring one (mutual TLS) [env: {TLS_CERT_ENV}]."),
        click.option("--tls-key", metavar="PEM", expose_value=False, callback=_set("tls_key"),
                     help=f"The client certificate's key [env: {TLS_KEY_ENV}]."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


@click.group("admin", cls=AliasGroup, context_settings={"help_option_names": ["-h", "--help"]})
@common_options
def admin_group() -> None:
    """Administer a Sluice (or RocketMQ) cluster; commands are named as mqadmin's (kebab-case aliases too).

    Exit status: 0 ok, 1 error, 2 usage, 3 not found, 4 unavailable, 5 refused, 6 partial, 130 interrupted.
    """


AdminCommand = Callable[..., Coroutine[Any, Any, Result]]


def admin_command(name: str, *, aliases: Sequence[str] = ()) -> Callable[[AdminCommand], click.Command]:
    """Register ``async def cmd(session, **options) -> Result`` as ``sluice admin <name>``."""
    def decorate(fn: AdminCommand) -> click.Command:
        @functools.wraps(fn)
        def callback(**kwargs: Any) -> Result:
            env = click.get_current_context().ensure_object(AdminEnv)
            addr = env.namesrv_addr()
            credentials = env.credentials()
            tls = env.client_tls()

            async def run() -> Result:
                async with AdminSession(addr, timeout=env.timeout, credentials=credentials, tls=tls) as session:
                    return await fn(session, **kwargs)
            result = asyncio.run(run())
            render(result, env.stdout, env.stderr, env.env, as_json=env.json)
            return result

        cmd = click.command(name, context_settings={"help_option_names": ["-h", "--help"]},
                            epilog=f"Also: {', '.join(aliases)}." if aliases else None)(common_options(callback))
        # The command's own options first in its help, the common ones after.
        cmd.params = [p for p in cmd.params if p.name not in _COMMON] + [p for p in cmd.params if p.name in _COMMON]
        admin_group.add_command(cmd)
        for alias in aliases:
            admin_group.add_alias(alias, name)
        return cmd
    return decorate


def load_families() -> None:
    for fam in FAMILIES:
        importlib.import_module(f"sluice.admin.{fam}")


def _report(env: AdminEnv, exc: BaseException, status: ExitStatus) -> None:
    message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc) or type(exc).__name__
    if env.json:
        code = getattr(exc, "code", None)
        write_json(env.stderr, {"error": {"type": type(exc).__name__, "message": message,
                                          "code": int(code) if isinstance(code, int) else None,
                                          "exitStatus": int(status), "status": status.name}})
    else:
        code = getattr(exc, "code", None)
        where = (f" [{getattr(code, 'name', code)}]" if isinstance(exc, SluiceError) and code is not None
                 and code != ResponseCode.SYSTEM_ERROR else "")
        env.stderr.write(f"error: {message}{where}\n")
        for note in getattr(exc, "__notes__", ()):
            env.stderr.write(f"  {note}\n")
    if env.traceback:
        traceback.print_exception(exc, file=env.stderr)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, *,
         stdout: TextIO | None = None, stderr: TextIO | None = None, stdin: BinaryIO | None = None) -> ExitStatus:
    """Run ``sluice admin <argv...>`` in-process and return its exit status (never calls sys.exit)."""
    load_families()
    obj = AdminEnv(env=dict(os.environ) if env is None else dict(env), stdout=stdout or sys.stdout,
                   stderr=stderr or sys.stderr, stdin=stdin or sys.stdin.buffer)
    args = list(sys.argv[1:] if argv is None else argv)
    with redirect_stdout(obj.stdout), redirect_stderr(obj.stderr):  # click's help and usage text included
        try:
            rv = admin_group.main(args=args, prog_name="sluice admin", standalone_mode=False, obj=obj)
        except click.exceptions.NoArgsIsHelpError as exc:
            obj.stdout.write(exc.ctx.get_help() + "\n")
            return ExitStatus.USAGE
        except click.UsageError as exc:
            if exc.ctx is not None and not obj.json:
                obj.stderr.write(f"{exc.ctx.get_usage()}\nTry '{exc.ctx.command_path} -h' for help.\n\n")
            _report(obj, exc, ExitStatus.USAGE)
            return ExitStatus.USAGE
        except BaseException as exc:  # noqa: BLE001 - the one place errors become exit statuses
            if isinstance(exc, (SystemExit, GeneratorExit)):
                raise
            status = exit_status_for(exc)
            if status is ExitStatus.INTERRUPTED:
                obj.stderr.write("interrupted\n")
            else:
                if not isinstance(exc, (SluiceError, click.ClickException)):
                    exc.add_note("sluice: an unexpected error (a bug); --traceback shows where")
                _report(obj, exc, status)
            return status
    if isinstance(rv, Result):
        return rv.status
    return ExitStatus(rv) if isinstance(rv, int) and rv in ExitStatus._value2member_map_ else ExitStatus.SUCCESS


@click.command("admin", add_help_option=False,
               context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def cli_command(argv: tuple[str, ...]) -> None:
    """Administer a cluster: topics, brokers, consumer progress, messages, dead letters (mqadmin's commands)."""
    sys.exit(int(main(list(argv))))
