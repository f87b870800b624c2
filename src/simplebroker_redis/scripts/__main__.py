"""``python -m simplebroker_redis.scripts``: load the Functions library, or print it.

The command is an operations tool (:mod:`simplebroker_redis.ops.functions`);
it keeps this name, under which it is documented. A module of its own:
``simplebroker_redis`` imports the package ``scripts`` before ``-m`` runs it,
and ``runpy`` warns when the module it runs is already imported.
"""

from simplebroker_redis.ops.functions import main

raise SystemExit(main())
