"""tls / tlsCa / tlsServerName / tlsVerify / tlsCert / tlsKey: format("sluice") reads and writes against a real
namesrv and broker in tls_mode enforcing (which refuse plain connections), and bad TLS options fail in one line."""
from __future__ import annotations

import pytest
from servers import running_cluster, wait_for_route
from tls_certs import Certs

from sluice.errors import InvalidParameterError
from sluice.spark.options import Options, tls_options

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return Certs(tmp_path_factory.mktemp("spark-tls-certs"))


@pytest.fixture(scope="module")
def ns(tmp_path_factory, certs):
    from sluice import Message, Producer

    tmp = tmp_path_factory.mktemp("spark-tls")
    with running_cluster(tmp, ("broker-a",), *certs.server_args("enforcing"), "--namesrv-tls", "--namesrv-tls-ca",
                         certs.ca_file, namesrv_extra=certs.server_args("enforcing"), client_tls=certs.client()) as c:
        with Producer("tls-seed", c.ns, tls=True, tls_ca=certs.ca_file) as p:
            for i in range(10):
                p.send(Message("Sealed", f"s{i}".encode()))
        wait_for_route(c.ns, "Sealed", tls=certs.client())
        yield c.ns


def _with(rw, options: dict[str, str]):
    for k, v in options.items():
        rw = rw.option(k, v)
    return rw


def _reader(spark, ns, **tls):
    return _with(spark.read.format("sluice").option("namesrv", ns).option("topic", "Sealed"), tls).load()


def test_reads_and_writes_over_tls(spark, ns, certs):
    tls = {"tls": "true", "tlsCa": certs.ca_file, "tlsServerName": "localhost"}
    rows = _reader(spark, ns, **tls).collect()
    assert sorted(bytes(r.body) for r in rows) == sorted(f"s{i}".encode() for i in range(10))
    df = spark.createDataFrame([(f"w{i}".encode(),) for i in range(5)], "value binary")
    _with(df.write.format("sluice").option("namesrv", ns).option("topic", "Sealed").mode("append"), tls).save()
    got = sorted(bytes(r.body) for r in _reader(spark, ns, **tls).collect())
    assert got == sorted([f"s{i}".encode() for i in range(10)] + [f"w{i}".encode() for i in range(5)])


def test_plain_or_unverifiable_tls_fails(spark, ns, certs, tmp_path):
    with pytest.raises(Exception, match="(?i)connect|closed|timed out|unavailable"):
        _reader(spark, ns).count()  # plain TCP: the enforcing namesrv closes the connection
    other = Certs(tmp_path)  # a CA that did not sign the servers' certificates
    with pytest.raises(Exception, match="(?i)certificate|connect|closed"):
        _reader(spark, ns, tls="true", tlsCa=other.ca_file).count()


def test_tls_options_unit(certs):
    assert tls_options({}) == {}
    assert tls_options({"tls": "false"}) == {}
    got = tls_options({"tls": "TRUE", "tlsCa": certs.ca_file, "tlsVerify": "false"})
    assert got["tls"] is True and got["tls_ca"] == certs.ca_file and got["tls_verify"] is False
    cert, key = certs.client_files("spark-1")
    assert tls_options({"tls": "true", "tlsCert": cert, "tlsKey": key})["tls_cert"] == cert
    assert Options({"namesrv": "127.0.0.1:9876", "topic": "T", "tls": "true"}).tls["tls"] is True
    for bad, says in [({"tlsCa": certs.ca_file}, "need tls=true"), ({"tls": "yes"}, "true or false"),
                      ({"tls": "true", "tlsCert": cert}, "both tlsCert and tlsKey"),
                      ({"tls": "true", "tlsCa": "/no/such/ca.pem"}, "cannot read TLS CA file"),
                      ({"tls": "true", "tlsVerify": "maybe"}, "true or false")]:
        with pytest.raises(InvalidParameterError, match=says):
            tls_options(bad)
