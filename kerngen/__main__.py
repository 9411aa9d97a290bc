from kerngen.cli.app import main

main()
