from xlarun.cli import main

main()
