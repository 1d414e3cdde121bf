"""`sluice store check` and the saved store layout."""
from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from store_testlib import msg, simulate_crash, small_config
from sluice.cli import main
from sluice.errors import StoreError
from sluice.store import MessageStore


def make(store_dir: Path, n: int = 10) -> list:
    with MessageStore(store_dir, small_config()) as s:
        return [s.put_message(msg(body=b"payload-%d" % i, KEYS=f"k{i}")) for i in range(n)]


def check(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["store", "check", *args])
    return r.exit_code, r.output


def test_check_clean_store(store_dir: Path) -> None:
    make(store_dir)
    code, out = check(str(store_dir))
    assert code == 0 and "10 records, 10 consume-queue units: ok" in out
    code, out = check("--json", str(store_dir))
    assert code == 0 and orjson.loads(out)["ok"] is True


def test_check_reports_a_flipped_byte_with_file_and_offset(store_dir: Path) -> None:
    res = make(store_dir)
    seg = store_dir / "commitlog" / ("0" * 20)
    with open(seg, "r+b") as f:
        f.seek(res[4].commitlog_offset + 88 + 3)
        f.write(b"#")
    code, out = check("--json", str(store_dir))
    rep = orjson.loads(out)
    assert code == 1 and rep["records"] == 9
    assert rep["problems"] == [{"path": str(seg), "offset": res[4].commitlog_offset, "message": "body CRC mismatch"}]


def test_check_refuses_an_unclean_store_without_fix(store_dir: Path) -> None:
    s = MessageStore(store_dir, small_config()).start()
    r = s.put_message(msg())
    simulate_crash(s)
    with open(store_dir / "commitlog" / ("0" * 20), "r+b") as f:
        f.seek(r.commitlog_offset + r.size)
        f.write(b"\x00\x00\x01\x00\xda\xa3\x20\xa7torn")
    code, out = check(str(store_dir))
    assert code == 2 and "--fix" in out
    code, out = check("--json", "--fix", str(store_dir))
    rep = orjson.loads(out)
    assert code == 0 and rep["recovery"]["cut_bytes"] == 12 and rep["records"] == 1
    assert check(str(store_dir))[0] == 0


def test_check_without_a_store(tmp_path: Path) -> None:
    code, out = check(str(tmp_path))
    assert code == 2 and "no store" in out


def test_layout_mismatch_is_refused(store_dir: Path) -> None:
    make(store_dir, 1)
    with pytest.raises(StoreError, match="commitlog_file_size=1048576 \\(config says 2097152\\)"):
        MessageStore(store_dir, small_config(commitlog_file_size=2 << 20)).start()
    with MessageStore(store_dir, small_config()) as s:  # the refused open left the store usable
        assert s.get_max_offset("T", 0) == 1
