"""The column-wise batch send path: precise errors, inherited header properties, per-message identity."""
from __future__ import annotations

from broker_support import bodies, records
from sluice.protocol import properties as P
from sluice.protocol.codes import ResponseCode

R = ResponseCode


def test_empty_member_body_named_and_nothing_stored(rpc):
    ack = rpc.send_batch("Cols", [(b"a", {}, 0), (b"", {}, 0), (b"c", {}, 0)])
    assert ack.code == R.MESSAGE_ILLEGAL and "message 1 of the batch has an empty body" in ack.remark
    assert rpc.pull("Cols").code != R.SUCCESS  # the good members were not stored either


def test_header_properties_inherited_except_identity(rpc):
    header_props = P.encode_properties({"WAIT": "false", "region": "eu", P.TAGS: "HdrTag", P.KEYS: "hk",
                                        P.UNIQ_KEY: "HDRUNIQ"})
    entries = [(b"m0", {P.TAGS: "T0", "region": "us"}, 3), (b"m1", {P.KEYS: "k1"}, 0)]
    ack = rpc.send_batch("Inherit", entries, properties=header_props)
    assert ack.code == R.SUCCESS, ack.remark
    resp = rpc.pull("Inherit")
    assert bodies(resp) == [b"m0", b"m1"]
    recs = records(resp)
    p0, p1 = (P.decode_properties(r.properties) for r in recs)
    assert p0 == {"WAIT": "false", "region": "us", P.TAGS: "T0"}  # the message's own value wins
    assert p1 == {"WAIT": "false", "region": "eu", P.KEYS: "k1"}  # no header TAGS/KEYS/UNIQ_KEY
    assert [r.flag for r in recs] == [3, 0]
