"""The broker's request table (broker/requests.py): every served code has one row, a handler and a permission."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sluice.broker
from sluice.broker.config import BrokerConfig
from sluice.broker.controller import BrokerController
from sluice.broker.requests import ROUTE_BY_CODE, ROUTES, Permission, Route
from sluice.broker.send import SendProcessor
from sluice.protocol.codes import RequestCode as R


@pytest.fixture
def controller(tmp_path: Path) -> BrokerController:
    return BrokerController(BrokerConfig.load(None, listen="127.0.0.1:0", store=str(tmp_path / "store")))


def test_registered_codes_are_exactly_the_rows(controller: BrokerController) -> None:
    dispatcher = controller.server.dispatcher
    registered = {int(c) for c in R if c in dispatcher}
    assert registered == set(ROUTE_BY_CODE)
    assert set(controller.routes) == set(ROUTE_BY_CODE)
    assert len(ROUTES) == len(ROUTE_BY_CODE)  # one row per code


def test_every_row_has_a_permission_and_a_handler() -> None:
    for route in ROUTES:
        assert isinstance(route.permission, Permission), route
        assert callable(getattr(route.processor, route.method)), route


def test_permissions_follow_rocketmq_plain_acl() -> None:
    perm = {R(code): route.permission for code, route in ROUTE_BY_CODE.items()}
    assert {c for c, p in perm.items() if p is Permission.PUBLISH} == {
        R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE, R.CONSUMER_SEND_MSG_BACK, R.END_TRANSACTION,
        # Replies are sends to the reply topic (4.x's validator leaves them unchecked; PUB is the send rule).
        R.SEND_REPLY_MESSAGE, R.SEND_REPLY_MESSAGE_V2}
    for code in (R.PULL_MESSAGE, R.QUERY_MESSAGE, R.HEART_BEAT, R.UNREGISTER_CLIENT, R.GET_CONSUMER_LIST_BY_GROUP,
                 R.UPDATE_CONSUMER_OFFSET):
        assert perm[code] is Permission.SUBSCRIBE, code
    for code in (R.UPDATE_AND_CREATE_TOPIC, R.DELETE_TOPIC_IN_BROKER, R.INVOKE_BROKER_TO_RESET_OFFSET,
                 R.PUT_FILTER_BACKFILL, R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, R.DELETE_SUBSCRIPTIONGROUP,
                 R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG):
        assert perm[code] is Permission.ADMIN, code


def test_a_row_naming_a_missing_handler_is_refused() -> None:
    with pytest.raises(TypeError, match="no handler"):
        Route(R.SEND_MESSAGE, Permission.PUBLISH, SendProcessor, "no_such_method")


def test_no_broker_module_imports_the_controller() -> None:
    """Processors get their collaborators; only the CLI (which runs a broker) may import the controller."""
    root = Path(sluice.broker.__file__).parent
    offenders = []
    for path in sorted(root.glob("*.py")):
        if path.name in ("controller.py", "cli.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "sluice.broker.controller":
                offenders.append(path.name)
            elif isinstance(node, ast.Import) and any(a.name == "sluice.broker.controller" for a in node.names):
                offenders.append(path.name)
    assert offenders == []


def test_the_sdk_needs_no_admin_permission() -> None:
    """Producers and consumers (sluice.client) send no request that the ACL would keep for admins."""
    import sluice.client

    used = set()
    handled = set()  # codes the SDK answers (``remoting.register(code, ...)``): the broker sends those to it
    for path in Path(sluice.client.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "RequestCode" and node.attr in R.__members__:
                used.add(R[node.attr])
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register" \
                    and node.args and isinstance(node.args[0], ast.Attribute) and node.args[0].attr in R.__members__:
                handled.add(R[node.args[0].attr])
    assert R.CONSUME_MESSAGE_DIRECTLY in handled
    used -= handled
    served = {c for c in used if int(c) in ROUTE_BY_CODE}
    assert R.SEND_MESSAGE in served and R.PULL_MESSAGE in served
    assert {c for c in served if ROUTE_BY_CODE[int(c)].permission is Permission.ADMIN} == set()
