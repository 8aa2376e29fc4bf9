-- hostile: one string.find call that backtracks for hours never reaches the hook
-- expect: time limit of 1 s CPU exceeded (--time-limit) inside a call the time check cannot enter
lab.lesson{title = "hostile", claims = {"h1"}}
string.find(string.rep("a", 60), string.rep("a-", 30) .. "b")
