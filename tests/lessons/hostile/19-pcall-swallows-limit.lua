-- hostile: a loop that catches the time limit's error and carries on
-- expect: time limit of 1 s CPU exceeded
lab.lesson{title = "hostile", claims = {"h1"}}
while true do pcall(function() while true do end end) end
