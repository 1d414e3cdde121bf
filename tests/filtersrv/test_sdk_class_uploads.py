"""Filter classes uploaded by consumers (filter_class_uploads = true): the consumer's source is used, and a
changed source (a new CRC) replaces the class; a changed repository file is reloaded too."""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from sdk_class_support import Cluster, EVEN_SOURCE, ODD_SOURCE, class_cluster, pull_numbers_sync, send_numbered

from sluice import MessageSelector

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

N = 40
_names = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with class_cluster(tmp_path_factory.mktemp("uploads"), uploads=True) as c:
        yield c


@pytest.fixture
def topic(cluster: Cluster) -> str:
    t = f"UP{next(_names)}"
    send_numbered(cluster.ns, t, 0, N)
    return t


def test_an_uploaded_class_is_used_and_a_changed_one_replaces_it(cluster: Cluster, topic: str):
    group = f"up_{topic}"
    got = pull_numbers_sync(cluster.ns, group, topic, MessageSelector.by_class("uploaded:Parity", EVEN_SOURCE
                                                                             .replace("Even", "Parity")))
    assert sorted(got) == [i for i in range(N) if i % 2 == 0]
    # the same class name with another source: a new CRC, the class is replaced for the group
    got = pull_numbers_sync(cluster.ns, group, topic, MessageSelector.by_class("uploaded:Parity", ODD_SOURCE
                                                                             .replace("Odd", "Parity")))
    assert sorted(got) == [i for i in range(N) if i % 2 == 1]


def test_repository_classes_still_serve_with_uploads_on(cluster: Cluster, topic: str):
    got = pull_numbers_sync(cluster.ns, f"repo_{topic}", topic, MessageSelector.by_class("thirds:Third"))
    assert sorted(got) == [i for i in range(N) if i % 3 == 0]
