from posbench.cli import main

raise SystemExit(main())
