from xlarun.cli.command import main

main()
