"""RocketMQ 4.x plain ACL: request signatures (``signature``), the signing client (``signing``), the
``plain_acl.yml`` policy and its decisions (``policy``), the servers' guard with reload and refusal log
(``guard``).

This package sits beside the store and the filters: it uses the codec and the transport only, so the SDK
(signing) and the servers (verifying) share it without the SDK loading a server.
"""
