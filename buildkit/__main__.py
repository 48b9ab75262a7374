from buildkit.cli import main

main()
