"""What a newcomer sees when the namesrv runs but no broker is registered with it (none started, or one started
without this --namesrv): a send names that cause, not only the auto-create setting."""
from __future__ import annotations

import pytest
from servers import SluiceProcess

from sluice import Message, Producer
from sluice.errors import TopicNotExistError


@pytest.mark.integration
def test_a_send_with_no_broker_registered_says_so(tmp_path):
    namesrv = SluiceProcess.start(["namesrv"], tmp_path, name="namesrv")
    try:
        with Producer("NoBrokerProducer", namesrv.addr) as producer:
            with pytest.raises(TopicNotExistError) as info:
                producer.send(Message("Orders", b"x"), timeout=3.0)
        msg = str(info.value)
        assert "no route for topic 'Orders'" in msg
        assert f"no broker is registered with the namesrv {namesrv.addr}" in msg, msg
    finally:
        namesrv.stop()
