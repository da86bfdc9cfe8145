from app.serve import main

raise SystemExit(main())
