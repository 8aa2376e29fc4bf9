-- hostile: the same backtracking inside gsub with a function replacement
-- expect: time limit of 1 s CPU exceeded
lab.lesson{title = "hostile", claims = {"h1"}}
string.gsub(string.rep("a", 60), string.rep("a-", 30) .. "b", function() return "" end)
