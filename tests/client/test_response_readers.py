"""The header readers process_pull_response and parse_send_response call directly (fields.keyed_reader) against
from_command, the general road: the same header, or the same error, for any extFields."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.client import encoding, pull_consumer
from sluice.protocol import headers as H
from sluice.protocol.command import RemotingCommand


@given(st.dictionaries(st.sampled_from(["suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset", "x"]),
                       st.one_of(st.integers(-5, 2**64).map(str), st.text(max_size=4))))
def test_response_header_readers_equal_from_command(ext: dict[str, str]) -> None:
    """The readers process_pull_response and parse_send_response call directly against from_command (the
    general road): the same header, or the same error."""
    send_ext = {{"suggestWhichBrokerId": "msgId", "nextBeginOffset": "queueId", "minOffset": "queueOffset",
                 "maxOffset": "transactionId"}.get(k, k): v for k, v in ext.items()}
    for reader, cls, fields_ in ((pull_consumer._read_pull_response, H.PullMessageResponseHeader, ext),
                                 (encoding._read_send_response, H.SendMessageResponseHeader, send_ext)):
        cmd = RemotingCommand(code=0, ext_fields=fields_)
        try:
            want: object = cls.from_command(cmd)
        except Exception as exc:
            want = (type(exc), str(exc))
        try:
            got: object = reader(fields_)
        except Exception as exc:
            got = (type(exc), str(exc))
        assert got == want
