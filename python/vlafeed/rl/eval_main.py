"""python -m vlafeed.rl.eval_main: the command line of vlafeed.rl.evaluation (also `vlafeed eval`).

A module of its own so that `-m` does not run a module the package has already imported."""
from vlafeed.rl.evaluation import main

raise SystemExit(main())
