from dblockrun.cli import main

main()
