"""SEND_MESSAGE_V2's letters read in place (SendMessageRequestHeader.from_v2_ext's keyed reader) against the
same ext renamed to full names and read by from_ext (the road every other ext takes)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import SluiceError
from sluice.protocol import headers as H
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand

_TEXT = st.sampled_from(["PG", "T", "", "TBW102", " x ", "broker-a", "a\x01b\x02"])
_INT = st.sampled_from(["0", "1", "7", "007", "-1", "2147483648", "9" * 18, "9" * 19, "1.0", " 3", "x", "", "٣"])
_BOOL = st.sampled_from(["true", "false", "True", "TRUE", "1", "0", "", " true", "yes"])
_VALUE = {**dict.fromkeys("abcin", _TEXT), **dict.fromkeys("defghjl", _INT), **dict.fromkeys("km", _BOOL)}
_COMMON = {"a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0", "i": "k\x01v\x02",
           "j": "0", "k": "false", "m": "false", "n": "broker-a"}



@st.composite
def _ext(draw) -> dict:
    """Mostly the common V2 ext with a few letters changed, dropped or given odd values; sometimes another key."""
    ext = dict(_COMMON)
    for letter in draw(st.lists(st.sampled_from(sorted(_VALUE)), max_size=3)):
        if draw(st.booleans()):
            ext[letter] = draw(_VALUE[letter])
        else:
            ext.pop(letter, None)
    extra = draw(st.sampled_from([None, None, None, "producerGroup", "topic", "AccessKey", "z"]))
    if extra is not None:
        ext[extra] = draw(_TEXT)
    return ext


def _typed(ext: dict) -> H.SendMessageRequestHeader | SluiceError:
    """from_command's rule through the renaming road: an ext of letters (no producerGroup) renamed to full names,
    then from_ext; any other ext read as is."""
    try:
        if "producerGroup" not in ext and "a" in ext:
            return H.SendMessageRequestHeader.from_ext(H.to_v1_names(ext))
        return H.SendMessageRequestHeader.from_ext(ext)
    except SluiceError as exc:
        return exc


def _v2_header(ext: dict) -> H.SendMessageRequestHeader | SluiceError:
    """What a SEND_MESSAGE_V2 request's header is read as (from_command: the keyed reader when the ext holds
    letters only)."""
    try:
        return H.SendMessageRequestHeader.from_command(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext))
    except SluiceError as exc:
        return exc


@settings(max_examples=500, deadline=None)
@given(_ext())
def test_the_direct_read_is_the_typed_header_or_leaves_it_to_it(ext: dict):
    """The request's header is the renaming road's, or the same error naming the same field; it never accepts
    an ext that road refuses."""
    want = _typed(ext)
    got = _v2_header(ext)
    if isinstance(want, SluiceError):
        assert isinstance(got, SluiceError) and str(got) == str(want)
    else:
        assert got == want


def test_the_common_v2_send_is_read_directly():
    assert _v2_header(dict(_COMMON)) == _typed(_COMMON)
    sparse = {"a": "PG", "b": "T", "e": "3"}  # every other field at its default
    assert _v2_header(sparse) == _typed(sparse) == H.SendMessageRequestHeader(producer_group="PG", topic="T",
                                                                                  queue_id=3)


@pytest.mark.parametrize("change", [{"e": "-1"}, {"k": "TRUE"}, {"producerGroup": "PG"}, {"AccessKey": "ak"},
                                    {"g": "9" * 19}, {"d": " 4"}])
def test_other_shapes_are_read_as_the_typed_header_reads_them(change: dict):
    got, want = _v2_header({**_COMMON, **change}), _typed({**_COMMON, **change})
    assert got == want if not isinstance(want, SluiceError) else str(got) == str(want)
