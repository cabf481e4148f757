"""python -m vlafeed.rl: the command line of vlafeed.rl (also `vlafeed rl`)."""
from vlafeed.rl.run import main

raise SystemExit(main())
