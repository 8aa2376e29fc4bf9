-- hostile: claims, evidence and narration carrying terminal escapes (clear screen, window title)
-- expect: PASS h1 "c^[[2J": TRUE, as the lesson expects (a claim beyond the bank: the lesson's own) -- measured: ^[]0;pwned^G
-- expect: ^[[31mred
-- expect-status: 0
lab.lesson{title = "hostile", claims = {"h1"}}
print("\27[31mred\27[0m \194\155 C1 CSI")
lab.check{id = "h1", claim = "c\27[2J", expected = true, verdict = true, evidence = "\27]0;pwned\7"}
