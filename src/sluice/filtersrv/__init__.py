"""The filter server (``sluice filtersrv``): RocketMQ's class-filter mode, with the classes sandboxed.

``server.py`` serves consumers (302 class registration, class-filter pulls) and
registers with its broker (301); ``registry.py`` keeps the classes by
topic@group; ``repository.py`` reads them from the operator's directory;
``sandbox.py`` runs each in a worker subprocess (``worker.py``) under limits;
``cli.py`` is the command. See docs/filtering.md ("Filter server").
"""
