from vigil.app.cli import main

main()
