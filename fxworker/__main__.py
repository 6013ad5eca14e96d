from fxworker.cli import main

main()
