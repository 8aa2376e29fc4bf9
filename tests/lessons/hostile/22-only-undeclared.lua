-- hostile: --only of a claim the lesson does not declare once exited 0 with '0 passed, 0 failed'
-- args: --only nosuch
-- expect: --only nosuch: this lesson does not declare that claim (it declares: h1)
lab.lesson{title = "hostile", claims = {"h1"}}
lab.check{id = "h1", claim = "c", expected = true, verdict = true, evidence = "e"}
