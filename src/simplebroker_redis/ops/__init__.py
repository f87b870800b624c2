"""The operations tools: what an operator runs beside the workers, above the core.

- :mod:`.metrics`: the Prometheus exporter (``python -m simplebroker_redis.metrics``);
- :mod:`.dashboard`: the live web dashboard (``python -m simplebroker_redis.dashboard``);
- :mod:`.functions`: loads the Functions library onto a server as an
  administrator (``python -m simplebroker_redis.scripts load URL``);
- :mod:`.cli`: the command line the exporter and the dashboard share;
- :mod:`.observe`: one reading of a whole namespace;
- :mod:`.task_summary`: task statistics read back as series and tables.

Nothing in the core or in an integration imports this package
(``tests/test_layers.py``); the ``python -m`` commands keep their documented
names through thin modules at the package's top level.
"""
