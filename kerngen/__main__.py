from kerngen.cli import main

main()
