"""Helpers of the SDK-side end-to-end class-filter tests (test_sdk_*.py, test_e2e_*.py): a real namesrv and
broker whose config starts filter servers over a class repository, and consumers' exact delivered sets.
(A uniquely named module: conftest.py names clash across test folders.)"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from servers import Cluster, running_cluster, wait_for, wait_for_route  # noqa: F401 (re-exported)

from sluice import AsyncPullConsumer, Message, MessageSelector, Producer, PullStatus
from sluice.admin import main as admin_main
from sluice.errors import SluiceError
from sluice.namesrv.client import SyncNamesrvClient

#: The repository's modules: good classes and one of each way a class can fail.
REPOSITORY = {
    "evens.py": "from sluice.filter import MessageFilter\n\n\nclass Even(MessageFilter):\n"
                "    def match(self, message):\n        return int(message.properties['n']) % 2 == 0\n",
    "odds.py": "from sluice.filter import MessageFilter\n\n\nclass Odd(MessageFilter):\n"
               "    def match(self, message):\n        return int(message.properties['n']) % 2 == 1\n",
    "thirds.py": "from sluice.filter import MessageFilter\n\n\nclass Third(MessageFilter):\n"
                 "    def match(self, message):\n        return int(message.properties['n']) % 3 == 0\n",
    "broken.py": "import no_such_module_for_sluice_tests\n",
    "raises.py": "from sluice.filter import MessageFilter\n\n\nclass Raises(MessageFilter):\n"
                 "    def match(self, message):\n        return 1 // 0 == 0\n",
    "hangs.py": "from sluice.filter import MessageFilter\n\n\nclass Hangs(MessageFilter):\n"
                "    def match(self, message):\n        while True:\n            pass\n",
    "hog.py": "from sluice.filter import MessageFilter\n\n\nclass Hog(MessageFilter):\n"
              "    def match(self, message):\n        self.keep = bytearray(8 * 1024 ** 3)\n        return True\n",
}

ODD_SOURCE = REPOSITORY["odds.py"]
EVEN_SOURCE = REPOSITORY["evens.py"]


def write_repository(root: Path) -> Path:
    repo = root / "classes"
    repo.mkdir(exist_ok=True)
    for name, text in REPOSITORY.items():
        (repo / name).write_text(text)
    return repo


def config(repo: Path, *, uploads: bool = False, nums: int = 1, extra: str = "") -> str:
    return (f'filter_server_nums = {nums}\nfilter_class_repository = "{repo}"\n'
            f"filter_class_uploads = {'true' if uploads else 'false'}\n{extra}")


def filter_servers(ns: str, topic: str = "TBW102") -> list[str]:
    with SyncNamesrvClient(ns) as nsc:
        try:
            table = nsc.get_route(topic).filter_server_table
        except SluiceError:
            return []
    return sorted(a for addrs in table.values() for a in addrs)


def wait_for_filter_servers(ns: str, n: int = 1, topic: str = "TBW102", timeout: float = 60.0,
                            avoid: set[str] | None = None) -> list[str]:
    """The filter servers the namesrv routes ``topic`` with, once there are ``n`` (not in ``avoid``)."""
    def ready() -> list[str] | None:
        got = [a for a in filter_servers(ns, topic) if a not in (avoid or set())]
        return got if len(got) >= n else None
    return wait_for(ready, timeout, f"{n} filter server(s) in the route of {topic}", interval=0.2)


@contextmanager
def class_cluster(tmp: Path, *, uploads: bool = False, nums: int = 1, extra: str = "") -> Iterator[Cluster]:
    repo = write_repository(tmp)
    with running_cluster(tmp, ("broker-a",), config=config(repo, uploads=uploads, nums=nums, extra=extra)) as c:
        wait_for_filter_servers(c.ns, nums)
        yield c


def send_numbered(ns: str, topic: str, start: int, n: int) -> None:
    """Messages with property n = start .. start+n-1, spread over the topic's queues (waits for the route)."""
    with Producer(f"p_{topic}", namesrv=ns) as p:
        for i in range(start, start + n):
            p.send(Message(topic, f"m{i}".encode(), properties={"n": str(i)}))
    wait_for_route(ns, topic)


async def pull_numbers(ns: str, group: str, topic: str, sel: MessageSelector, *,
                       commit: bool = False) -> list[int]:
    """Every ``n`` the group gets pulling each queue from 0 to its end (FilterClassError raised as is)."""
    async with AsyncPullConsumer(group, namesrv=ns, pull_timeout=30.0) as c:
        out: list[int] = []
        for mq in await c.fetch_message_queues(topic):
            end, off = await c.max_offset(mq), 0
            deadline = time.monotonic() + 60
            while off < end and time.monotonic() < deadline:
                r = await c.pull(mq, sel, off, 32)
                if r.status is PullStatus.FOUND:
                    out += [int(m.properties["n"]) for m in r.msg_found_list]
                elif r.status is PullStatus.NO_NEW_MSG:
                    break
                off = r.next_begin_offset
            if commit:
                c.update_consumer_offset(mq, off)
        if commit:
            await c.commit()
        return out


def pull_numbers_sync(ns: str, group: str, topic: str, sel: MessageSelector) -> list[int]:
    return asyncio.run(pull_numbers(ns, group, topic, sel))


def admin(ns: str, *argv: str) -> tuple[int, str, str]:
    import io
    out, err = io.StringIO(), io.StringIO()
    status = admin_main([*argv, "-n", ns], {}, stdout=out, stderr=err, stdin=io.BytesIO(b""))
    return int(status), out.getvalue(), err.getvalue()
