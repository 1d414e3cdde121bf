"""accessKey / secretKey: format("sluice") reads and writes against a real broker started with --acl."""
from __future__ import annotations

import pytest
from servers import running_cluster, wait_for_route

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]

ACL = """\
accounts:
  - accessKey: sparkuser
    secretKey: spark-secret-1
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - Secure=PUB|SUB
"""


@pytest.fixture(scope="module")
def ns(tmp_path_factory):
    from sluice import Credentials, Message, Producer

    tmp = tmp_path_factory.mktemp("spark-acl")
    (tmp / "plain_acl.yml").write_text(ACL)
    with running_cluster(tmp, ("broker-a",), "--acl", str(tmp / "plain_acl.yml")) as c:
        with Producer("acl-seed", c.ns, credentials=Credentials("sparkuser", "spark-secret-1")) as p:
            for i in range(10):
                p.send(Message("Secure", f"s{i}".encode()))
        wait_for_route(c.ns, "Secure")
        yield c.ns


def _reader(spark, ns, **creds):
    r = spark.read.format("sluice").option("namesrv", ns).option("topic", "Secure")
    for k, v in creds.items():
        r = r.option(k, v)
    return r.load()


def test_reads_and_writes_with_credentials(spark, ns):
    creds = {"accessKey": "sparkuser", "secretKey": "spark-secret-1"}
    assert _reader(spark, ns, **creds).count() == 10
    df = spark.createDataFrame([(f"w{i}".encode(),) for i in range(5)], "value binary")
    w = df.write.format("sluice").option("namesrv", ns).option("topic", "Secure").mode("append")
    for k, v in creds.items():
        w = w.option(k, v)
    w.save()
    assert _reader(spark, ns, **creds).count() == 15


def test_without_or_with_wrong_credentials_fails(spark, ns):
    with pytest.raises(Exception, match="NoPermissionError"):
        _reader(spark, ns).count()
    with pytest.raises(Exception, match="NoPermissionError"):
        _reader(spark, ns, accessKey="sparkuser", secretKey="wrong-secret").count()
