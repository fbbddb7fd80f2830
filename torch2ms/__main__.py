from torch2ms.cli import main

main()
