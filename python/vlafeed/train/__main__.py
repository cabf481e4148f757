"""python -m vlafeed.train --config CONFIG.yaml [--section.key value ...]"""
import sys

from vlafeed.train.runner import main

sys.exit(main())
