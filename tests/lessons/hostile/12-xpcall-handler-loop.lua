-- hostile: the time limit's error runs an xpcall handler with hooks off; the handler loops
-- expect: time limit of 1 s CPU exceeded
lab.lesson{title = "hostile", claims = {"h1"}}
xpcall(function() while true do end end, function() while true do end end)
