"""``sluice admin``: mqadmin's commands for a Sluice (or RocketMQ 4.x) cluster.

``main(argv, env) -> ExitStatus`` runs a command in-process (tests, scripts);
``cli_command`` is what ``sluice admin`` dispatches to. See docs/admin.md.
"""
from sluice.admin.core import FAMILIES, AdminEnv, admin_command, admin_group, cli_command, main
from sluice.admin.output import Result
from sluice.admin.session import AdminSession
from sluice.admin.status import ExitStatus, exit_status_for

__all__ = ["FAMILIES", "AdminEnv", "AdminSession", "ExitStatus", "Result", "admin_command", "admin_group",
           "cli_command", "exit_status_for", "main"]
