"""``python -m simplebroker_redis.scripts``: load the Functions library, or print it.

A module of its own: ``simplebroker_redis`` imports the package ``scripts``
before ``-m`` runs it, and ``runpy`` warns when the module it runs is
already imported.
"""

from simplebroker_redis.scripts import main

raise SystemExit(main())
