from posbench.cli import main

main()
