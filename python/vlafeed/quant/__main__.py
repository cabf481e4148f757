"""python -m vlafeed.quant: the quantizer's command line (also `vlafeed quantize`)."""
from vlafeed.quant.cli import main

raise SystemExit(main())
