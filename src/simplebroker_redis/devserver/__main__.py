"""``python -m simplebroker_redis.devserver``: run one server in the foreground."""

import sys

from simplebroker_redis.devserver._server import main

sys.exit(main())
